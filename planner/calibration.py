"""Calibrate a cluster from training logs: fit the few physical parameters a measurement constrains.

Parameters (each a factor on the catalog's value, with a log-normal prior centred on it):
- `gemm`: every point of calibration.gemm_efficiency (capped at 1);
- `gemm_fp8`: every point of calibration.gemm_efficiency_fp8 (runs with FP8 linear layers only);
- `attention`: attention_efficiency and attention_efficiency_unfused (capped at 1);
- `scaleout`: scaleout.nic_busbw (the inter-node collective bandwidth);
- `tp_exposed`: calibration.tp_comm_exposed (capped at 1);
- `mamba_scan`: calibration.mamba_scan_efficiency (capped at 1; moved only by runs with Mamba-2 layers);
- `ep_comm`: calibration.ep_comm_speed, the MoE dispatch and combine's speed (moved only by runs with EP or ETP);
- `moe_stall` (seconds, additive, normal prior at 0, never below 0): calibration.moe_host_stall, the GPU's
  idle time in each MoE layer's forward at the dispatcher's host sync (moved only by MoE runs);
- `expert_call` (seconds added to the catalog's value, normal prior at 0, the sum never below 0):
  calibration.grouped_gemm_call, the host's time per expert GEMM of a grouped linear (moved only by MoE runs
  whose expert GEMMs wait on the host);
- `fsdp_overlap` (a share added to the catalog's, normal prior at 0, the sum kept in [0, 1]):
  calibration.dp_overlap, the share of each micro-batch's compute that hides FSDP's gathers and
  reduce-scatters (moved only by runs with FSDP: ZeRO-3, and ZeRO-2 outside DeepSpeed, overlapped);
- `memory_overhead` (bytes, additive, normal prior): the per-GPU memory outside the ledger.

The fit is the maximum a posteriori estimate: Levenberg-Marquardt on
    Σ_runs ((ln predicted − ln measured) / MEASUREMENT_SIGMA)² + Σ_params (ln factor / prior sigma)²
(an additive parameter's term is (value / unit / prior sigma)²)
with step times from planner.evaluate (the same model plan() optimises), so a parameter the logs
do not exercise (no inter-node traffic → scaleout) keeps its catalog value. The memory overhead
is linear in the measurement and has a closed form. Peak memory is compared with the largest
peak *reserved* the log reports (planner.logs).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.errors import PlannerError
from planner.logs import LogError, LogMeasurement
from planner.memory import TE_FP8_RECIPES
from planner.pipeline_layout import parse_layout_string
from planner.plans import Plan, evaluate
from planner.specs import RECOMPUTE_MODULES, ClusterSpec, Layout, ModelSpec, PredictionError, Recompute, TrainingSpec
from planner.uncertainty import prediction_error

__all__ = ["Observation", "Parameter", "PARAMETERS", "CalibrationResult", "RunFit", "calibrate", "observation",
           "calibrated_yaml", "CALIBRATED_MARKER", "calibrate_logs",
           "apply_factors", "megatron_setup", "MEASUREMENT_SIGMA", "OVERHEAD_PRIOR_SIGMA", "CALIBRATED_SIGMA_FLOOR"]

MEASUREMENT_SIGMA = 0.02
"""Spread of ln(step time) between repeated runs of one layout (run-to-run noise plus what the
model cannot express for one layout); sets how far one log pulls the parameters."""

OVERHEAD_PRIOR_SIGMA = 2 * 2**30
"""Prior spread of the memory overhead, bytes."""

MEMORY_MEASUREMENT_SIGMA = 0.5 * 2**30
"""Spread of a measured peak around the ledger plus overhead, bytes (allocator behaviour)."""

CALIBRATED_SIGMA_FLOOR = PredictionError(step_time_sigma=0.077, memory_sigma=0.03, basis="floor")
"""The least spread claimed after calibration. Step time: `python benchmarks/intervals.py --one-run`
calibrates on one run of each published sweep and predicts the sweep's other layouts: median
|error| 3.9 %, 80th percentile 9.9 % = 1.28 x 0.077 (342 predictions, 5 source groups, re-measured at stop 58;
the same without fsdp_overlap among the parameters; 5.1 / 10.8 % and 0.085 when measured before the per-op
pricing). Memory:
ASSUMED (the allocator's spread between layouts; few published peaks to measure it on)."""


@dataclass(frozen=True)
class Parameter:
    """One fitted physical parameter: a factor on the catalog value."""

    name: str
    prior_sigma: float
    """Spread of ln(factor) before any log is seen (an additive parameter: of value / unit)."""
    what: str
    unit: float | None = None
    """None: a factor on the cluster's value. Else an amount added to it, in these SI units (the fit's
    variable is amount / unit); the sum is kept at or above 0."""
    share: bool = False
    """The amount added is a share (a fraction of the compute), not seconds."""

    def value(self, z: float) -> float:
        """The factor (or the amount added) at the fit's variable z."""
        return math.exp(z) if self.unit is None else z * self.unit

    def variable(self, value: float) -> float:
        """The fit's variable at a factor (or an amount added)."""
        return math.log(value) if self.unit is None else value / self.unit

    def shown(self, value: float) -> str:
        """The factor, or the amount added with its unit."""
        if self.unit is None:
            return f"{value:.3f}"
        if self.share:
            return f"{value:+.3f}"
        return f"{value * 1e6:+.1f} us" if self.unit < 1e-4 else f"+{value * 1e3:.3f} ms"

    def moved(self, value: float) -> bool:
        """Whether the fit moved the parameter off the cluster's value."""
        return abs(self.variable(value)) >= 0.005


PARAMETERS = (
    Parameter("gemm", 0.15, "GEMM efficiency (every point of the curve)"),
    Parameter("gemm_fp8", 0.15, "FP8 GEMM efficiency (moved only by runs with FP8 linear layers)"),
    Parameter("attention", 0.25, "attention kernel efficiency"),
    Parameter("scaleout", 0.35, "inter-node collective bandwidth per NIC"),
    Parameter("tp_exposed", 0.35, "share of tensor-parallel communication left exposed"),
    Parameter("mamba_scan", 0.7, "Mamba-2 scan kernels' share of their HBM roofline (moved only by hybrid runs)"),
    Parameter("ep_comm", 0.15, "speed of the MoE dispatch and combine (moved only by runs with EP or ETP)"),
    Parameter("moe_stall", 1.0, "seconds added to the GPU's idle time at each MoE forward's host sync "
              "(moved only by MoE runs)", unit=1e-3),
    Parameter("expert_call", 3.0, "seconds added to the host's time per expert GEMM of a grouped linear "
              "(calibration.grouped_gemm_call; moved only by MoE runs whose expert GEMMs wait on the host)", unit=1e-5),
    Parameter("fsdp_overlap", 3.0, "share of each micro-batch's compute that hides FSDP's collectives, added "
              "(calibration.dp_overlap; moved only by runs with FSDP: ZeRO-3, or ZeRO-2 outside DeepSpeed)",
              unit=0.1, share=True),
)


def apply_factors(cluster: ClusterSpec, factors: dict[str, float], overhead: float | None = None) -> ClusterSpec:
    """`cluster` with the parameters scaled by `factors` (missing names: 1) and the memory overhead set."""
    cal = cluster.calibration
    g, a, t = factors.get("gemm", 1.0), factors.get("attention", 1.0), factors.get("tp_exposed", 1.0)
    g8 = factors.get("gemm_fp8", 1.0)
    cal = cal.model_copy(update={
        "gemm_efficiency": [(x, min(1.0, y * g)) for x, y in cal.gemm_efficiency],
        "gemm_efficiency_fp8": None if cal.gemm_efficiency_fp8 is None
        else [(x, min(1.0, y * g8)) for x, y in cal.gemm_efficiency_fp8],
        "attention_efficiency": min(1.0, cal.attention_efficiency * a),
        "attention_efficiency_unfused": min(1.0, cal.attention_efficiency_unfused * a),
        "tp_comm_exposed": min(1.0, cal.tp_comm_exposed * t),
        "mamba_scan_efficiency": min(1.0, cal.mamba_scan_efficiency * factors.get("mamba_scan", 1.0)),
        "ep_comm_speed": min(4.0, cal.ep_comm_speed * factors.get("ep_comm", 1.0)),
        "moe_host_stall": min(1.0, max(0.0, cal.moe_host_stall + factors.get("moe_stall", 0.0))),
        "grouped_gemm_call": min(1e-2, max(0.0, cal.grouped_gemm_call + factors.get("expert_call", 0.0))),
        "dp_overlap": min(1.0, max(0.0, cal.dp_overlap + factors.get("fsdp_overlap", 0.0))),
    })
    scaleout = cluster.scaleout.model_copy(update={"nic_busbw": cluster.scaleout.nic_busbw * factors.get("scaleout", 1.0)})
    update = {"calibration": cal, "scaleout": scaleout}
    if overhead is not None:
        update["memory_overhead"] = overhead
    return cluster.model_copy(update=update)


START_POINTS = ({}, {"scaleout": 0.5}, {"scaleout": 2.0})
"""Where the fit starts (factors; the catalog first)."""


@dataclass(frozen=True)
class Observation:
    """One measured run: the problem, the layout it ran and what it measured."""

    label: str
    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    step_time_s: float
    peak_memory_bytes: float | None = None
    cuda_graphs: str | None = None
    """Megatron's printed cuda_graph_impl where the run captured CUDA graphs ('local', 'transformer_engine');
    None where it did not or did not say."""
    eager: bool = False
    """A torchtitan run whose log shows it did not compile its blocks (LogMeasurement.compiled False)."""

    def nodes(self, cluster: ClusterSpec) -> int:
        return math.ceil(self.layout.world_size / cluster.gpus_per_node)


_REQUIRED = object()


# Megatron's argument dump [megatron/training/arguments.py:_print_args] -> planner fields
def _arg(args: dict[str, str], name: str, where: str, kind=int, default=_REQUIRED):
    """The printed value of `name` as `kind`; `default` where absent or None (else an error)."""
    text = args.get(name)
    if text is None or text == "None":
        if default is not _REQUIRED:
            return default
        raise LogError(f"{where}: the argument dump has no '{name}'")
    if kind is bool:
        if text not in ("True", "False"):
            raise LogError(f"{where}: argument '{name}' = {text!r}, expected True or False")
        return text == "True"
    try:
        return kind(text)
    except ValueError:
        raise LogError(f"{where}: argument '{name}' = {text!r} is not a {kind.__name__.strip('_').replace('_', ' ')}") from None


def _recompute_modules(text: str, where: str) -> tuple[str, ...] | None:
    """Megatron's printed recompute_modules (a Python list, e.g. "['moe_act', 'layernorm']"; None is its
    default, the attention core) as Layout.recompute_modules; a module the planner does not price is
    refused rather than priced as another."""
    if text in ("None", "[]"):
        return None
    mods = tuple(m.strip().strip("'\"") for m in text.strip("[]").split(",") if m.strip())
    unknown = sorted(set(mods) - set(RECOMPUTE_MODULES))
    if unknown:
        raise LogError(f"{where}: recompute_modules {', '.join(unknown)} are not priced (the planner prices "
                       f"{', '.join(RECOMPUTE_MODULES)})")
    return mods


def _loss_kernel(args: dict[str, str], where: str) -> str:
    """The loss a Megatron run computed (cost.loss_traffic_bytes): megatron-core's without
    --cross-entropy-loss-fusion (Megatron-LM's default, and a dump from before the flag existed),
    its fused one with it, or Transformer Engine's under --cross-entropy-fusion-impl te."""
    if not _arg(args, "cross_entropy_loss_fusion", where, kind=bool, default=False):
        return "unfused"
    return "te" if args.get("cross_entropy_fusion_impl") == "te" else "fp32"


def megatron_setup(args: dict[str, str], model: ModelSpec, where: str) -> tuple[TrainingSpec, Layout]:
    """The training spec and layout of a Megatron run from its printed arguments.

    Checks the model's shape against the run's (layers, width, heads, FFN width, MTP depths, experts); a
    --pipeline-model-parallel-layout string becomes Layout.pipeline_layers (planner.pipeline_layout),
    refused in one line where it places the embedding, the loss or the MTP depths elsewhere than the
    planner prices them.
    """
    for name, mine, required in (("num_layers", model.num_layers, True), ("hidden_size", model.hidden_size, True),
                                 ("num_attention_heads", model.num_attention_heads, False),
                                 ("ffn_hidden_size", model.ffn_hidden_size, False)):
        theirs = _arg(args, name, where, default=_REQUIRED if required else None)
        if theirs is not None and theirs != mine:
            raise LogError(f"{where}: the run has {name} = {theirs}, the model {model.name} has {mine}")
    mtp = _arg(args, "mtp_num_layers", where, default=None) or 0  # None: no multi-token prediction
    if mtp != model.mtp_layers:
        raise LogError(f"{where}: the run trains mtp_num_layers = {mtp}, the model {model.name} has mtp_layers = "
                       f"{model.mtp_layers}; give a model with the run's multi-token prediction depths")
    shared = _arg(args, "mtp_use_repeated_layer", where, kind=bool, default=False)
    if mtp and shared != model.mtp_shared:
        raise LogError(f"{where}: the run has mtp_use_repeated_layer = {shared}, the model {model.name} has "
                       f"mtp_shared = {model.mtp_shared}")
    tp, pp = _arg(args, "tensor_model_parallel_size", where), _arg(args, "pipeline_model_parallel_size", where)
    experts = _megatron_experts(args, model, tp, where)
    split = _hybrid_split(args, model, where)
    if (text := args.get("pipeline_model_parallel_layout", "None")) != "None":  # printed as given
        try:
            split = parse_layout_string(text.strip("'\""), pp, model.num_layers, model.mtp_layers)
        except PlannerError as err:
            raise LogError(f"{where}: {err}") from None
    cp = _arg(args, "context_parallel_size", where, default=1)
    world = _arg(args, "world_size", where)
    if world % (tp * pp * cp):
        raise LogError(f"{where}: world_size {world} is not a multiple of tp*pp*cp = {tp * pp * cp}")
    gran = args.get("recompute_granularity", "None")
    recompute, n_rc = Recompute.NONE, None
    modules = None
    if gran == "selective":
        recompute = Recompute.SELECTIVE
        modules = _recompute_modules(args.get("recompute_modules", "None"), where)
    elif gran == "full":
        recompute = Recompute.FULL
        if args.get("recompute_method") == "block":
            n_rc = _arg(args, "recompute_num_layers", where)
    elif gran != "None":
        raise LogError(f"{where}: recompute_granularity = {gran!r} is not one the planner prices")
    vpp = len(split) // pp if split else _arg(args, "virtual_pipeline_model_parallel_size", where, default=1)
    bf16 = _arg(args, "bf16", where, kind=bool, default=False)
    fp8 = None
    if args.get("fp4", "None") not in ("None", None):  # --fp4-format given: NVFP4 is its only priced recipe
        if args.get("fp4_recipe", "nvfp4") != "nvfp4":
            raise LogError(f"{where}: fp4_recipe = {args.get('fp4_recipe')!r} is not one the planner prices")
        fp8 = "nvfp4"
    elif args.get("fp8", "None") != "None":  # --fp8-format given: the recipe (Megatron's default: delayed)
        fp8 = args.get("fp8_recipe", "delayed")
        if fp8 not in TE_FP8_RECIPES:
            raise LogError(f"{where}: fp8_recipe = {fp8!r} is not one the planner prices")
    gather = fp8 is not None and _arg(args, "fp8_param_gather", where, kind=bool, default=False)
    if fp8 == "nvfp4" and _arg(args, "fp4_param_gather", where, kind=bool, default=False):
        raise LogError(f"{where}: fp4_param_gather (NVFP4 weights gathered in FP4) is not priced")
    ends = (0, 0)  # Megatron's defaults for the counts are 1 and 1 (TransformerConfig)
    if fp8 is not None and _arg(args, "first_last_layers_bf16", where, kind=bool, default=False):
        ends = (_arg(args, "num_layers_at_start_in_bf16", where, default=1),
                _arg(args, "num_layers_at_end_in_bf16", where, default=1))
    states, offload = "fp32", 0.0
    if _arg(args, "optimizer_cpu_offload", where, kind=bool, default=False):  # HybridDeviceOptimizer: FP32 Adams
        if not _arg(args, "overlap_cpu_optimizer_d2h_h2d", where, kind=bool, default=False):
            raise LogError(f"{where}: optimizer_cpu_offload without overlap_cpu_optimizer_d2h_h2d is not priced "
                           "(the planner prices the overlapped copies and CPU steps)")
        offload = _arg(args, "optimizer_offload_fraction", where, kind=float, default=1.0)
    elif _arg(args, "use_precision_aware_optimizer", where, kind=bool, default=False):
        dtypes = {args.get("exp_avg_dtype"), args.get("exp_avg_sq_dtype")}
        if not dtypes <= {"torch.bfloat16", "bf16"}:
            raise LogError(f"{where}: precision-aware optimizer with exp_avg dtypes {sorted(map(str, dtypes))}: "
                           "only BF16 moments are priced")
        states = "bf16"
    training = TrainingSpec(
        optimizer_states=states, optimizer_offload=offload,
        fp8=fp8, fp8_param_gather=gather, bf16_first_layers=ends[0], bf16_last_layers=ends[1],
        global_batch_size=_arg(args, "global_batch_size", where), seq_length=_arg(args, "seq_length", where),
        precision="bf16" if bf16 else "fp16",
        grad_dtype="bf16" if _arg(args, "grad_reduce_in_bf16", where, kind=bool, default=False) else "fp32",
        cross_entropy=_loss_kernel(args, where), **_megatron_routing(args, model, where),
    )
    layout = Layout(
        tp=tp, pp=pp, cp=cp, dp=world // (tp * pp * cp), micro_batch_size=_arg(args, "micro_batch_size", where),
        zero_stage=1 if _arg(args, "use_distributed_optimizer", where, kind=bool, default=False) else 0,
        recompute=recompute, recompute_num_layers=n_rc, recompute_modules=modules, vpp=vpp,
        sequence_parallel=_arg(args, "sequence_parallel", where, kind=bool, default=False),
        first_stage_layers=None if split else _arg(args, "decoder_first_pipeline_num_layers", where, default=None),
        last_stage_layers=None if split else _arg(args, "decoder_last_pipeline_num_layers", where, default=None),
        pipeline_layers=split,
        rank_order="tp-cp-pp-dp" if _arg(args, "use_tp_pp_dp_mapping", where, kind=bool, default=False) else "tp-cp-dp-pp",
        overlap_grad_reduce=_arg(args, "overlap_grad_reduce", where, kind=bool, default=False),
        overlap_param_gather=_arg(args, "overlap_param_gather", where, kind=bool, default=False),
        tp_comm_overlap=_arg(args, "tp_comm_overlap", where, kind=bool, default=False),
        **experts,
    )
    return training, layout


def _hybrid_split(args: dict[str, str], model: ModelSpec, where: str) -> tuple[int, ...] | None:
    """A hybrid run's layers per virtual stage from its --hybrid-layer-pattern (the legacy
    --hybrid-override-pattern where that is all it printed), after checking the pattern against the model's:
    the main pattern's '|' pipes give the split (None without pipes: Megatron's even split, as the planner
    prices it), each '/' part one MTP depth [megatron-core 0.19.2 training/arguments.py: validate_args;
    models/hybrid/hybrid_layer_allocation.py: parse_hybrid_pattern]. None for a transformer run."""
    text = args.get("hybrid_layer_pattern", "None")
    if text in ("None", None):
        text = args.get("hybrid_override_pattern", "None")
    if text in ("None", None):
        if model.hybrid:
            raise LogError(f"{where}: the run prints no hybrid_layer_pattern, but the model {model.name} is a hybrid")
        return None
    if not model.hybrid:
        raise LogError(f"{where}: the run is a hybrid (hybrid_layer_pattern), the model {model.name} is not")
    main, *depths = text.strip("'\"").split("/")
    stages = main.split("|")
    if "".join(stages) != model.layer_pattern:
        raise LogError(f"{where}: the run's hybrid_layer_pattern {''.join(stages)!r} is not the model's {model.layer_pattern!r}")
    if depths and any(d != model.mtp_pattern for d in depths):
        raise LogError(f"{where}: the run's MTP depths {depths!r} are not the model's {model.mtp_pattern!r}")
    return tuple(len(x) for x in stages) if len(stages) > 1 else None


def _megatron_experts(args: dict[str, str], model: ModelSpec, tp: int, where: str) -> dict:
    """The expert layout of a Megatron MoE run (Layout.ep, etp, moe_dispatcher, ep_overlap) from its printed
    arguments, after checking the experts against the model's; {} for a dense run of a dense model.
    Megatron's defaults where absent: ETP = TP, the all-gather dispatcher, dropless routing
    [megatron-core 0.19.2 transformer_config.py: moe_token_dispatcher_type 'allgather',
    moe_flex_dispatcher_backend 'deepep', moe_expert_capacity_factor None; arguments.py: ETP defaults to TP].
    Refused in one line: experts that differ from the model's, NCCL EP's flex backend. Token dropping
    is the workload's (megatron_routing)."""
    n = _arg(args, "num_experts", where, default=None) or None
    if model.moe is None:
        if n:
            raise LogError(f"{where}: the run has num_experts = {n}, the model {model.name} is dense")
        return {}
    e = model.moe
    for name, theirs, mine in (("num_experts", n, e.num_experts),
                               ("moe_router_topk", _arg(args, "moe_router_topk", where, default=2), e.top_k),
                               ("moe_router_num_groups", _arg(args, "moe_router_num_groups", where, default=None),
                                e.router_groups),
                               ("moe_latent_size", _arg(args, "moe_latent_size", where, default=None), e.latent_size)):
        if theirs != mine:
            raise LogError(f"{where}: the run has {name} = {theirs}, the model {model.name} has {mine}")
    kind = args.get("moe_token_dispatcher_type", "allgather")
    if kind == "flex":
        backend = args.get("moe_flex_dispatcher_backend", "deepep")
        if backend not in ("deepep", "hybridep"):  # both send a token once per remote node (planner.comm)
            raise LogError(f"{where}: moe_flex_dispatcher_backend = {backend!r} is not priced (deepep, hybridep are)")
        dispatcher = "deepep"
    elif kind in ("alltoall", "allgather"):
        dispatcher = kind
    else:
        raise LogError(f"{where}: moe_token_dispatcher_type = {kind!r} is not priced (alltoall, allgather, flex are)")
    return dict(ep=_arg(args, "expert_model_parallel_size", where, default=1),
                etp=_arg(args, "expert_tensor_parallel_size", where, default=tp), moe_dispatcher=dispatcher,
                ep_overlap=_arg(args, "overlap_moe_expert_parallel_comm", where, kind=bool, default=False))


def _megatron_routing(args: dict[str, str], model: ModelSpec, where: str) -> dict:
    """An MoE Megatron run's token dropping (TrainingSpec.moe_capacity_factor, moe_pad_to_capacity) from its
    printed arguments; Megatron reads a negative capacity factor as none [megatron-core 0.19.2
    transformer_config.py: TransformerConfig.__post_init__]. Either drop policy keeps the same rows."""
    factor = _arg(args, "moe_expert_capacity_factor", where, kind=float, default=None) if model.moe else None
    if factor is None or factor < 0:
        return {}
    return dict(moe_capacity_factor=factor,
                moe_pad_to_capacity=_arg(args, "moe_pad_expert_input_to_capacity", where, kind=bool, default=False))


def _whole_number(text: str) -> int:
    """DeepSpeed prints some counts as floats ('512.0')."""
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


def deepspeed_setup(config: dict[str, str], training: TrainingSpec, layout: Layout,
                    where: str) -> tuple[TrainingSpec, Layout]:
    """`training` and `layout` with what DeepSpeed's printed configuration states: the global batch
    (train_batch_size), the micro-batch (train_micro_batch_size_per_gpu), the ZeRO stage
    (zero_optimization_stage), the data-parallel size (its world_size), the gradient accumulation dtype
    (grad_accum_dtype) and ZeRO-Offload (zero_config's offload_optimizer device) [deepspeedai/DeepSpeed@edaa722
    deepspeed/runtime/config.py:DeepSpeedConfig]; with ZeRO the run is priced on DeepSpeed's engine
    (TrainingSpec.optimizer_impl, planner.deepspeed_engine). The rest (sequence length, TP/PP) is the caller's."""
    t_up, l_up = {}, {}
    if "grad_accum_dtype" in config:  # None: the model's dtype [engine.py: get_data_types]
        t_up["grad_dtype"] = "fp32" if config["grad_accum_dtype"].strip() == "fp32" else "bf16"
    # ZeRO-Offload: zero_config prints offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', ...)
    device = re.search(r"offload_optimizer=\w*\(device='(\w+)'", config.get("zero_config", ""))
    if device and device.group(1) == "cpu":
        t_up["optimizer_offload"] = 1.0
    elif device and device.group(1) != "none":
        raise LogError(f"{where}: zero_config offloads the optimizer to '{device.group(1)}'; only CPU offload is priced")
    for key, name, target in (("train_batch_size", "global_batch_size", t_up),
                              ("train_micro_batch_size_per_gpu", "micro_batch_size", l_up),
                              ("zero_optimization_stage", "zero_stage", l_up), ("world_size", "dp", l_up)):
        if key in config:
            target[name] = _arg(config, key, where, kind=_whole_number)
    if l_up.get("zero_stage", layout.zero_stage) >= 1:
        t_up["optimizer_impl"] = "deepspeed"
    # validated: ZeRO-Offload's rules (FP32 accumulation) name the field in one line
    return TrainingSpec(**{**training.model_dump(exclude_unset=True), **t_up}), layout.model_copy(update=l_up)


def observation(measurement: LogMeasurement, model: ModelSpec, training: TrainingSpec | None = None,
                layout: Layout | None = None) -> Observation:
    """An Observation from a parsed log; training and layout come from the log's Megatron argument
    dump where it has one, else must be given (DeepSpeed's printed configuration then sets the
    batch, micro-batch, ZeRO stage and data-parallel size: deepspeed_setup)."""
    if measurement.config and not measurement.args and training is not None and layout is not None:
        training, layout = deepspeed_setup(measurement.config, training, layout, measurement.source)
        layout = Layout.load(layout.model_dump(), f"{measurement.source} (DeepSpeed configuration)")
    if training is None or layout is None:
        if not measurement.args:
            raise LogError(f"{measurement.source}: the log has no argument dump ({measurement.framework}); "
                           "give the layout and workload (--tp, --pp, --dp, --micro-batch-size, --global-batch-size, "
                           "--seq-length, ...)")
        t, lay = megatron_setup(measurement.args, model, measurement.source)
        training, layout = training or t, layout or lay
    low = measurement.low_precision
    if low is not None and low.recipe is not None and "fp8" not in training.model_fields_set:
        # the recipe the log's converters name prices the run unless the workload says otherwise
        training = TrainingSpec(**{**training.model_dump(exclude_unset=True), "fp8": low.recipe})
    if low is not None and (why := low.problem(training.fp8, model.moe is not None)):
        raise LogError(f"{measurement.source}: {why}")
    step = measurement.step_time_s(training.global_batch_size, training.seq_length, layout.world_size)
    return Observation(measurement.source, model, training, layout, step, measurement.peak_memory_bytes,
                       _cuda_graph_impl(measurement.args or {}), eager=measurement.compiled is False)


def _cuda_graph_impl(args: dict[str, str]) -> str | None:
    """The CUDA graphs a Megatron run captured, from its printed arguments: cuda_graph_impl ('local',
    'transformer_engine'), or the flags it replaced (--enable-cuda-graph, --external-cuda-graph), which
    Megatron turns into it [megatron/training/arguments.py: validate_args]; None where none."""
    impl = args.get("cuda_graph_impl")
    if impl not in (None, "None", "none"):
        return impl
    if args.get("enable_cuda_graph") == "True":
        return "local"
    if args.get("external_cuda_graph") == "True":
        return "transformer_engine"
    return None


@dataclass(frozen=True)
class RunFit:
    """One run before and after calibration (and left out of the fit, when there are several)."""

    label: str
    measured_s: float
    before_s: float
    after_s: float
    left_out_s: float | None
    measured_peak: float | None
    before_peak: float
    after_peak: float


@dataclass(frozen=True)
class CalibrationResult:
    """The calibrated cluster and what the fit did."""

    cluster: ClusterSpec
    factors: dict[str, float]
    overhead_before: float
    overhead_after: float
    runs: tuple[RunFit, ...]
    error: PredictionError
    notes: tuple[str, ...] = field(default=())

    def median_error(self, which: str) -> float | None:
        """Median |predicted / measured − 1| of step time: which = 'before', 'after' or 'left_out'."""
        vals = [abs(getattr(r, f"{which}_s") / r.measured_s - 1) for r in self.runs
                if getattr(r, f"{which}_s") is not None]
        return statistics.median(vals) if vals else None


def _predict(cluster: ClusterSpec, obs: Observation, factors: dict[str, float], overhead: float | None = None) -> Plan:
    c = apply_factors(cluster, factors, overhead).model_copy(update={"num_nodes": obs.nodes(cluster)})
    try:
        return evaluate(obs.model, c, obs.training, obs.layout)
    except PlannerError as err:
        raise PlannerError(f"{obs.label}: {err}") from None


def _fit_factors(cluster: ClusterSpec, runs: Sequence[Observation], starts: Sequence[dict[str, float]] = START_POINTS,
                 parameters: Sequence[Parameter] = PARAMETERS) -> dict[str, float]:
    """MAP factors by Levenberg-Marquardt in log space (numerical Jacobian, steps of at most 0.2 in
    ln factor), from each of `starts`, keeping the lowest objective: the model has kinks (a
    collective turns NVLink-bound as the NIC bandwidth rises) that trap a single descent."""
    prior = np.array([p.prior_sigma for p in parameters])
    meas = np.log([r.step_time_s for r in runs])

    def values(zv: np.ndarray) -> dict[str, float]:
        return {p.name: p.value(float(z)) for p, z in zip(parameters, zv)}

    def residuals(zv: np.ndarray) -> np.ndarray:
        pred = np.log([_predict(cluster, r, values(zv)).step_time_s for r in runs])
        return np.concatenate([(pred - meas) / MEASUREMENT_SIGMA, zv / prior])

    best = None
    for start in starts:
        z, cost = _descend(residuals, np.array([p.variable(start.get(p.name, p.value(0.0))) for p in parameters]))
        if best is None or cost < best[1]:
            best = (z, cost)
    return values(best[0])


def _descend(residuals, z: np.ndarray) -> tuple[np.ndarray, float]:
    res, lam, h = residuals(z), 1e-3, 1e-4
    cost = float(res @ res)
    for _ in range(100):
        jac = np.stack([(residuals(z + h * e) - residuals(z - h * e)) / (2 * h) for e in np.eye(len(z))], axis=1)
        jtj, g = jac.T @ jac, jac.T @ res
        while lam < 1e8:
            step = np.clip(np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-9), -g), -0.2, 0.2)
            trial = residuals(z + step)
            if float(trial @ trial) < cost:
                lam = max(lam / 10, 1e-7)
                break
            lam *= 10
        else:
            break
        z, res, cost = z + step, trial, float(trial @ trial)
        if np.max(np.abs(step)) < 1e-6:
            break
    return z, cost


