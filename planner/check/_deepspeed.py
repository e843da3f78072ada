"""DeepSpeed's own DeepSpeedConfig, run at the real world size, and its engine's choice of optimizer
wrapper (see check_deepspeed)."""

from __future__ import annotations

import os
from contextlib import contextmanager

from planner.check import CheckResult


class _Dist:
    """A stand-in for deepspeed.comm during the config call: rank 0 of `world` ranks."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_rank(self, group=None) -> int:
        return 0

    def get_world_size(self, group=None) -> int:
        return self.world


class _Mpu:
    """Megatron-DeepSpeed's model-parallel unit, as far as DeepSpeedConfig asks it."""

    def __init__(self, world: int, tp: int, pp: int, sp: int) -> None:
        self.world, self.tp, self.pp, self.sp = world, tp, pp, sp

    def get_data_parallel_world_size(self) -> int:
        return self.world // (self.tp * self.pp * self.sp)

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp

    def get_sequence_parallel_world_size(self) -> int:
        return self.sp


@contextmanager
def _standin_dist(world: int):
    """deepspeed.comm replaced by _Dist in the modules the config and the optimizer check ask."""
    import deepspeed.runtime.config as ds_config_module
    import deepspeed.runtime.zero.utils as ds_zero_utils

    modules = (ds_config_module, ds_zero_utils)
    real = [m.dist for m in modules]
    for m in modules:
        m.dist = _Dist(world)
    try:
        yield
    finally:
        for m, d in zip(modules, real):
            m.dist = d


def _optimizer_wrapper(cfg, pp: int) -> str:
    """The optimizer wrapper DeepSpeed's engine builds for this config: its own
    DeepSpeedEngine._do_optimizer_sanity_check, run on an engine that holds only the parsed config
    (and whether DeepSpeed's pipeline engine runs it); raises what DeepSpeed raises."""
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    torch.nn.Module.__init__(engine)
    engine._config, engine.pipeline_parallelism, engine.global_rank = cfg, pp > 1, 0
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    return str(DeepSpeedEngine._do_optimizer_sanity_check(engine, adam))


def _stage_layers(num_layers: int, pp: int) -> list[int]:
    """Decoder layers per stage as DeepSpeed's own partitioner cuts Megatron-DeepSpeed's GPTModelPipe
    (PipelineModule._partition_layers with 'type:transformer' over deepspeed_engine.pipe_spec_weights;
    runtime/utils.py partition_balanced)."""
    from deepspeed.runtime.utils import partition_balanced

    from planner.deepspeed_engine import pipe_spec_weights

    weights = pipe_spec_weights(num_layers)
    parts = partition_balanced(weights=weights, num_parts=pp)
    return [sum(weights[a:b]) for a, b in zip(parts, parts[1:])]


def validate(config, world_size: int, *, tp: int = 1, pp: int = 1, sp: int = 1,
             num_layers: int | None = None) -> CheckResult:
    """DeepSpeedConfig(config, mpu) at world_size, then the pipeline engine's ZeRO rule; with
    num_layers and pp > 1, the decoder layers per stage its partitioner places (details)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as e:
        return CheckResult(False, "import", f"deepspeed is not installed ({e}); pip install 'planner[validate]'")
    if world_size % (tp * pp * sp):
        return CheckResult(False, "config", f"world_size({world_size}) % (tp({tp})*pp({pp})*sp({sp})) != 0")
    try:
        with _standin_dist(world_size):
            cfg = DeepSpeedConfig(config, mpu=_Mpu(world_size, tp, pp, sp))
    except Exception as e:  # DeepSpeed's own rejection (batch rule, pydantic models, removed keys, ...)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return CheckResult(False, "config", f"{type(e).__name__}: {first}")
    stage = int(cfg.zero_optimization_stage)
    if pp > 1 and stage > 1:  # re-stated from deepspeed/runtime/pipe/engine.py (PipelineEngine.__init__)
        return CheckResult(False, "pipeline_engine", f"ZeRO-{stage} is incompatible with pipeline parallelism (pp={pp})")
    try:
        with _standin_dist(world_size):
            wrapper = _optimizer_wrapper(cfg, pp)
    except Exception as e:  # e.g. 'unsupported mix of model_dtype and grad_accum_dtype'
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return CheckResult(False, "optimizer", f"{type(e).__name__}: {first}")
    details = {"world_size": world_size, "tp": tp, "pp": pp, "dp": world_size // (tp * pp * sp),
               "train_batch_size": cfg.train_batch_size, "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
               "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "zero_stage": stage,
               "optimizer_wrapper": wrapper}
    if num_layers is not None and pp > 1:
        details["stage_layers"] = _stage_layers(num_layers, pp)
    return CheckResult(True, "done", "", details)
