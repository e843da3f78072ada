"""torchtitan 0.3's own config manager and parallel-dims check (see check_torchtitan)."""

from __future__ import annotations

import contextlib
import io
import sys

from planner.check import CheckResult


@contextlib.contextmanager
def _importable(folder: str | None, module: str):
    """`folder` (an emitted launch folder with the job module) first on sys.path, and `module`
    imported afresh from it, for the call."""
    if folder is None:
        yield
        return
    sys.path.insert(0, folder)
    sys.modules.pop(module, None)
    try:
        yield
    finally:
        sys.path.remove(folder)
        sys.modules.pop(module, None)


@contextlib.contextmanager
def _hopper_standin():
    """The float8 converters refuse a machine without SM 8.9+, the MXFP8 ones without SM 10.0, when they
    are built (the config function builds them); the parse runs on a CPU, so each module's capability
    check answers as the GPU its converters need would (Hopper for float8, Blackwell for MXFP8: the
    planner has checked the plan's GPU, space.FP8_ARCHS)."""
    import torchtitan.components.quantization.float8 as f8
    import torchtitan.components.quantization.mx as mx

    real = f8.has_cuda_capability, mx.has_cuda_capability
    f8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)
    mx.has_cuda_capability = lambda major, minor: (10, 0) >= (major, minor)
    try:
        yield
    finally:
        f8.has_cuda_capability, mx.has_cuda_capability = real


def _float8_linears(model_cfg) -> tuple[list[str], list[str]]:
    """(low-precision, high-precision) linear FQNs of a parsed model config: torchao's Float8Linear or
    MXFP8Linear, else the model dtype's."""
    from torchtitan.components.quantization.float8 import Float8Linear
    from torchtitan.components.quantization.mx import MXFP8Linear
    from torchtitan.models.common.linear import Linear

    low = tuple(cls.Config for cls in (Float8Linear, MXFP8Linear) if cls is not None)
    fp8, hp = [], []
    for fqn, lin, _, _ in model_cfg.traverse(Linear.Config):
        (fp8 if isinstance(lin, low) else hp).append(fqn)
    return fp8, hp


def validate(overrides: list[str], world_size: int, *, module: str = "llama3", config: str = "llama3_8b",
             num_layers: int | None = None, folder: str | None = None) -> CheckResult:
    """ConfigManager.parse_args (tyro parsing + torchtitan's config validation), ParallelDims at
    world_size, and the pipeline torchtitan derives: its stage count (_get_pipeline_metadata) and
    the decoder layers it puts on each stage (_generate_llm_fqn_per_model_part), for a model of
    num_layers layers (else the registry config's depth). With `folder`, its planner_job.py is
    importable (an FP8 plan's --module): details list the linears torchtitan converted to float8."""
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
                with _importable(folder, module), _hopper_standin():
                    cfg = ConfigManager().parse_args(["--module", module, "--config", config, *overrides])
            except SystemExit as e:
                said = [ln.strip(" │╭╮╰╯─") for ln in err.getvalue().splitlines()]
                said = [ln for ln in said if ln and "helptext" not in ln and not ln.startswith(("Value error", "Parsing error"))]
                return CheckResult(False, stage, f"torchtitan's parser rejected the overrides (exit {e.code})"
                                   + (f": {said[0]}" if said else ""))
            stage = "parallel_dims"
            dims = ParallelDims.from_config(cfg.parallelism, world_size)
            efsdp = None
            if dims.ep > 1:
                stage = "mesh"
                efsdp = _expert_mesh(dims)
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
               "cp": p.context_parallel_degree, "sequence_parallel": p.enable_sequence_parallel, "local_batch_size": cfg.training.local_batch_size,
               "seq_len": cfg.training.seq_len, "virtual_stages": stages, "stage_layers": stage_layers}
    if cfg.model_spec is not None:
        fp8, hp = _float8_linears(cfg.model_spec.model)
        details["float8_linears"], details["high_precision_linears"] = len(fp8), hp
        details |= _experts(cfg.model_spec.model)
    details["ep"], details["efsdp"] = p.expert_parallel_degree, efsdp
    return CheckResult(True, "done", "", details)


def _expert_mesh(dims) -> int:
    """Build torchtitan's device meshes in a fake process group of the world's size (its own
    ParallelDims.build_mesh: the sparse mesh efsdp x ep must cover dp_shard x cp x tp); the efsdp size."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; the mesh check needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    try:
        dims.build_mesh()
        return dims.get_optional_mesh(["efsdp"]).size()
    finally:
        dist.destroy_process_group()


def _experts(model_cfg) -> dict:
    """The routed experts of a parsed model config, as the plan's model names them (a dense model's shape and
    attention where it has none): MoE layers,
    experts, top-k, expert width, shared experts, and the attention shape around them (Q/K norm);
    and how many MoE layers run their experts in low-precision grouped GEMMs (the Float8<GroupedExperts> or
    MXFP8<GroupedExperts> modules of Float8GroupedExpertsConverter or MXFP8GroupedExpertsConverter)."""
    every = getattr(model_cfg, "layers", [])
    att = getattr(every[0], "attention", None) if every else None
    if att is None or not hasattr(model_cfg, "dim"):
        return {"moe_layers": 0}
    shape = {"num_layers": len(every), "dim": model_cfg.dim, "vocab_size": model_cfg.vocab_size,
             "n_heads": att.n_heads, "n_kv_heads": att.n_kv_heads, "head_dim": att.head_dim,
             "qk_norm": getattr(att, "qk_norm", None) is not None,
             "weight_tying": getattr(model_cfg, "enable_weight_tying", False)}
    layers = [layer for layer in every if getattr(layer, "moe", None) is not None]
    if not layers:  # a dense model: its shape and attention
        return {"moe_layers": 0, **shape}
    moe = layers[0].moe
    inner = moe.routed_experts.inner_experts
    return {"moe_layers": len(layers), **shape, "num_experts": inner.num_experts, "top_k": moe.router.top_k,
            "expert_hidden_dim": inner.hidden_dim, "shared_experts": getattr(moe, "shared_experts", None) is not None,
            "float8_expert_layers": sum(type(layer.moe.routed_experts.inner_experts)._owner.__name__.startswith(
                ("Float8", "MXFP8")) for layer in layers)}
