"""Turn rows of benchmarks/data/published_runs.yaml into (model, cluster, training, layout).

Shared by benchmarks/fidelity.py and the fidelity regression test. Only BF16/FP16 rows with a
complete layout (micro-batch, ZeRO stage and recompute published) are used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

import planner
from planner.deepspeed_engine import overlaps_reduction, uses_deepspeed
from planner.space import account_for_ends_split, framework_training
from planner.specs import FP8_ATTENTION_RECIPES, RECOMPUTE_MODULES, Layout, ModelSpec, TrainingSpec

__all__ = ["Run", "load_runs", "load_moe_runs", "load_ratio_pairs", "RUNS_PATH", "MOE_RUNS_PATH", "RATIO_PAIRS_PATH"]

RUNS_PATH = Path(os.environ.get("PLANNER_RUNS") or Path(__file__).resolve().parent / "data" / "published_runs.yaml")
"""The project's copy of shared/calibration/published_runs.yaml (sources in benchmarks/data/README.md)."""
MOE_RUNS_PATH = Path(os.environ.get("PLANNER_MOE_RUNS") or Path(__file__).resolve().parent / "data" / "moe_runs.yaml")
"""The project's copy of shared/calibration/moe_runs.yaml."""
RATIO_PAIRS_PATH = Path(__file__).resolve().parent / "data" / "speedup_pairs.yaml"
"""Published FP8-over-BF16 speedups of one layout, checked out of sample (their ratio; their absolute speed only
where the part is the catalog's)."""


@dataclass(frozen=True)
class Run:
    id: str
    group: str
    model: ModelSpec
    cluster: object
    training: TrainingSpec
    layout: Layout
    tokens_per_s_per_gpu: float | None
    """None where the run went out of memory."""
    peak_mem_bytes: float | None
    oom: bool
    catalog_part: bool = False
    """A ratio-only pair's run on the catalog's part at its own power (speedup_pairs.yaml `catalog_part`): its
    absolute speed is checked too."""


HBM2E_H100_BANDWIDTH = 2.4e12
"""HBM bandwidth of the H100 SXM with 96 GB of HBM2e on which torchtitan published its H100 runs: "96GB HBM2e
with 2.4 TB/sec peak memory bandwidth", run at its default 500 W [torchtitan@b5bcd76 benchmarks/
llama3_h100_202412_torchtitan.md, Hardware; torchao's float8 roofline models "Meta's H100 variant" at the same
2.4 TB/s: torchao/testing/training/roofline_utils.py]; DGX H100's HBM3 gives 3.35. ASSUMPTION: the "HBM2e based lower TDP
SXM H100 (95GB)" of the January 2025 page [torchtitan@3278a52 docs/performance.md] is the same part. Its tensor
peak is not known ("between SXM and NVL", both pages): the rows keep the SXM's 989 TFLOP/s and DGX H100's GEMM
curves, an upper bound. (FBGEMM measured an "H100 500W" at 585 TFLOP/s for BF16 8192^3 and 1,083-1,141 for
row-wise FP8 on LLM shapes, about 0.75 and 0.84 of those curves [pytorch/FBGEMM#2546]; priced so, the FP8 speedups
match but the eager-kernel fit moves to MPT's cost: README, low precision.)"""


