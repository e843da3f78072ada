"""torchtitan 0.3's own config manager and parallel-dims check (see check_torchtitan)."""

from __future__ import annotations

import contextlib
import io

from planner.check import CheckResult


def validate(overrides: list[str], world_size: int, *, module: str = "llama3", config: str = "llama3_8b",
             num_layers: int | None = None) -> CheckResult:
    """ConfigManager.parse_args (tyro parsing + torchtitan's config validation), ParallelDims at
    world_size, and the pipeline torchtitan derives: its stage count (_get_pipeline_metadata) and
    the decoder layers it puts on each stage (_generate_llm_fqn_per_model_part), for a model of
    num_layers layers (else the registry config's depth)."""
    from planner.check._cpu_shims import install_shims

    install_shims()  # torchtitan imports triton; a stand-in serves for parsing on a CPU
    try:
        from torchtitan.config.manager import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as e:
        return CheckResult(False, "import", f"torchtitan is not installed ({e}); pip install 'planner[validate]'")
    stage = "config"
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                cfg = ConfigManager().parse_args(["--module", module, "--config", config, *overrides])
            except SystemExit as e:
                said = [ln.strip(" │╭╮╰╯─") for ln in err.getvalue().splitlines()]
                said = [ln for ln in said if ln and "helptext" not in ln and not ln.startswith(("Value error", "Parsing error"))]
                return CheckResult(False, stage, f"torchtitan's parser rejected the overrides (exit {e.code})"
                                   + (f": {said[0]}" if said else ""))
            stage = "parallel_dims"
            dims = ParallelDims.from_config(cfg.parallelism, world_size)
            stage = "pipeline"
            stages, stage_layers = None, None
            if dims.pp > 1:
                from types import SimpleNamespace

                from torchtitan.distributed.pipeline_parallel import (_generate_llm_fqn_per_model_part,
                                                                      _get_pipeline_metadata)

                model_cfg = cfg.model_spec.model if cfg.model_spec is not None else None
                if num_layers is not None:  # the plan's model: only its depth is read
                    model_cfg = SimpleNamespace(layers=[None] * num_layers)
                stages, depth, first, last = _get_pipeline_metadata(dims, cfg.parallelism, model_cfg)
                parts = _generate_llm_fqn_per_model_part(stages, depth, first, last)
                stage_layers = [sum(name.startswith("layers.") for name in part) for part in parts]
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return CheckResult(False, stage, f"{type(e).__name__}: {first}")
    p = cfg.parallelism
    details = {"world_size": world_size, "dp_replicate": p.data_parallel_replicate_degree,
               "dp_shard": p.data_parallel_shard_degree, "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree,
               "cp": p.context_parallel_degree, "local_batch_size": cfg.training.local_batch_size,
               "seq_len": cfg.training.seq_len, "virtual_stages": stages, "stage_layers": stage_layers}
    return CheckResult(True, "done", "", details)
