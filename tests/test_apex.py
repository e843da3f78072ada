"""NeMo 1.x's distributed_fused_adam as the planner prices it (planner.apex_engine), each term by hand
from Apex's DistributedFusedAdam (NVIDIA/apex@6424da3 apex/contrib/optimizers/distributed_fused_adam.py)
and NeMo's setup_optimization: the BF16 weight, the contiguous gradient buffer in grad_sync_dtype (FP32
for the embeddings and the output layer) with the reduced shard it keeps beside it, the state shard
(16-bit remainders of the FP32 master, FP32 m and v), 125 MiB buckets, ZeRO-1 only, and no launch file."""

from __future__ import annotations

import pytest

import planner
from planner.cli import main
from planner.cost import _bucket_params, stage_optimizer_time
from planner.errors import InvalidLayout, PlannerError
from planner.plans import evaluate
from planner.specs import Layout, TrainingSpec

P = 8_030_261_248  # Llama-3-8B's parameters (Meta's model card: 8.03B)
EMB = 128_256 * 4_096  # its word embedding, and its untied output layer the same size
LAYOUT = Layout(dp=8, zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True)


def _apex(**kw) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="apex", **kw)


def _items(training, layout=LAYOUT, nodes=1):
    p = evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=nodes), training, layout)
    return {i.name: i.bytes for i in p.memory.stages[0].items}


def test_fp32_gradients_keep_the_buffer_and_its_reduced_shard():
    """grad_sync_dtype FP32 (the optimizer dtype, NeMo's default): 4 B a parameter in the contiguous
    buffer, and each bucket's reduce-scatter output, 1/8 of it, kept as grads_shard; the state shard is
    2 (int16 remainders) + 4 + 4 over 8 ranks; the weight BF16."""
    items = _items(_apex())
    assert items["weights"] == 2 * P
    assert items["gradients"] == pytest.approx(4 * P * (1 + 1 / 8))
    assert items["optimizer"] == pytest.approx(10 * P / 8)


def test_bf16_sync_keeps_the_embeddings_and_output_layer_in_fp32():
    """grad_sync_dtype BF16 (NeMo 24.07's FP8 recipes): 2 B a parameter, but the word embedding and the
    output layer (_with_fp32_optimizer) sync in FP32 -- 2 x 525M parameters at 4 B."""
    items = _items(_apex(grad_dtype="bf16"))
    assert items["gradients"] == pytest.approx((2 * (P - 2 * EMB) + 4 * 2 * EMB) * (1 + 1 / 8))


def test_fp8_parameters_keep_the_whole_fp32_master():
    """NeMo's fp8_params sets store_params=True: the FP32 master whole, 4 + 4 + 4 B over dp; FP16
    weights likewise (store_param_remainders is for a BF16 model only)."""
    assert _items(_apex(fp8="delayed", fp8_param_gather=True))["optimizer"] == pytest.approx(12 * P / 8)
    assert _items(_apex(precision="fp16"))["optimizer"] == pytest.approx(12 * P / 8)


def test_against_megatrons_distributed_optimizer():
    """The same run on Megatron's distributed optimizer: its 4 B gradient buffer reduce-scatters in place
    and its shard keeps the FP32 master whole, 12 B over dp [MegatronDistOpt]."""
    apex, megatron = _items(_apex()), _items(TrainingSpec(global_batch_size=64, seq_length=4096))
    assert megatron["gradients"] == 4 * P and megatron["optimizer"] == pytest.approx(12 * P / 8)
    grown = apex["gradients"] + apex["optimizer"] - megatron["gradients"] - megatron["optimizer"]
    assert grown == pytest.approx(4 * P / 8 - 2 * P / 8)  # the shard beside the buffer, less the remainders' saving


def test_buckets_are_125_mib_of_the_sync_dtype():
    """bucket_size = 1024 * 1024 * bucket_cap_mb / dtype size, bucket_cap_mb 125 in NeMo's launcher."""
    assert _bucket_params(_apex(), 8) == 125 * 1024 * 1024 // 4 == 32_768_000
    assert _bucket_params(_apex(grad_dtype="bf16"), 8) == 65_536_000