def _cluster_for(gpu_type: str, num_gpus: int, gpn: int):
    nodes = max(1, num_gpus // gpn)
    if gpu_type.startswith("A100-SXM-80GB"):
        return planner.load_cluster("dgx-a100-80g", nodes=nodes)
    if gpu_type.startswith("A100-SXM-40GB"):
        return planner.load_cluster("dgx-a100-40g", nodes=nodes)
    if gpu_type.startswith(("GB200", "GB300")):
        # ASSUMPTION: a job that does not fill whole NVL72 racks gets the largest NVLink domain that
        # divides it (128 GPUs: two racks of 64)
        domain = max(d for d in range(4, 73, 4) if num_gpus % d == 0) if num_gpus >= 4 else num_gpus
        ref = "gb300-nvl72" if gpu_type.startswith("GB300") else "gb200-nvl72"
        return planner.load_cluster(ref, nodes=nodes, nvlink_domain_size=domain)
    if gpu_type.startswith(("B200", "B300")):
        return planner.load_cluster("dgx-b300" if gpu_type.startswith("B300") else "dgx-b200", nodes=nodes)
    if gpu_type.startswith("H800"):  # the H100 die with 8 NVLink links (clusters/h800.yaml)
        return planner.load_cluster("h800", nodes=nodes)
    if gpu_type.startswith("H100"):
        c = planner.load_cluster("dgx-h100", nodes=nodes)
        for mem in ("96GB", "95GB"):  # Meta's lower-TDP HBM2e parts (torchtitan's H100 rows)
            if mem in gpu_type.replace(" ", ""):
                gpu = c.gpu.model_copy(update={"memory": float(mem[:2]) * 1e9, "hbm_bandwidth": HBM2E_H100_BANDWIDTH})
                c = c.model_copy(update={"gpu": gpu})
        return c
    return None


def _recompute(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.lower()
    if t.startswith("no recompute"):  # "no recompute settings in the matching perf config"
        return "none"
    for mode in ("selective", "full", "none"):
        if t.startswith(mode):
            return mode
    return None


def _recompute_modules(text: str | None) -> tuple[str, ...] | None | bool:
    """Megatron's --recompute-modules from a row's 'selective: a, b (...)' text: None for Megatron's
    default (no list published), False where a module is not priced ('moe', 'shared_experts')."""
    m = re.match(r"selective:\s*([a-z_,\s]+)", (text or "").lower())
    if not m:
        return None
    mods = tuple(x for x in re.split(r"[,\s]+", m.group(1)) if x)
    return mods if set(mods) <= set(RECOMPUTE_MODULES) else False


def _fp8_param_gather(row: dict, fp8: str | None) -> bool:
    """FP8 weights all-gathered where the run's config sets it. torchtitan's
    float8.enable_fsdp_float8_all_gather: the 405B TOML at the documented commit does
    [torchtitan@3278a52 train_configs/llama3_405b.toml]; the 8B and 70B TOMLs leave float8 off and
    the benchmark does not give its overrides (ASSUMPTION: off). Megatron-LM's Llama FP8 examples:
    the 8B script passes --fp8-param-gather [Megatron-LM@d98e8a6 examples/llama/
    train_llama3_8b_h100_fp8.sh] and the others follow NeMo 2's performance recipes, whose
    bf16_with_fp8_mixed sets fp8_param_gather=True [NVIDIA/NeMo nemo/collections/llm/recipes/
    precision/mixed_precision.py]. NeMo 24.07's launcher leaves fp8_params off for these models."""
    if row["source_group"] == "megatron_lm_examples_llama":
        return fp8 == "delayed"
    return fp8 == "torchao-tensorwise" and row["model"]["n_layers"] == 126 and row["source_group"].startswith("torchtitan")


def _grad_dtype(row: dict) -> str:
    """The gradient buffer the run's stack keeps. FP32 (Megatron's and PyTorch's default) except
    where the recipe says BF16: NeMo 24.07's FP8 performance runs sync gradients in BF16 through
    Apex's DistributedFusedAdam [NVIDIA/NeMo-Framework-Launcher@95c77b5 examples/training/*/h100/
    *_fp8.sh: +training.model.optim.grad_sync_dtype=bf16; launcher_scripts/conf/training/*: optim
    distributed_fused_adam, contiguous_grad_buffer] (planner.apex_engine: its buffer, FP32 for the embeddings
    and the output layer, and the reduced shard beside it), and Megatron-LM's Llama FP8
    examples pass --grad-reduce-in-bf16 (8B script) or follow NeMo 2's performance scripts, which set
    grad_reduce_in_fp32 = False for FP8 [NVIDIA/NeMo scripts/performance]. DeepSpeed accumulates in the
    model dtype unless the row says FP32 accumulation or its BF16_Optimizer [deepspeed 0.19.8
    runtime/engine.py: get_data_types]."""
    if row["source_group"] in ("nemo_24.07_perf_summary", "megatron_lm_examples_llama") and \
            str(row.get("precision", "")).lower().startswith("fp8"):
        return "bf16"
    sharding = str(row.get("sharding")).lower()
    if _declares_deepspeed(sharding):  # DeepSpeed accumulates in the model dtype unless told (data_types.grad_accum_dtype)
        return "fp32" if any(w in sharding for w in ("fp32", "bf16_optimizer", "bf16 optimizer")) else "bf16"
    return "fp32"


def _torchtitan_recompute(row: dict, rc: str) -> tuple[str, int | None]:
    """torchtitan's 'selective' as the row's config ran it: 'op' (per-op checkpointing, the
    llama3 TOMLs' selective_ac_option at the benchmarked commits) or, for '(layer)', its default
    option '2': every second block fully checkpointed [torchtitan@3bae958 torchtitan/config_manager.py:
    selective_ac_option default '2'; parallelisms/parallelize_llama.py: ac_freq], priced as full
    recompute of half the layers. Other stacks' 'selective' is Megatron's attention core."""
    if not row["source_group"].startswith("torchtitan") or rc != "selective":
        return rc, None
    if "(layer)" in str(row.get("recompute")):
        return "full", row["model"]["n_layers"] // 2
    return "op", None


def _torchtitan_pipeline(row: dict) -> tuple[int | None, int]:
    """(micro-batch size, virtual stages per rank) of a torchtitan pipeline row that states only its local
    batch: at the benchmarked commit the schedule splits each rank's batch into pipeline_parallel_degree
    micro-batches unless told otherwise, and a looped schedule (Interleaved 1F1B) builds two stages a rank
    [torchtitan@9dec370 torchtitan/parallelisms/pipelining_utils.py: build_pipeline_schedule (n_microbatches
    = pipeline_parallel_degree when --experimental.pipeline_parallel_microbatches is unset, whatever the
    stages a rank), generate_split_points (num_stages_per_rank = 2 for PipelineScheduleMulti)].
    ASSUMPTION: the benchmark ran that default (its page does not say); the two
    schedules' published ratio agrees (128 / 100 tokens/s/GPU = 1.28 against the bubbles' (1 + 7/8) /
    (1 + 7/16) = 1.30 at 8 micro-batches; 1.18 at 16, 1.10 at 32). Its layer split, 15 | 16 x 6 | 15 (or 7 |
    8 x 14 | 7 over 16 stages), is the account-for-ends one. (None, 1) for every other row."""
    pp = (row["parallel"].get("pp") or 1)
    local = row.get("local_batch_per_dp")
    if not row["source_group"].startswith("torchtitan") or pp == 1 or row.get("micro_batch") is not None or not local:
        return row.get("micro_batch"), row["parallel"].get("vpp") or 1
    if local % pp:
        return None, 1
    looped = "interleaved" in str(row.get("notes", "")).lower()
    return local // pp, 2 if looped else 1


def _declares_async_tp(row: dict) -> bool:
    """torchtitan rows that name Async TP among their optimizations (it needs torch.compile, which
    torchtitan's parallelize_llama enforced then: 'Async TP requires --training.compile')."""
    notes = str(row.get("notes", "")).lower().replace("asynctp", "async tp")
    return row["source_group"].startswith("torchtitan") and "async tp" in notes


def _declares_deepspeed(sharding: str) -> bool:
    """The row's declared data-parallel implementation (its `sharding` field) is DeepSpeed's."""
    return "deepspeed" in sharding.lower()


def _optimizer_impl(row: dict, zero: int) -> str | None:
    """The optimizer engine of the row's declared data-parallel implementation: 'fsdp2' for FSDP2,
    'deepspeed' for DeepSpeed's ZeRO (its wrapper, buckets and BF16 reductions: planner.deepspeed_engine),
    'apex' for the NeMo 24.07 launcher's runs, whose configs name optim distributed_fused_adam (Apex's
    DistributedFusedAdam: planner.apex_engine) [NVIDIA/NeMo-Framework-Launcher@14860f7 launcher_scripts/
    conf/training/*: model.optim.name]. DeepSpeed without ZeRO runs BF16 as another optimizer (DDP_BFLOAT16,
    or BF16_Optimizer sharding the master under its pipeline engine), which the ledger does not describe:
    those rows keep Megatron's mechanics."""
    sharding = str(row.get("sharding"))
    if "FSDP2" in sharding:  # torchtitan's FSDP2: its sharded FP32 master and gathered output layer
        return "fsdp2"
    if row["source_group"] == "nemo_24.07_perf_summary" and zero == 1:
        return "apex"
    return "deepspeed" if _declares_deepspeed(sharding) and zero >= 1 else None


def _declared_overlaps(sharding: str, zero: int) -> tuple[bool, bool]:
    """The overlaps a run's declared data-parallel implementation (its `sharding` field) performs.

    Megatron flags as written; PyTorch DDP ("DDP-impl torch") reduces buckets during backward,
    Megatron's 2021 "local" DDP all-reduces after it; PyTorch FSDP SHARD_GRAD_OP reduce-scatters
    during backward, and its forward all-gathers run beside the compute although Composer leaves
    forward_prefetch off (composer/utils/parallelism.py: FSDPConfig): each unit's pre-forward hook
    queues its all-gather on the unshard stream and only the compute stream waits for it (torch
    distributed/fsdp/_runtime_utils.py: _pre_forward_unshard), so the host, running ahead, issues
    it during the previous unit's kernels, and limit_all_gathers never holds it back there
    (SHARD_GRAD_OP frees nothing after the forward). Both run beside the compute, and both are priced by
    FSDP's prefetch share (calibration.dp_overlap, planner.cost: FSDP's ZeRO-2 as its ZeRO-3), whose fit says
    how much the compute hides; ZeRO-3 rows read it without flags, so theirs stay off.
    """
    if zero == 3:
        return False, False
    if _declares_deepspeed(sharding):  # overlap_comm where declared: DeepSpeed's default is off for ZeRO-1/2
        return "overlap_comm" in sharding, False
    if "--overlap-grad-reduce" in sharding or "--overlap-param-gath" in sharding:
        return "--overlap-grad-reduce" in sharding, "--overlap-param-gath" in sharding and zero >= 1
    if "DDP-impl torch" in sharding:
        return True, False
    if "SHARD_GRAD_OP" in sharding:
        return True, True
    return False, False


def _measured_tokens(row: dict) -> float | None:
    meas, mod = row["measured"], row["model"]
    if isinstance(meas.get("tokens_per_sec_per_gpu"), (int, float)):
        return float(meas["tokens_per_sec_per_gpu"])
    if meas.get("tflops_per_gpu") and row["source_group"] == "megatron_sc21_table1":
        # Narayanan et al. 2021 Eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per step of B sequences
        s, l, h, V = row["seq_len"], mod["n_layers"], mod["hidden_size"], mod["vocab_size"]
        per_token = 96 * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
        return meas["tflops_per_gpu"] * 1e12 / per_token
    return None


def _fp8(prec: str) -> str | None:
    """The FP8 recipe a row's precision names: torchtitan's 'Float8 linears' (torchao float8 with
    dynamic tensor-wise scaling, the only scaling torchtitan offered at the benchmarked commits
    [torchtitan@9dec370 torchtitan/config_manager.py: float8.scaling_type_* 'dynamic' or 'delayed'],
    so its TP all-gathers are FP8), NeMo/Megatron 'FP8 (Transformer Engine)' / 'FP8 (hybrid
    format)' (TE's default recipe then: delayed scaling)."""
    if prec.startswith("float8"):
        return "torchao-tensorwise"
    if prec.startswith("fp8"):
        return "delayed"
    return None


def load_runs(path: Path = RUNS_PATH, *, low_precision: bool = False) -> list[Run]:
    """Every usable row as a Run (complete layout, a catalogued GPU): BF16/FP16 rows, or with
    low_precision the FP8 rows. NeMo 24.07 and Megatron-LM example FP8 rows publish neither ZeRO
    stage nor recompute: taken as the distributed optimizer (ZeRO-1, their declared sharding) and
    no recompute, sequence parallel with TP, and NeMo's performance overlaps (an ASSUMPTION)."""
    rows = yaml.safe_load(Path(path).read_text())
    runs = []
    for r in rows:
        prec = (r.get("precision") or "").lower()
        fp8 = _fp8(prec)
        if low_precision != (fp8 is not None):
            continue
        if fp8 is None and not (prec.startswith(("bf16", "fp16", "amp_bf16")) or prec == "bf16"):
            continue
        assumed = fp8 == "delayed" and r.get("zero_stage") is None and r.get("recompute") is None
        if assumed:
            r = dict(r, zero_stage=1, recompute="none")
        rc = _recompute(r.get("recompute"))
        par, mod = r["parallel"], r["model"]
        micro_batch, vpp = _torchtitan_pipeline(r)
        if micro_batch is None or r.get("zero_stage") is None or rc is None:
            continue
        tokens = _measured_tokens(r)
        oom = bool(r["measured"].get("oom")) or r["measured"].get("tokens_per_sec_per_gpu") == "OOM"
        cluster = _cluster_for(r["gpu_type"], r["num_gpus"], r["gpus_per_node"])
        if (tokens is None and not oom) or cluster is None:
            continue
        llama = "llama" in r["model_name"].lower()
        if any(mod.get(k) is None for k in ("n_layers", "hidden_size", "n_heads", "vocab_size")):
            continue  # shapes not published (e.g. Nemotron in the NeMo 24.07 table)
        if not llama and mod.get("n_kv_heads") not in (None, mod["n_heads"]):
            continue  # Nemotron-340B: grouped-query attention with a squared-ReLU MLP, which no family describes
        model = ModelSpec(
            name=r["id"], family="llama" if llama else "gpt", num_layers=mod["n_layers"], hidden_size=mod["hidden_size"],
            num_attention_heads=mod["n_heads"], num_kv_heads=mod.get("n_kv_heads") if llama else None,
            ffn_hidden_size=mod.get("ffn_hidden_size") or 4 * mod["hidden_size"], vocab_size=mod["vocab_size"],
            max_position_embeddings=None if llama else r["seq_len"],
            # MPT trains without dropout (resid/attn/emb_pdrop default 0 [llm-foundry@4952183
            # llmfoundry/models/mpt/configuration_mpt.py: MPTConfig]; the benchmark YAMLs keep them)
            dropout=False if r["source_group"].startswith("llmfoundry") else None,
        )
        # 2021 Megatron had no flash attention (fused softmax kernels, eager storage)
        attention = "eager" if r["source_group"] == "megatron_sc21_table1" else "flash"
        training = TrainingSpec(global_batch_size=r["global_batch_seqs"], seq_length=r["seq_len"],
                                precision="fp16" if prec.startswith("fp16") else "bf16", grad_dtype=_grad_dtype(r),
                                attention=attention, fp8=fp8, fp8_param_gather=_fp8_param_gather(r, fp8),
                                # llm-foundry's MPT loss_fn defaults to flash-attn's fused cross entropy
                                # [llm-foundry@4952183 llmfoundry/models/mpt/modeling_mpt.py: ComposerMPTCausalLM]
                                # 2021 Megatron (SC21) ran its vocab-parallel loss unfused
                                cross_entropy="fused" if r["source_group"].startswith("llmfoundry") else
                                "unfused" if r["source_group"].startswith("megatron_sc21") else "fp32",
                                kernels="fused" if r["source_group"].startswith(("megatron", "nemo")) else "unfused",
                                optimizer_impl=_optimizer_impl(r, r["zero_stage"]))
        tp, pp, cp = par.get("tp") or 1, par.get("pp") or 1, par.get("cp") or 1
        grad_overlap, param_overlap = _declared_overlaps(str(r.get("sharding")), r["zero_stage"])
        if uses_deepspeed(training):  # overlap_comm is inert for BF16_Optimizer and the pipeline engine
            grad_overlap = grad_overlap and pp == 1 and overlaps_reduction(training, r["zero_stage"])
        sp = bool(par.get("sequence_parallel")) and tp > 1
        if assumed:  # NeMo performance recipes: SP with TP, TP/DP overlaps on
            sp = tp > 1
            grad_overlap = param_overlap = r["num_gpus"] // (tp * pp * cp) > 1
        rc, rc_layers = _torchtitan_recompute(r, rc)
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=r["num_gpus"] // (tp * pp * cp), zero_stage=r["zero_stage"],
                        micro_batch_size=micro_batch, recompute=rc, recompute_num_layers=rc_layers,
                        vpp=vpp,
                        sequence_parallel=sp, tp_comm_overlap=(assumed or _declares_async_tp(r)) and sp,
                        overlap_grad_reduce=grad_overlap, overlap_param_gather=param_overlap,
                        # 2021 Megatron (SC21) predates overlap_p2p_comm: its interleaved sends were exposed
                        overlap_p2p=False if "2021 Megatron" in str(r.get("sharding")) and vpp > 1
                        else None,
                        pipeline_layers=account_for_ends_split(mod["n_layers"], pp * vpp))
        mem = r["measured"].get("peak_mem_gib")
        runs.append(Run(r["id"], r["source_group"], model, cluster, training, layout, tokens,
                        mem * 2**30 if isinstance(mem, (int, float)) else None, oom))
    return runs


NVFP4_ROWS = ("NVFP4 under a per-module quantization recipe (Megatron-Bridge perf_recipes/nemotronh/te_quant.cfg: "
              "attention, the latent projections and MTP in BF16, Mamba out_proj in MXFP8) the planner does not express")
"""Why the NVFP4 rows (all Nemotron-3 Super's) are not priced: their last 14 layers in BF16 are (TrainingSpec.
bf16_last_layers, any model), but their recipe also loads a quant_recipe that picks a format per module
[NVIDIA-NeMo/Megatron-Bridge v0.4.0 scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py:
set_nemotron_3_super_common_configs; v0.6.0 src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py]."""


def _moe_fp8(prec: str, group: str) -> str | None | bool:
    """The FP8 recipe of an MoE row's precision: MXFP8 / FP8-MX -> mxfp8; FP8-CS and Megatron-Bridge's
    unqualified FP8 (its perf recipes are *_FP8_CS_*: current scaling) -> tensorwise; 25.09's
    parenthesised FP8 value (its footnote: block scaling) -> blockwise; NeMo 2 / dgxc 'FP8' -> delayed
    and NeMo-era sources' (dgxc-benchmarking, the NeMo perf summary) 'FP8' -> delayed (NeMo's default
    recipe then); BF16 -> None; NVFP4 -> False (not priced)."""
    p = prec.lower()
    if p.startswith("bf16"):
        return None
    if "nvfp4" in p:
        return False
    if "mxfp8" in p or "fp8-mx" in p:
        return "mxfp8"
    if "parenthesised" in p:
        return "blockwise"
    if "nemo 2.0" in p or group.startswith(("nvidia_dgxc", "nemo_framework")):
        return "delayed"
    return "tensorwise"


RECIPE_CORRECTIONS: dict[str, dict[str, str]] = {
    # These rows' perf recipe, DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1 (which their _V2 and
    # _GBS15360 variants replace() only in the global batch), sets recompute_modules=[]: with the perf
    # script's selective granularity Megatron recomputes nothing [NVIDIA-NeMo/Megatron-Bridge v0.5.0
    # (fcbb6031103d) and v0.5.1 (5cb3444c43f7) scripts/performance/configs/deepseek/
    # deepseek_workload_base_configs.py]. moe_runs.yaml reads 'no module list in the matching config'.
    # (The same recipe runs FP8 dot-product attention, fp8_dot_product_attention=True: _recipe_fp8_attention.)
    rid: {"recompute": "none (recipe sets recompute_modules=[])"}
    for rid in ("mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8", "mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8_gbs15360",
                "mbridge_26.06.01_dgx-gb300_deepseek_v3_256gpu_mxfp8")
}
"""Row fields the cited recipe contradicts, corrected from the recipe (the copied file stays as shared/ has it)."""


FP8_ATTENTION_CONFIGS = {
    "v0.5.0": {f"{m}_PRETRAIN_CONFIG_{c}" for m, cs in (
        ("DEEPSEEK_V3", ("GB300_FP8_MX_V1", "GB300_FP8_MX_V2", "GB300_FP8_MX_GBS15360")),
        ("GPT_OSS_120B", ("GB200_FP8_MX_V2", "GB300_FP8_MX_V2")),
        ("QWEN3_235B_A22B", ("GB200_FP8_MX_V2", "GB300_FP8_MX_V2")),
        ("QWEN3_30B_A3B", ("GB200_FP8_MX_V1", "GB300_FP8_MX_V1", "B300_FP8_MX_V1"))) for c in cs},
    "v0.5.1": {f"{m}_PRETRAIN_CONFIG_{c}" for m, cs in (
        ("DEEPSEEK_V3", ("GB300_FP8_MX_V1", "GB300_FP8_MX_V2", "GB300_FP8_MX_GBS15360", "B300_FP8_MX_V1", "B300_FP8_MX_V2")),
        ("GPT_OSS_120B", ("GB200_FP8_MX_V2", "GB300_FP8_MX_V2")),
        ("QWEN3_235B_A22B", ("GB200_FP8_MX_V2", "GB300_FP8_MX_V2", "B200_FP8_MX_V2", "B300_FP8_MX_V2")),
        ("QWEN3_30B_A3B", ("GB200_FP8_MX_V1", "GB300_FP8_MX_V1", "B200_FP8_MX_V1", "B300_FP8_MX_V1"))) for c in cs},
}
"""The Megatron-Bridge performance configs that run fp8_dot_product_attention=True, by release tag: set
there or inherited through replace() or an alias [NVIDIA-NeMo/Megatron-Bridge v0.5.0 (26.06) and v0.5.1
(26.06.01) scripts/performance/configs/{deepseek,gpt_oss,qwen}/*_workload_base_configs.py]; the MXFP8
configs only (none sets it before v0.5.0)."""
FP8_ATTENTION_HELPERS = ("_enable_hybridep_full_iteration_mxfp8", "_apply_gpt_oss_120b_full_iter_fp8mx_configs")
"""v0.6.0's (26.08) recipe helpers that set it [src/megatron/bridge/perf_recipes/qwen/common.py,
gpt_oss/common.py]; DeepSeek's _enable_deepseek_full_iteration_mxfp8 sets it where called with
fp8_dot_product_attention=True (deepseek/common.py), as the row's helpers_called records."""


def _recipe_fp8_attention(row: dict) -> bool:
    """Whether the row's cited recipe runs FP8 attention (TrainingSpec.fp8_attention)."""
    locator = str(row.get("recipe_locator") or "")
    for tag, names in FP8_ATTENTION_CONFIGS.items():
        if f" {tag} " in locator and any(locator.rstrip("'").endswith(f":: {n}") for n in names):
            return True
    helpers = [str(h) for h in (row.get("recipe") or {}).get("helpers_called") or []]
    return any(h.startswith(FP8_ATTENTION_HELPERS) or ("_enable_deepseek_full_iteration_mxfp8" in h
                                                       and "'fp8_dot_product_attention': True" in h) for h in helpers)


def _moe_fp8_param_gather(fp8: str | None) -> bool:
    """The MoE sources' mixed-precision presets keep FP8 weights and gather them in FP8 for every
    recipe but blockwise: Megatron-Bridge's bf16_with_fp8_current_scaling_mixed (tensorwise) and
    bf16_with_mxfp8_mixed (MXFP8, with reuse_grad_buf_for_mxfp8_param_ag) set fp8_param_gather = True,
    bf16_with_fp8_subchannel_scaling_mixed (blockwise) False [NVIDIA-NeMo/Megatron-Bridge@v0.4.0
    src/megatron/bridge/training/mixed_precision.py; the perf scripts' get_precision_config returns them
    unchanged, scripts/performance/utils/precision.py]; NeMo 2's bf16_with_fp8_mixed (delayed, the
    dgxc-benchmarking and NeMo rows) sets fp8_params = True [NVIDIA/NeMo nemo/collections/llm/recipes/
    precision/mixed_precision.py]."""
    return fp8 in ("tensorwise", "mxfp8", "delayed")


def _router_groups(r: dict) -> dict:
    """DeepSeek-V3's group-limited routing (8 groups, 4 per token: its config.json's n_group / topk_group,
    models/deepseek-v3.yaml), which NVIDIA's recipes keep (Megatron-Bridge's dryrun
    deepseek_v3_pretrain_h100_fp8_sc_v2.yaml: moe_router_num_groups 8, moe_router_group_topk 4)."""
    name = r["model_name"]
    return {"router_groups": 8, "router_group_topk": 4} if name.startswith(("DeepSeek-V3", "DeepSeek V3")) else {}


def _mtp_layers(r: dict) -> int:
    """DeepSeek-V3's one multi-token prediction depth where the run's stack trains it: Megatron-Bridge's
    DeepSeek-V3 recipes set mtp_num_layers = 1 (since their first, c0f24cf69) and its perf scripts put
    'mtp' beside the loss in every layout [NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/deepseek/
    h100/deepseek_v3.py: mtp_num_layers = 1, _get_deepseek_v3_pipeline_layout; perf_recipes/deepseek/gb300/
    deepseek_v3.py: 'Et*4|(t*4|)*14tmL']. NeMo 2's DeepSeekConfig leaves it None [NVIDIA/NeMo
    nemo/collections/llm/gpt/model/deepseek.py]: the dgxc-benchmarking rows train none."""
    bridge = "Megatron-Bridge" in str(r.get("software", ""))
    return 1 if bridge and r["model_name"].startswith(("DeepSeek-V3", "DeepSeek V3")) else 0


def _moe_model(r: dict) -> ModelSpec | str:
    """The row's architecture as a ModelSpec, or why the planner cannot express it."""
    mod = r["model"]
    att = str(mod.get("attention") or "")
    gpt_oss = {}
    window = re.fullmatch(r"gqa; alternating sliding-window \((\d+)\) / full layers, learnable softmax sinks, biased linears", att)
    if window:  # GPT-OSS: windowed odd layers, full even ones (Megatron --window-attn-skip-freq 2)
        gpt_oss = dict(sliding_window=int(window.group(1)), full_attention_every=2, attention_sinks=True,
                       linear_bias=True, activation="clamped-quick-geglu")
        att = "gqa"
    chunked = re.fullmatch(r"gqa; chunked attention \((\d+)\) with a NoPE layer every 4th layer", att)
    if chunked and r["seq_len"] <= int(chunked.group(1)):  # Llama 4: one chunk spans the sequence, so
        att = "gqa"  # every layer is causal over it; NoPE layers only skip the rotary embedding
    if att == "hybrid Mamba-2 + GQA attention + MoE (no RoPE)" and mod.get("hybrid_layer_pattern"):
        return _hybrid_model(r)
    if att == "hybrid Mamba-2 + attention + LatentMoE, with MTP" and r.get("model_family") == "nemotron3-super":
        return _super_model(r)
    if att not in ("gqa", "mla"):
        return (f"attention '{att or 'unpublished'}' (grouped-query, multi-latent, GPT-OSS's windowed attention "
                "and Nemotron-3 Nano's Mamba-2 hybrid are priced)")
    step = 1
    if mod.get("moe_layer_pattern"):
        pattern = re.fullmatch(r"alternating dense/MoE \(\[0,1\]\*(\d+)\)", mod["moe_layer_pattern"])
        if not pattern or 2 * int(pattern.group(1)) != mod["n_layers"]:
            return f"MoE layer pattern '{mod['moe_layer_pattern']}'"
        step = 2
    missing = [k for k in ("n_layers", "hidden_size", "n_heads", "ffn_hidden_size", "vocab_size", "num_experts", "top_k")
               if mod.get(k) is None]
    if missing:
        return f"model fields not published: {', '.join(missing)}"
    experts, fe = mod["num_experts"], mod.get("moe_ffn_hidden_size") or mod["ffn_hidden_size"]
    shared = mod.get("shared_expert_ffn_hidden_size") or 0
    if (mod.get("shared_experts") or 0) and not shared:
        shared = mod["shared_experts"] * fe
    head = mod.get("head_dim")
    mla = None
    if att == "mla":
        mla = {k: mod[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim")}
    return ModelSpec(
        name=r["model_name"], family="llama", num_layers=mod["n_layers"], hidden_size=mod["hidden_size"],
        num_attention_heads=mod["n_heads"], num_kv_heads=None if mla else mod.get("n_kv_heads"),
        kv_channels=head if head and head * mod["n_heads"] != mod["hidden_size"] else None,
        ffn_hidden_size=mod["ffn_hidden_size"], vocab_size=mod["vocab_size"], qk_norm=bool(mod.get("qk_layernorm")),
        moe={"num_experts": experts, "top_k": mod["top_k"], "expert_ffn_hidden_size": fe,
             "shared_expert_ffn_hidden_size": shared, "first_dense_layers": mod.get("first_dense_layers") or 0,
             "layer_step": step, **_router_groups(r)},
        mla=mla, mtp_layers=_mtp_layers(r), **gpt_oss)


HYBRID_CATALOG = "nemotron-3-nano-30b-a3b"
"""The catalog's hybrid model whose vocabulary the Nemotron-3 Nano rows leave unpublished (131,072, its
Hugging Face config.json; models/nemotron-3-nano-30b-a3b.yaml cites it)."""


def _hybrid_model(r: dict) -> ModelSpec | str:
    """A Mamba-2 / attention / MoE hybrid row (Nemotron-3 Nano) from its published fields: the layer pattern,
    Mamba-2 heads, head width and state size, attention and expert shapes. Its squared-ReLU experts, eight
    Mamba groups, absent position embedding and vocabulary come from the catalog entry of the same pattern,
    and every field the row does publish must agree with it."""
    mod, ref = r["model"], planner.load_model(HYBRID_CATALOG)
    if mod["hybrid_layer_pattern"] != ref.layer_pattern:
        return f"hybrid layer pattern '{mod['hybrid_layer_pattern']}' (the catalog prices {HYBRID_CATALOG}'s)"
    published = {"n_layers": ref.num_layers, "hidden_size": ref.hidden_size, "n_heads": ref.num_attention_heads,
                 "n_kv_heads": ref.kv_heads, "head_dim": ref.head_dim, "num_experts": ref.moe.num_experts,
                 "top_k": ref.moe.top_k, "moe_ffn_hidden_size": ref.moe.expert_ffn_hidden_size,
                 "shared_expert_ffn_hidden_size": ref.moe.shared_expert_ffn_hidden_size,
                 "mamba_num_heads": ref.mamba.num_heads, "mamba_head_dim": ref.mamba.head_dim,
                 "mamba_state_dim": ref.mamba.state_dim}
    differ = [k for k, v in published.items() if mod.get(k) is not None and mod[k] != v]
    if differ:
        return f"hybrid model fields differ from {HYBRID_CATALOG}: {', '.join(differ)}"
    return ref.model_copy(update={"name": r["model_name"]})


SUPER_CATALOG = "nemotron-3-super-120b-a12b"
"""The catalog entry the Nemotron-3 Super rows train: they publish no layer shapes (their recipes take them
from the Hugging Face config through AutoBridge; models/nemotron-3-super-120b-a12b.yaml cites that config),
only the 120B total and 12B active the entry reproduces (120.7B; 12.8B with the embeddings)."""


def _super_model(r: dict) -> ModelSpec | str:
    """A Nemotron-3 Super row: the catalog's model, whose published totals must agree within 1B."""
    ref, mod = planner.load_model(SUPER_CATALOG), r["model"]
    if abs(ref.num_params / 1e9 - mod["params_b"]) > 1 or abs(ref.active_params / 1e9 - mod["active_params_b"]) > 1:
        return f"published totals {mod['params_b']}B / {mod['active_params_b']}B differ from {SUPER_CATALOG}'s"
    return ref.model_copy(update={"name": r["model_name"]})


def _stage_split(layers: int, stages: int) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage where they do not divide evenly: Megatron's embedding/loss
    accounting when that divides (account_for_ends_split), else Megatron-Bridge's DeepSeek-V3 rule:
    full stages of ceil(L / stages) and the remainder on the last ((16, 1): 4 x 15 + 1; (8, 1):
    8 x 7 + 5), or, where that overflows, one layer beside the embedding, two per stage and none
    beside the loss (32 stages: 1 + 2 x 30 + 0) [NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/
    recipes/deepseek/h100/deepseek_v3.py: _get_deepseek_v3_pipeline_layout; 25.09 perf layouts]."""
    if stages == 1 or layers % stages == 0:
        return None
    ends = account_for_ends_split(layers, stages)
    if ends is not None:
        return ends
    k = -(-layers // stages)
    if layers - k * (stages - 1) >= 1:
        return (k,) * (stages - 1) + (layers - k * (stages - 1),)
    k = (layers - 1) // (stages - 2)
    return (layers - k * (stages - 2),) + (k,) * (stages - 2) + (0,)


def _moe_measured_tokens(row: dict) -> float | None:
    """Tokens per second per GPU as the row measured them: the published per-GPU figure, else the
    published step time (seq x GBS / step / GPUs), which is what dgxc-benchmarking measures. Its
    printed total throughput is not used: for the 512-GPU Grok-1 columns it is half of seq x GBS /
    step time (the rows' notes), and the step time is the primary measurement."""
    meas = row["measured"]
    if (tokens := _measured_tokens(row)) is not None:
        return tokens
    if meas.get("step_time_s"):
        return row["seq_len"] * row["global_batch_seqs"] / meas["step_time_s"] / row["num_gpus"]
    return (row.get("derived") or {}).get("tokens_per_sec_per_gpu")


def _moe_loss(row: dict) -> str:
    """The loss kernel the run's declared stack runs: Megatron-Bridge's perf recipes set
    cross_entropy_loss_fusion with cross_entropy_fusion_impl='te', Transformer Engine's loss
    [NVIDIA-NeMo/Megatron-Bridge@a9497c6 scripts/performance/dryrun_configs/gpt_oss/
    gpt_oss_120b_pretrain_gb200_fp8_mx_v2.yaml: model.cross_entropy_fusion_impl: te, and the other
    models' perf configs alike]; the NeMo 2 scripts' is left at megatron-core's (ASSUMPTION: not checked)."""
    return "te" if "Megatron-Bridge" in str(row.get("software", "")) else "fp32"


def _moe_token_drop(r: dict) -> dict:
    """The row's token dropping (TrainingSpec.moe_capacity_factor, moe_pad_to_capacity) from its recipe note,
    e.g. 'capacity factor 1.0 + pad'; a bare NeMo 2 MegatronTokenDropCallback runs with its defaults, factor 1.0
    padded [NeMo nemo/lightning/pytorch/callbacks/moe_token_drop.py: MegatronTokenDropCallback.__init__];
    {} for a dropless row."""
    note = str((r.get("recipe") or {}).get("token_drop") or "")
    factor = re.search(r"capacity factor ([0-9.]+)", note)
    if factor:
        return dict(moe_capacity_factor=float(factor.group(1)), moe_pad_to_capacity="pad" in note)
    if "MegatronTokenDropCallback" in note:
        return dict(moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    return {}


def load_moe_runs(path: Path = MOE_RUNS_PATH) -> tuple[list[Run], list[tuple[str, str]]]:
    """The MoE rows the planner can price as Runs, and (id, reason) for the others.

    ASSUMPTIONS (the tables print the layout and throughput only): Megatron's distributed optimizer
    (ZeRO-1, the perf recipes' default) with gradient and parameter overlap, sequence parallelism
    with TP (Megatron requires it for MoE), no recompute where the row publishes none (the perf
    scripts' family default), ETP = the recipe's value, else TP (Megatron's default), EP all-to-all
    overlap (Megatron's combined 1F1B) where the row or its recipe turns it on. Rows whose
    dispatcher is DeepEP or HybridEP (both send a token once per remote node and forward it over
    NVLink) are priced with moe_dispatcher='deepep', the others with the all-to-all dispatcher."""
    runs, skipped = [], []
    for r in yaml.safe_load(Path(path).read_text()):
        r = {**r, **RECIPE_CORRECTIONS.get(r["id"], {})}
        par = r["parallel"]
        fp8 = _moe_fp8(r.get("precision") or "", r["source_group"])
        model = _moe_model(r)
        cluster = _cluster_for(r["gpu_type"], r["num_gpus"], r.get("gpus_per_node") or 8)
        tokens = _moe_measured_tokens(r)
        rc = _recompute(r.get("recompute")) or ("none" if r.get("recompute") is None else None)
        why = (model if isinstance(model, str) else
               NVFP4_ROWS if fp8 is False else
               f"no catalogued cluster for {r['gpu_type']}" if cluster is None else
               "FSDP sharding (NeMo AutoModel's FSDP2 with experts is not priced; Megatron-FSDP's is)" if par.get("fsdp") else
               f"recompute '{r.get('recompute')}'" if rc is None else
               f"recompute modules '{r.get('recompute')}' (whole-module checkpoints are not priced)"
               if _recompute_modules(r.get("recompute")) is False else
               "no throughput published" if not tokens else None)
        if why:
            skipped.append((r["id"], why))
            continue
        tp, pp, cp = par.get("tp") or 1, par.get("pp") or 1, par.get("cp") or 1
        etp = par.get("etp") or (r.get("recipe") or {}).get("etp")
        dp = r["num_gpus"] // (tp * pp * cp)
        vpp = par.get("vpp") or 1
        disp = str((r.get("moe") or {}).get("token_dispatcher") or (r.get("recipe") or {}).get("token_dispatcher") or "")
        deep = ("deepep" in disp.lower() or "hybridep" in disp.lower()) and (par.get("ep") or 1) > 1 and (etp or tp) == 1
        a2a_overlap = bool((r.get("moe") or {}).get("ep_a2a_overlap") or (r.get("recipe") or {}).get("moe_a2a_overlap"))
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=par.get("ep") or 1, etp=etp, zero_stage=1,
                        moe_dispatcher="deepep" if deep else "alltoall", ep_overlap=a2a_overlap,
                        micro_batch_size=r["micro_batch"], recompute=rc, vpp=vpp, sequence_parallel=tp > 1,
                        recompute_modules=_recompute_modules(r.get("recompute")) if rc == "selective" else None,
                        overlap_grad_reduce=dp > 1, overlap_param_gather=dp > 1,
                        pipeline_layers=_stage_split(model.num_layers, pp * vpp))
        training = TrainingSpec(global_batch_size=r["global_batch_seqs"], seq_length=r["seq_len"], fp8=fp8,
                                grad_dtype="bf16", fp8_param_gather=_moe_fp8_param_gather(fp8),
                                fp8_attention=fp8 in FP8_ATTENTION_RECIPES and _recipe_fp8_attention(r),
                                cross_entropy=_moe_loss(r), **_moe_token_drop(r))
        runs.append(Run(r["id"], r["source_group"], model, cluster, training, layout, float(tokens), None, False))
    return runs, skipped


def load_ratio_pairs(path: Path = RATIO_PAIRS_PATH) -> list[tuple[Run, Run]]:
    """(BF16 run, FP8 run) of each pair in speedup_pairs.yaml, on the catalog model and cluster it names, as
    torchtitan runs them (the only stack there): 0.3's chunked loss, or with `loss: whole` the whole sequence's
    eager loss of the torchtitan before it (priced as the published torchtitan rows are: FSDP2, PyTorch's kernels,
    one loss chunk). Their ratio is the measurement, and their absolute speed only where the part is the catalog's
    (`catalog_part`; most are power-limited or unnamed): they feed the speedup checks and never the error tables or
    the fits; their peak memory, where published (`peak_mem_gib`), is checked against the ledger."""
    pairs = []
    for r in yaml.safe_load(Path(path).read_text()):
        model = planner.load_model(r["model"])
        if "model_overrides" in r:  # a cut-down flavour of the catalog model (fewer layers to fit one node)
            model = ModelSpec(**{**model.model_dump(), **r["model_overrides"]})
        cluster = planner.load_cluster(r["cluster"], nodes=r["nodes"], **r.get("cluster_overrides", {}))
        layout = Layout(**r["layout"])
        tokens, mem = r["tokens_per_sec_per_gpu"], r.get("peak_mem_gib", {})
        runs, whole = [], r.get("loss") == "whole"
        for fp8 in (None, r["fp8"]):
            training = TrainingSpec(global_batch_size=r["global_batch_size"], seq_length=r["seq_length"], fp8=fp8,
                                    fp8_param_gather=bool(fp8) and r.get("fp8_param_gather", False),
                                    **({"optimizer_impl": "fsdp2", "kernels": "unfused"} if whole else {}))
            training = training if whole else framework_training(training, "torchtitan")
            key = "fp8" if fp8 else "bf16"
            runs.append(Run(r["id"] if fp8 else f"{r['id']}_bf16", r["source_group"], model, cluster, training, layout,
                            float(tokens[key]), mem[key] * 2**30 if key in mem else None, False,
                            r.get("catalog_part", False)))
        pairs.append((runs[0], runs[1]))
    return pairs
