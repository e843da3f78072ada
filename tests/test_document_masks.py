"""Attention masked per packed document (TrainingSpec.document_tokens), as torchtitan 0.3 always
runs it (block-causal FlexAttention over the documents its dataloader packs [torchtitan 0.3
models/common/config_utils.py: get_attention_config]).

Expected numbers are worked out here: a sequence of s tokens holding s / d documents computes s / d
causal triangles of d^2 / 2 scores instead of one of s^2 / 2, at FlashAttention-2's causal speed for
d keys (FlashAttention-3 paper, arXiv 2407.08608, head dim 128 on H100: 298 TFLOP/s at 2k, 333 at 8k)."""

import pytest

import planner
from planner.cost import _attention_flops, computed_score_share, flash_speed_factor
from planner.errors import PlannerError
from planner.search import plan
from planner.specs import Layout, TrainingSpec


def test_documents_divide_the_causal_scores_by_their_count():
    """Llama-3-8B (32 heads of 128), one sequence of 8192 tokens in 2048-token documents: 4 triangles
    of 2048^2 / 2 scores; QK^T and PV cost 2 x 2 x 128 FLOPs per score and head."""
    m = planner.load_model("llama3-8b")
    scores = 4 * 2048**2 / 2
    assert _attention_flops(m, 1, 8192, 1, 1, causal=True, document_tokens=2048) == pytest.approx(
        scores * 32 * 2 * 2 * 128, rel=1e-12)
    assert computed_score_share(m, 8192, 2048) == pytest.approx(scores / 8192**2, rel=1e-12)
    assert computed_score_share(m, 8192, 8192) == computed_score_share(m, 8192) == 0.5  # one document: causal


def test_short_documents_run_at_the_flash_kernels_speed_for_their_length():
    m = planner.load_model("llama3-8b")
    assert flash_speed_factor(m, 8192, 1, 2048)[0] == pytest.approx(298 / 333, rel=1e-12)
    assert flash_speed_factor(m, 8192, 1, 8192)[0] == pytest.approx(1.0, rel=1e-12)
    # with CP the kernel's length is the shorter of the chunk and the document
    assert flash_speed_factor(m, 8192, 2, 2048)[0] == pytest.approx(298 / 333, rel=1e-12)


def test_windowed_layers_inside_documents():
    """GPT-OSS-120B: 18 of its 36 layers see 128 keys (255 keys of 128-wide tiles). At s = 4096 in
    1024-token documents a windowed layer computes, per document, 1024 x 255 - 255^2 / 2 scores, four
    documents a sequence; a full layer 4 x 1024^2 / 2."""
    m = planner.load_model("gpt-oss-120b")
    windowed = 4 * (1024 * 255 - 255**2 / 2) / 4096**2
    full = 4 * 1024**2 / 2 / 4096**2
    assert computed_score_share(m, 4096, 1024) == pytest.approx((windowed + full) / 2, rel=1e-12)
    # documents shorter than the window's tiles: the window no longer narrows anything
    assert computed_score_share(m, 4096, 128) == pytest.approx(128 / (2 * 4096), rel=1e-12)


def test_a_torchtitan_step_prices_the_documents_attention():
    """The attention time of one layer falls by the share of scores (1/4) over the kernel's speed at
    2048 keys (298 / 333 of the 8k speed): (1/4) x (333 / 298) of the whole-sequence causal time."""
    from planner.cost import _layer_time

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(dp=8, zero_stage=3, micro_batch_size=1, recompute="op")
    t = dict(global_batch_size=64, seq_length=8192, optimizer_impl="fsdp2", kernels="unfused")
    whole = _layer_time(m, c, TrainingSpec(**t), lay).attn_fwd
    docs = _layer_time(m, c, TrainingSpec(**t, document_tokens=2048), lay).attn_fwd
    assert docs / whole == pytest.approx(0.25 * 333 / 298, rel=1e-9)


def test_document_rules_name_the_field():
    with pytest.raises(ValueError, match="'document_tokens': a document is cut at seq_length"):
        TrainingSpec(global_batch_size=8, seq_length=4096, document_tokens=8192)
    with pytest.raises(ValueError, match="'document_tokens': needs attention='flash'"):
        TrainingSpec(global_batch_size=8, seq_length=4096, document_tokens=1024, attention="eager")
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=8192, document_tokens=1024)
    for framework in ("megatron", "deepspeed"):
        with pytest.raises(PlannerError, match=f"framework '{framework}' attends causally"):
            plan(m, c, t, framework=framework, top_k=1, structural=False)
    p = planner.evaluate(m, c, t, Layout(tp=8, dp=1, zero_stage=1, sequence_parallel=True))
    for emit in (p.to_megatron, p.to_deepspeed):
        with pytest.raises(PlannerError, match="attends causally over the whole sequence"):
            emit()


def test_torchtitan_plans_with_documents_and_emits_them_unchanged():
    """torchtitan's launch files need no flag (it masks per document always): the plan with documents
    is faster and its overrides are the same as a whole-sequence plan of the same layout."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    base = TrainingSpec(global_batch_size=64, seq_length=8192)
    whole = plan(m, c, base, framework="torchtitan", top_k=1, structural=False)
    docs = plan(m, c, base.model_copy(update={"document_tokens": 2048}), framework="torchtitan", top_k=1,
                structural=False)
    assert docs.best.step_time_s < whole.best.step_time_s
    same = planner.evaluate(m, c, whole.best.training, docs.best.layout)
    assert docs.best.to_torchtitan().args == same.to_torchtitan().args


def test_cli_plans_explains_and_warns_about_documents(capsys):
    """--document-tokens reaches the search and explain (2048 of 8192 tokens: 2048 / 16384 = 12.5 % of
    the score matrix); a torchtitan plan without it says it is priced causal over the whole sequence."""
    from planner.cli import main

    args = ["llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "64", "--seq-length", "8192",
            "--framework", "torchtitan", "--time-limit", "30"]
    assert main(["explain", *args, "--document-tokens", "2048"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "computes 12.5% (masked per document of 2048 tokens)" in out
    assert main(["plan", *args, "--top-k", "1"]) == 0
    assert "priced causal over the whole sequence" in " ".join(capsys.readouterr().out.split())
    assert main(["plan", *args[:-4], "--document-tokens", "2048"]) == 2  # Megatron, the CLI's default target
    assert "attends causally over the whole sequence" in capsys.readouterr().err