def _fit_overhead(cluster: ClusterSpec, runs: Sequence[Observation], factors: dict[str, float]) -> float:
    """MAP memory overhead: normal prior at the catalog's, each measured peak one normal observation."""
    prec, total = 1 / OVERHEAD_PRIOR_SIGMA**2, cluster.memory_overhead / OVERHEAD_PRIOR_SIGMA**2
    for r in runs:
        if r.peak_memory_bytes is None:
            continue
        ledger = _predict(cluster, r, factors, overhead=0.0).peak_memory_bytes
        prec += 1 / MEMORY_MEASUREMENT_SIGMA**2
        total += (r.peak_memory_bytes - ledger) / MEMORY_MEASUREMENT_SIGMA**2
    return max(0.0, total / prec)


def _error_after(cluster: ClusterSpec, training: TrainingSpec, runs: Sequence[RunFit]) -> PredictionError:
    """The spread claimed after calibration: leave-one-run-out residuals when there are three or more
    runs, never below CALIBRATED_SIGMA_FLOOR."""
    lo = [math.log(r.measured_s / r.left_out_s) for r in runs if r.left_out_s is not None]
    sigma = CALIBRATED_SIGMA_FLOOR.step_time_sigma
    basis = f"calibrated on {len(runs)} log{'s' if len(runs) > 1 else ''}"
    if len(lo) >= 3:
        sigma = max(sigma, math.sqrt(sum(x * x for x in lo) / len(lo)))
        basis += f"; leave-one-run-out spread {sigma:.3f}"
    mem = [math.log(r.measured_peak / r.after_peak) for r in runs if r.measured_peak]
    if mem:
        msigma = max(CALIBRATED_SIGMA_FLOOR.memory_sigma, math.sqrt(sum(x * x for x in mem) / len(mem)))
    else:  # no memory measured: the published spread stands (the dense runs': no MoE or FP8 run publishes a peak)
        msigma = prediction_error(cluster, training, None).memory_sigma
    # two layouts on the calibrated cluster still differ by the model's error across layouts
    return PredictionError(step_time_sigma=min(2.0, sigma), ranking_sigma=min(2.0, sigma),
                           memory_sigma=min(2.0, msigma), basis=basis)


