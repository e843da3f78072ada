"""benchmarks/runs.py reads a published row's declared data-parallel implementation as the engine it
ran on: DeepSpeed's ZeRO (its wrapper, buckets, model-dtype accumulation by default) or FSDP2."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from runs import RUNS_PATH, load_runs  # noqa: E402

from planner.deepspeed_engine import Wrapper, wrapper  # noqa: E402
from planner.plans import evaluate  # noqa: E402


def _row(**changes) -> dict:
    """A copy of the first SC21 row (GPT-1.7B on 32 A100, ZeRO-0) with `changes`."""
    rows = yaml.safe_load(RUNS_PATH.read_text())
    row = copy.deepcopy(next(r for r in rows if r["source_group"] == "megatron_sc21_table1"))
    row.update(id="probe", source_group="probe", precision="bf16", measured={"tokens_per_sec_per_gpu": 1000.0}, **changes)
    return row


def _load(tmp_path, row):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([row]))
    (run,) = load_runs(path)
    return run


@pytest.mark.parametrize("sharding,zero,impl,grad_dtype,wrapped", [
    ("DeepSpeed ZeRO-1", 1, "deepspeed", "bf16", Wrapper.ZERO),  # accumulation in the model dtype by default
    ("DeepSpeed ZeRO-1, BF16_Optimizer", 1, "deepspeed", "fp32", Wrapper.BF16),
    ("DeepSpeed ZeRO-3 (overlap_comm)", 3, "deepspeed", "bf16", Wrapper.ZERO3),
    ("DeepSpeed, no ZeRO", 0, None, "bf16", None),  # not DeepSpeed's engine as the ledger describes it
    ("FSDP2 over dp", 3, "fsdp2", "fp32", None),
])
def test_declared_engines(tmp_path, sharding, zero, impl, grad_dtype, wrapped):
    run = _load(tmp_path, _row(sharding=sharding, zero_stage=zero))
    assert (run.training.optimizer_impl, run.training.grad_dtype) == (impl, grad_dtype)
    if wrapped is not None:
        assert wrapper(run.training, run.layout) == wrapped
    evaluate(run.model, run.cluster, run.training, run.layout)  # a real run is never refused


def test_overlap_comm_is_priced_only_where_the_wrapper_overlaps(tmp_path):
    """DeepSpeed's ZeRO optimizer overlaps its reduction with overlap_comm; BF16_Optimizer ignores it."""
    zero = _load(tmp_path, _row(sharding="DeepSpeed ZeRO-2 overlap_comm", zero_stage=2))
    assert zero.layout.overlap_grad_reduce
    bf16 = _load(tmp_path, _row(sharding="DeepSpeed ZeRO-1 BF16_Optimizer overlap_comm", zero_stage=1))
    assert not bf16.layout.overlap_grad_reduce
    evaluate(bf16.model, bf16.cluster, bf16.training, bf16.layout)


def test_moe_rows_run_their_recipes_recompute_modules_and_fp8_weights():
    """The MoE loader reads a row's 'selective: a, b' as Megatron's --recompute-modules, its FP8 preset's
    fp8_param_gather (tensorwise / MXFP8 / delayed on; blockwise off), and the recipe corrections
    (DeepSeek-V3 on GB300, 26.06: recompute_modules=[], nothing recomputed)."""
    from runs import RECIPE_CORRECTIONS, load_moe_runs

    runs = {r.id: r for r in load_moe_runs()[0]}
    assert runs["mbridge_26.04_dgx-gb300_deepseek_v3_256gpu_mxfp8"].layout.recompute_modules == ("mla_up_proj",)
    assert runs["mbridge_26.04.01_dgx-gb200_gpt_oss_120b_64gpu_bf16"].layout.recompute_modules == ("layernorm", "moe_act")
    assert runs["mbridge_26.04_dgx-gb300_deepseek_v3_256gpu_mxfp8"].training.fp8_param_gather
    assert not runs["mbridge_25.09_dgx-b200_deepseek_v3_256gpu_fp8_alt"].training.fp8_param_gather  # blockwise
    assert runs["dgxc_v25.05_grok1_314b_gb200_128gpu_fp8"].training.fp8_param_gather  # NeMo 2, delayed
    assert len(RECIPE_CORRECTIONS) == 3
    for rid in RECIPE_CORRECTIONS:
        assert runs[rid].layout.recompute == "none"


def test_moe_rows_read_the_published_step_time_before_a_printed_total():
    """dgxc-benchmarking measures the step time; its printed total throughput for the 512-GPU Grok-1
    columns is half of seq x GBS / step (the rows' notes). Grok-1 BF16 on 512 GB200: 8192 x 1024 /
    7.324 s / 512 = 2237.0 tokens/s per GPU (the printed total gives 1118.5); on 128 GPUs the two
    agree: 8192 x 256 / 7.325 / 128 = 2236.7."""
    from runs import load_moe_runs

    runs = {r.id: r for r in load_moe_runs()[0]}
    assert runs["dgxc_v25.05_grok1_314b_gb200_512gpu_bf16"].tokens_per_s_per_gpu == pytest.approx(2237.0, abs=0.1)
    assert runs["dgxc_v25.05_grok1_314b_gb200_128gpu_bf16"].tokens_per_s_per_gpu == pytest.approx(2236.7, abs=0.1)
    assert runs["mbridge_26.08_dgx-gb200_gpt_oss_120b_64gpu_mxfp8"].tokens_per_s_per_gpu == 28672  # printed per GPU