def test_adam_step_touches_the_remainders_not_the_whole_master():
    """The step reads and writes the 10 B shard and the other 8 B (cost.ADAM_OTHER_BYTES): 28 B a local
    parameter, at the GPU's sustained HBM bandwidth."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    t = stage_optimizer_time(m, c, _apex(), LAYOUT, 0, 32)
    assert t == pytest.approx(P / 8 * 28 / (c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency))


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_only_zero1_runs(zero):
    with pytest.raises(InvalidLayout, match="zero_stage 1"):
        _items(_apex(), Layout(dp=8, zero_stage=zero))


def test_moe_models_are_refused():
    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=1)
    with pytest.raises(InvalidLayout, match="dense transformer models only"):
        evaluate(m, c, _apex(), Layout(dp=8, ep=8, zero_stage=1))


@pytest.mark.parametrize("kw,fragment", [
    (dict(optimizer_states="bf16"), "FP32 Adam states"),
    (dict(fp8="tensorwise"), "delayed scaling"),
])
def test_what_it_does_not_run_is_refused(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        _apex(**kw)


def test_search_offers_zero1_and_no_emitter_writes_it():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch_size=16, seq_length=4096, optimizer_impl="apex")
    result = planner.plan(m, c, training, framework="any", top_k=2)
    assert result.best.layout.zero_stage == 1
    from planner.emit.megatron import to_megatron
    with pytest.raises(PlannerError, match="apex optimizer engine"):
        to_megatron(result.best)
    with pytest.raises(PlannerError, match="optimizer_impl: 'apex'"):
        planner.plan(m, c, training, framework="megatron")


def test_cli_evaluates_it():
    import io

    out, err = io.StringIO(), io.StringIO()
    code = main(["evaluate", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "16", "--seq-length",
                 "4096", "--tp", "2", "--zero", "1", "--optimizer-impl", "apex"], stdout=out, stderr=err)
    assert code == 0 and "DistributedFusedAdam" in out.getvalue()


def test_calibrate_prices_a_nemo_log_on_it(tmp_path):
    """A NeMo 1.x log prints no arguments: --optimizer-impl apex prices its ledger on DistributedFusedAdam,
    2 P / 8 B above Megatron's distributed optimizer with FP32 gradients (the shard beside the buffer, 4 B
    over 8, less the remainders' saving, 2 B over 8); the flag on another framework's log is refused."""
    import io
    import json
    from pathlib import Path

    logs = Path(__file__).parent / "logs"
    flags = ["--nodes", "1", "--global-batch-size", "128", "--seq-length", "8192", "--tp", "1", "--pp", "1", "--dp", "8",
             "--zero", "1"]
    peaks = {}
    for impl in ("megatron", "apex"):
        out = io.StringIO()
        rc = main(["calibrate", "llama3-8b", "dgx-h100", str(logs / "nemo2_llama3_8b.log"), *flags, "--optimizer-impl",
                   impl, "--out", str(tmp_path / f"{impl}.yaml"), "--json"], stdout=out, stderr=io.StringIO())
        assert rc == 0
        peaks[impl] = json.loads(out.getvalue())["runs"][0]["calibrated_peak_bytes"]
    assert peaks["apex"] - peaks["megatron"] == pytest.approx(2 * P / 8, rel=1e-9)
    err = io.StringIO()
    rc = main(["calibrate", "llama3-8b", "dgx-h100", str(logs / "torchtitan_llama3_8b.log"), *flags, "--optimizer-impl",
               "apex", "--out", str(tmp_path / "t.yaml")], stdout=io.StringIO(), stderr=err)
    assert rc == 2 and "apex (distributed_fused_adam) is NeMo's" in err.getvalue()


def test_search_splits_the_layers_evenly_as_nemo_does():
    """NeMo 1.x places num_layers / pp layers on every rank and equal virtual chunks
    (_validate_and_override_config): a search on this engine offers no uneven split."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="apex")
    result = planner.plan(m, c, training, framework="any", top_k=5, pp=2, structural=False)
    for p in (result.best, *result.alternatives):
        assert p.layout.pipeline_layers is None and p.layout.first_stage_layers is None
        assert p.layout.last_stage_layers is None


def test_a_search_constrained_to_another_zero_stage_is_refused():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="apex")
    with pytest.raises(PlannerError, match="offers ZeRO 1 for"):
        planner.plan(m, c, training, framework="any", zero_stage=2)
