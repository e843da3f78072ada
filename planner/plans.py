"""evaluate(): the memory ledger and the step time of one layout, as a Plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from planner.cost import (TIME_UNIT_S, PipelineTime, UpdateTime, mla_up_proj_flops, mlp_gemm_flops,
                          model_flops_per_token, op_recompute_gemm_flops, pipeline_time, update_time)
from planner.memory import STATIC_ITEMS, MemoryLedger, memory_ledger
from planner.space import check_layout, framework_layout
from planner.specs import ClusterSpec, Family, Layout, ModelSpec, Recompute, TrainingSpec, num_microbatches
from planner.topology import group_placement
from planner.torchtitan_engine import fuses_qkv, uses_torchtitan
from planner.uncertainty import Interval, interval, model_error, oom_risk, prediction_error

__all__ = ["Plan", "StepTime", "evaluate", "TIME_UNIT_S", "MEM_UNIT_BYTES"]

MEM_UNIT_BYTES = 2**20  # the search's integer memory unit (MiB)
TIE_Z = 1.2815515655446004  # the 80 % two-sided normal quantile


@dataclass(frozen=True)
class StepTime:
    """One iteration's time, term by term (seconds)."""

    pipeline: PipelineTime
    update: UpdateTime
    """The slowest rank's DP communication and optimizer step."""

    @property
    def dp_exposed(self) -> float:
        """Exposed DP communication (seconds) on the rank that finishes last."""
        return self.update.dp_exposed

    @property
    def optimizer(self) -> float:
        """Optimizer step (seconds) on the rank that finishes last."""
        return self.update.optimizer

    @property
    def total(self) -> float:
        """Seconds per step."""
        return self.pipeline.total + self.update.total

    @property
    def objective_us(self) -> int:
        """The search's integer objective in microseconds: the pipeline from the rounded per-rank coefficients
        (planner.cost.StageCoefficients) plus the slowest rank's update, rounded up.

        Both the CP-SAT model and the enumerator rank by this number (or-tools #3639: no floats).
        """
        return self.pipeline.units + self.update.units

    def breakdown(self) -> dict[str, float]:
        """Seconds per term over the whole step (the slowest stage's terms x m, plus the bubble)."""
        st, m = self.pipeline.slowest, self.pipeline.num_microbatches
        return {
            "compute": m * st.compute,
            "recompute": m * st.recompute,
            "tp_comm": m * st.tp_comm,
            "cp_comm": m * st.cp_comm,
            "ep_comm": m * st.ep_comm,
            "grad_accum": m * st.grad_accum,
            "pp_p2p": m * st.p2p,
            "pp_bubble": self.pipeline.bubble,
            "dp_comm": self.dp_exposed,
            "optimizer": self.optimizer,
        }


def _ceil_units(value: float, unit: float) -> int:
    # a relative epsilon keeps float noise (1.0000000001 units) from adding a unit
    return math.ceil(value / unit - 1e-9)