def calibrate(cluster: ClusterSpec, runs: Sequence[Observation],
              parameters: Sequence[Parameter] = PARAMETERS) -> CalibrationResult:
    """Fit the cluster's physical parameters (all of PARAMETERS, or those given; the rest keep the
    cluster's values) to measured runs (see the module doc).

    Returns:
        The calibrated cluster (provenance names the runs; prediction_error set from the fit's
        leave-one-run-out residuals) and, per run, the step time before, after and left out.

    Raises:
        PlannerError: no runs, a run that does not fit on the cluster's GPUs per node, or a
            layout the planner rejects (named).
    """
    if not runs:
        raise PlannerError("calibrate: give at least one training log")
    factors = _fit_factors(cluster, runs, parameters=parameters)
    overhead = _fit_overhead(cluster, runs, factors)
    left_out: list[float | None] = [None] * len(runs)
    if len(runs) > 1:
        for i in range(len(runs)):
            rest = [r for j, r in enumerate(runs) if j != i]
            left_out[i] = _predict(cluster, runs[i], _fit_factors(cluster, rest, (factors,), parameters)).step_time_s
    fits = []
    for r, lo in zip(runs, left_out):
        before, after = _predict(cluster, r, {}), _predict(cluster, r, factors, overhead)
        fits.append(RunFit(r.label, r.step_time_s, before.step_time_s, after.step_time_s, lo, r.peak_memory_bytes,
                           before.peak_memory_bytes, after.peak_memory_bytes))
    error = _error_after(cluster, runs[0].training, fits)
    calibrated = apply_factors(cluster, factors, overhead)
    names = ", ".join(r.label for r in runs)
    provenance = dict(cluster.provenance)
    for key in ("calibration.gemm_efficiency", "calibration.gemm_efficiency_fp8", "calibration.attention_efficiency", "calibration.attention_efficiency_unfused",
                "calibration.tp_comm_exposed", "calibration.mamba_scan_efficiency", "calibration.ep_comm_speed",
                "calibration.moe_host_stall", "calibration.grouped_gemm_call", "calibration.dp_overlap",
                "scaleout.nic_busbw", "memory_overhead",
                "prediction_error"):
        provenance[key] = f"planner calibrate on {names} (catalog: {cluster.name}); was: {provenance.get(key, 'catalog')}"
    moe_models = tuple(sorted({r.model.name for r in runs if r.model.moe is not None}))
    cal = calibrated.calibration  # the MoE models it now follows (planner.evaluate warns for the others)
    calibrated = calibrated.model_copy(update={
        "calibration": cal.model_copy(update={"moe_fitted_on": moe_models}) if moe_models else cal,
        "prediction_error": error, "provenance": provenance, "name": f"{cluster.name}-calibrated"})
    notes = [f"{r.label}: captured CUDA graphs (cuda_graph_impl {r.cuda_graphs}), which the planner's Megatron "
             "launches do not; its MoE host stall (moe_stall) is not the one they pay, nor, where the graphs hold the "
             "experts, the host's floor under their grouped GEMMs (expert_call), so plan from runs without them"
             for r in runs if r.cuda_graphs and r.model.moe is not None]
    notes += [f"{r.label}: torchtitan ran its blocks eager (the log builds the model but never compiles it); the "
              "planner prices the compiled blocks its torchtitan launches run, so this calibration reads the cluster "
              "slower than they will run (eager steps took 16 % longer at the same layout, 5,762 against 6,667 tokens/s/GPU: "
              "torchtitan benchmarks/llama3_h100_202412_torchtitan.md); calibrate on a run with --compile.enable"
              for r in runs if r.eager]
    if moe_models:
        notes.append(f"fitted on the MoE model{'s' if len(moe_models) > 1 else ''} {', '.join(moe_models)}: plan "
                     f"{'them' if len(moe_models) > 1 else 'it'} with this cluster; for another MoE model take the "
                     "catalog's, which predicted published runs better than a calibration on the same release's other "
                     "models (README, Mixture-of-Experts); evaluate and plan warn where it is used so")
    for p in parameters:
        if not p.moved(factors[p.name]):
            notes.append(f"{p.name}: not moved by these logs (kept the catalog value)")
    return CalibrationResult(calibrated, factors, cluster.memory_overhead, overhead, tuple(fits), error, tuple(notes))


