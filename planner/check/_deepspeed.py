"""DeepSpeed's own DeepSpeedConfig, run at the real world size (see check_deepspeed)."""

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
    import deepspeed.runtime.config as ds_config_module

    real = ds_config_module.dist
    ds_config_module.dist = _Dist(world)
    try:
        yield
    finally:
        ds_config_module.dist = real


def validate(config, world_size: int, *, tp: int = 1, pp: int = 1, sp: int = 1) -> CheckResult:
    """DeepSpeedConfig(config, mpu) at world_size, then the pipeline engine's ZeRO rule."""
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
    details = {"world_size": world_size, "tp": tp, "pp": pp, "dp": world_size // (tp * pp * sp),
               "train_batch_size": cfg.train_batch_size, "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
               "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "zero_stage": stage}
    return CheckResult(True, "done", "", details)