@dataclass(frozen=True)
class Plan:
    """A layout with its memory ledger and step time."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout
    memory: MemoryLedger
    time: StepTime
    warnings: tuple[str, ...] = field(default=())

    @property
    def step_time_s(self) -> float:
        """Seconds per optimizer step."""
        return self.time.total

    @property
    def num_gpus(self) -> int:
        """GPUs the layout occupies."""
        return self.layout.world_size

    @property
    def tokens_per_step(self) -> int:
        """Global batch x sequence length."""
        return self.training.global_batch_size * self.training.seq_length

    @property
    def tokens_per_second(self) -> float:
        """Training throughput, all GPUs."""
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs (no recompute, unmasked attention) over peak."""
        flops = model_flops_per_token(self.model, self.training.seq_length) * self.tokens_per_second
        return flops / (self.num_gpus * self.cluster.gpu.peak_bf16_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: adds the recomputed forward FLOPs [Korthikanti22 Eq. 8]."""
        extra = {Recompute.FULL: 1 / 3}.get(self.layout.recompute, 0.0)
        if self.layout.recompute == Recompute.FULL and self.layout.recompute_num_layers is not None:
            extra *= min(1.0, self.layout.recompute_num_layers * self.layout.pp / self.model.num_layers)
        if self.layout.recompute == Recompute.SELECTIVE:
            mods, m = self.layout.recomputed_modules, self.model
            if "core_attn" in mods:  # attention core: 4bs^2h of 72bsh^2(1 + s/6h) per layer
                s, h = self.training.seq_length, m.hidden_size
                extra = (s / (6 * h)) / (1 + s / (6 * h)) / 3
            # the GEMMs of the other modules (norms and activations are memory passes)
            again = (m.num_layers * sum(mla_up_proj_flops(m, 1, 1)) if "mla_up_proj" in mods and m.mla else 0.0)
            dense = m.dense_layers
            again += dense * sum(mlp_gemm_flops(m, 1, 1)) if "mlp" in mods and m.family != Family.GPT else 0.0
            extra += again / model_flops_per_token(m, self.training.seq_length)
        if self.layout.recompute == Recompute.OP:  # the linears it does not keep, once more forward
            extra = (self.model.num_layers * sum(op_recompute_gemm_flops(self.model, 1, 1, fuses_qkv(self.training)))
                     / model_flops_per_token(self.model, self.training.seq_length))
        return self.mfu * (1 + extra)

    @property
    def fits(self) -> bool:
        """Peak memory within the GPU, in the search's units (each part rounded up to MiB), and any
        offloaded optimizer states within host memory."""
        return self.memory_margin_units >= 0 and self.memory.host_fits

    @property
    def memory_margin_units(self) -> int:
        """Capacity minus the worst stage, in MiB as the search counts it (static and the rest each
        rounded up, capacity rounded down)."""
        cap = int(self.memory.capacity // MEM_UNIT_BYTES)
        worst = 0
        for st in self.memory.stages:
            static = sum(i.bytes for i in st.items if i.name in STATIC_ITEMS)
            rest = st.total - static
            worst = max(worst, _ceil_units(static, MEM_UNIT_BYTES) + _ceil_units(rest, MEM_UNIT_BYTES))
        return cap - worst

    @property
    def peak_memory_bytes(self) -> float:
        """Peak bytes per GPU (worst stage, overhead included)."""
        return self.memory.peak_bytes

    @property
    def error_model(self):
        """The PredictionError these predictions carry (calibrated cluster, else published runs)."""
        return prediction_error(self.cluster, self.training, self.model)

    def step_time_interval(self, level: float = 0.8) -> Interval:
        """Where the measured step time falls with probability `level` (seconds)."""
        e = self.error_model
        return interval(self.step_time_s, e.step_time_bias, e.step_time_sigma, level)

    def memory_interval(self, level: float = 0.8) -> Interval:
        """Where the measured peak (max reserved) falls with probability `level` (bytes)."""
        e = self.error_model
        return interval(self.peak_memory_bytes, e.memory_bias, e.memory_sigma, level)

    @property
    def oom_risk(self) -> float:
        """Probability that the measured peak exceeds GPU memory."""
        return oom_risk(self.peak_memory_bytes, self.memory.capacity, self.error_model)

    def tied_with(self, other: Plan) -> bool:
        """True when the step times are too close to rank on this evidence: within 1.28 ranking
        sigmas (the 80 % interval of the ratio of the two measurements contains 1)."""
        sigma = max(self.error_model.ranking_sigma, other.error_model.ranking_sigma)
        return abs(math.log(self.step_time_s / other.step_time_s)) <= TIE_Z * sigma

    # Launch configurations (planner.emit; imported here on use, as a convenience for callers).
    def to_megatron(self):
        """Megatron-LM launch files (LaunchFiles with .write(folder))."""
        from planner.emit.megatron import to_megatron

        return to_megatron(self)

    def to_deepspeed(self):
        """DeepSpeed ds_config.json and launcher (LaunchFiles with .write(folder))."""
        from planner.emit.deepspeed import to_deepspeed

        return to_deepspeed(self)

    def to_torchtitan(self):
        """torchtitan overrides and TOML (LaunchFiles with .write(folder))."""
        from planner.emit.torchtitan import to_torchtitan

        return to_torchtitan(self)

    def time_to_train_s(self, tokens: float | None = None) -> float:
        """Seconds to train `tokens` (default: the training spec's token budget)."""
        tokens = tokens if tokens is not None else self.training.token_budget
        if tokens is None:
            raise ValueError("no token budget: pass tokens= or set TrainingSpec.token_budget")
        return tokens / self.tokens_per_second


def evaluate(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *, allow_idle: bool = False
) -> Plan:
    """Memory and step time of `layout`.

    Args:
        model, cluster, training: the problem.
        layout: the parallel layout to price.
        allow_idle: accept tp*pp*dp*cp < world size (idle GPUs).

    Returns:
        A Plan (memory ledger, step-time terms, throughput, MFU, warnings).

    On DeepSpeed's engine or torchtitan a pipeline whose stages do not divide the layers is priced
    with the split the engine computes (space.framework_layout; the Plan's layout carries it, a
    warning says so).

    Raises:
        InvalidLayout: the layout breaks a product or divisibility rule (with the arithmetic).
    """
    layout, filled = framework_layout(training, layout, model.num_layers)
    check_layout(model, cluster, training, layout, allow_idle=allow_idle)
    warnings = [filled] if filled else []
    tp_group = group_placement(cluster, layout, "tp")
    if tp_group.tier == "scaleout":
        warnings.append(f"tp({layout.tp}) leaves its NVLink domain ({cluster.nvlink_domain_size} GPUs): "
                        "TP traffic is priced at the scale-out bandwidth")
    led = memory_ledger(model, cluster, training, layout)
    time = StepTime(pipeline_time(model, cluster, training, layout), update_time(model, cluster, training, layout))
    plan = Plan(model, cluster, training, layout, led, time)
    if plan.memory_margin_units < 0:
        warnings.append(f"does not fit: peak {led.peak_bytes / 2**30:.1f} GiB on stage {led.peak_stage.stage} "
                        f"> {led.capacity / 2**30:.1f} GiB")
    if not led.host_fits:
        worst = max(range(len(led.host)), key=lambda i: led.host[i])
        warnings.append(f"does not fit: offloaded optimizer states {led.host[worst] / 2**30:.1f} GiB per GPU on stage "
                        f"{worst} > {led.host_capacity / 2**30:.1f} GiB of host memory per GPU")
    m = num_microbatches(training, layout)
    if m < layout.pp:
        warnings.append(f"only {m} micro-batches for pp({layout.pp}): the pipeline never fills")
    fitted_on = cluster.calibration.moe_fitted_on
    if model.moe is not None and fitted_on and model.name not in fitted_on:
        warnings.append(f"{cluster.name}'s calibration was fitted on the MoE logs of {', '.join(fitted_on)}, not "
                        f"{model.name}: its host floor and stall follow those models' expert GEMMs (the catalog's "
                        "cluster, or a calibration on this model's own logs, predicts it better)")
    own = model_error(cluster, training, model)
    if own is not None:
        warnings.append(f"a known miss: {own.basis}; this plan's intervals are built from those runs "
                        "(planner calibrate on logs of your own runs of it replaces them)")
    if uses_torchtitan(training) and training.document_tokens is None:
        warnings.append("torchtitan masks attention per packed document; priced causal over the whole sequence, an "
                        "upper bound (document_tokens: the documents' length)")
    return replace(plan, warnings=tuple(warnings))