CALIBRATED_MARKER = b"# written by planner calibrate"
"""First line of a calibrated cluster YAML (planner rewrites only files that carry it)."""


def calibrated_yaml(result: CalibrationResult) -> str:
    """The calibrated cluster as YAML that load_cluster reads (SI numbers; provenance names the logs)."""
    import yaml

    head = [CALIBRATED_MARKER.decode(), f"# from {result.cluster.provenance.get('prediction_error', '')}",
            "# factors on the catalog values: " + ", ".join(f"{p.name} {p.shown(result.factors[p.name])}" for p in PARAMETERS
                                                             if p.name in result.factors)]
    return "\n".join(head) + "\n" + yaml.safe_dump(result.cluster.model_dump(mode="json"), sort_keys=False,
                                                  allow_unicode=False, width=200)


def calibrate_logs(model: ModelSpec, cluster: ClusterSpec, logs: Sequence, *, training: TrainingSpec | None = None,
                   layout: Layout | None = None) -> CalibrationResult:
    """planner.calibrate: fit `cluster` to training logs (paths, log text already parsed as
    LogMeasurement, or Observations). Logs without Megatron's argument dump take `training` and
    `layout` (layout.dp counts the GPUs of the run).

    Returns:
        A CalibrationResult: `.cluster` (calibrated ClusterSpec), per-run errors before/after/left out,
        the fitted factors and `.error` (the narrower prediction spread).
    """
    from pathlib import Path

    from planner.logs import read_log

    runs = []
    for item in logs:
        if isinstance(item, Observation):
            runs.append(item)
            continue
        m = read_log(item) if isinstance(item, (str, Path)) else item
        if not isinstance(m, LogMeasurement):
            raise PlannerError(f"logs: expected paths, LogMeasurement or Observation, got {type(item).__name__}")
        runs.append(observation(m, model, training, layout))
    return calibrate(cluster, runs)