def test_moe_rows_run_fp8_attention_where_their_recipe_does():
    """Megatron-Bridge's MXFP8 performance configs set fp8_dot_product_attention from v0.5.0 (26.06) on,
    inherited by replace() (DeepSeek-V3's GB300 V2 from V1); 26.08's recipe helpers set it too."""
    from runs import load_moe_runs

    runs = {r.id: r for r in load_moe_runs()[0]}
    for rid in ("mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8", "mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8_gbs15360",
                "mbridge_26.06.01_dgx-gb200_qwen3_30b_a3b_8gpu_mxfp8", "mbridge_26.08_dgx-gb300_deepseek_v3_256gpu_mxfp8",
                "mbridge_26.08_dgx-gb200_gpt_oss_120b_64gpu_mxfp8", "mbridge_26.08_dgx-gb200_qwen3_30b_a3b_8gpu_mxfp8"):
        assert runs[rid].training.fp8_attention, rid
    for rid in ("mbridge_26.04_dgx-gb300_deepseek_v3_256gpu_mxfp8", "mbridge_26.06_dgx-b300_gpt_oss_120b_64gpu_mxfp8",
                "mbridge_26.06_dgx-h100_qwen3_30b_a3b_16gpu_fp8", "dgxc_v25.05_grok1_314b_gb200_128gpu_fp8"):
        assert not runs[rid].training.fp8_attention, rid


@pytest.mark.parametrize("gpu_type,memory", [
    ("H100-SXM 96GB HBM2e (Meta Grand Teton, 500W power limit)", 96e9),  # torchtitan 2024-12's own words
    ("H100-SXM 95GB HBM2e (lower TDP)", 95e9),
])
def test_meta_hbm2e_h100_rows_run_on_2_4_tb_s(tmp_path, gpu_type, memory):
    """torchtitan's H100 rows ran on 96 GB of HBM2e "with 2.4 TB/sec peak memory bandwidth"
    (benchmarks/llama3_h100_202412_torchtitan.md), not DGX H100's 3.35 TB/s of HBM3; the tensor peak
    stays the SXM's, an upper bound ("between SXM and NVL")."""
    h100 = _load(tmp_path, _row(gpu_type="H100-SXM-80GB", num_gpus=8, gpus_per_node=8)).cluster.gpu
    gpu = _load(tmp_path, _row(gpu_type=gpu_type, num_gpus=8, gpus_per_node=8)).cluster.gpu
    assert gpu.hbm_bandwidth == 2.4e12 and h100.hbm_bandwidth == pytest.approx(3.35e12, rel=0.01)
    assert gpu.memory == memory and gpu.peak_bf16_flops == h100.peak_bf16_flops


def test_torchtitan_pipeline_rows_run_their_schedules_default_micro_batches():
    """torchtitan's 405B rows on 512 GPUs publish each rank's local batch, not its micro-batches: torchtitan's
    schedule then split it into pipeline_parallel_degree of them (torchtitan@9dec370 pipelining_utils.py:
    build_pipeline_schedule), two stages a rank for Interleaved 1F1B (generate_split_points), its layers
    15 | 16 x 6 | 15 and 7 | 8 x 14 | 7 (126 over 8 / 16 stages, the first and last one fewer). Local
    batch 32 over 8 micro-batches is 4 sequences each; Table 6's local batch 8 is 1. The assumption is the
    published ratio's: 1F1B's bubble over 8 micro-batches, (p - 1) / m = 7/8 of the ideal step, interleaved's
    7/16, so interleaved runs (1 + 7/8) / (1 + 7/16) = 1.304x faster where torchtitan measured 128 / 100 = 1.28x
    (at 16 micro-batches the bubbles would give 1.18x)."""
    runs = {r.id: r for r in load_runs(low_precision=True) if r.id.startswith("torchtitan_405b_512gpu")}
    assert len(runs) == 6
    one, inter = runs["torchtitan_405b_512gpu_1f1b"], runs["torchtitan_405b_512gpu_interleaved"]
    assert (one.layout.micro_batch_size, one.layout.vpp) == (4, 1)
    assert (inter.layout.micro_batch_size, inter.layout.vpp) == (4, 2)
    assert one.layout.pipeline_layers == (15,) + (16,) * 6 + (15,)
    assert inter.layout.pipeline_layers == (7,) + (8,) * 14 + (7,)
    assert all(r.layout.micro_batch_size == 1 for k, r in runs.items() if "_cp" in k)
    bubbles = (1 + 7 / 8) / (1 + 7 / 16)
    assert bubbles == pytest.approx(1.304, abs=1e-3)
    assert abs(inter.tokens_per_s_per_gpu / one.tokens_per_s_per_gpu / bubbles - 1) < 0.02
    pi = evaluate(inter.model, inter.cluster, inter.training, inter.layout)
    po = evaluate(one.model, one.cluster, one.training, one.layout)
    assert po.step_time_s / pi.step_time_s == pytest.approx(bubbles, rel=0.02)
