"""Worker: reads batches of Megatron payloads on stdin, one JSON object per line ({"env": the
caller's environment, "payloads": [...]}), and prints one JSON verdict per payload, a line each, in
input order; it serves batches until stdin closes.

Imports Megatron once (then prints READY), and forks a child per configuration so each starts from
clean global state (Megatron keeps its arguments, calculators and process groups in module globals).
"""

from __future__ import annotations

import gc
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stdout

CLEARED_ENV = ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN")


def _setup() -> None:
    path = os.environ.get("MEGATRON_PATH")
    if path:
        sys.path.insert(0, path)
    from planner.check._cpu_shims import assume_transformer_engine, install_shims

    install_shims()
    import megatron.training.arguments  # noqa: F401

    assume_transformer_engine()
    gc.freeze()  # the children share the imported modules; freezing keeps the GC from touching them


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "megatron" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f" [{f.filename.split('megatron/', 1)[-1]}:{f.lineno}]"


def _validate(p: dict) -> dict:
    import megatron.training.arguments as A

    for k in CLEARED_ENV:
        os.environ.pop(k, None)
    os.environ.update({"WORLD_SIZE": str(p["world_size"]), "RANK": "0", "LOCAL_RANK": "0", **p.get("env", {})})
    arch = int(p.get("gpu_arch", 9))
    A.get_device_arch_version = lambda: arch  # the target GPU's architecture (this CPU has none)
    A.torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)  # --moe-grouped-gemm asks torch directly
    stage = "argparse"
    try:
        with redirect_stdout(io.StringIO()):
            sys.argv = ["pretrain_gpt.py", *p["args"]]
            try:
                args = A.parse_args()
            except SystemExit as e:
                return {"ok": False, "stage": stage, "message": f"argparse rejected the arguments (exit {e.code})"}
            stage = "validate_args"
            A.validate_args(args)
            stage = "microbatches"
            from megatron.core.num_microbatches_calculator import get_num_microbatches, init_num_microbatches_calculator

            init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                             args.data_parallel_size, False)
            m = get_num_microbatches()
            stage = "model_config"
            from megatron.training.arguments import core_transformer_config_from_args

            cfg = core_transformer_config_from_args(args)
            stage = "groups"
            import torch.distributed as dist
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=args.world_size)
            from megatron.core import parallel_state as ps

            vpp = args.virtual_pipeline_model_parallel_size
            ps.initialize_model_parallel(
                tensor_model_parallel_size=args.tensor_model_parallel_size,
                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=vpp,
                context_parallel_size=args.context_parallel_size,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                create_gloo_process_groups=False,
            )
            expert = {"ep": ps.get_expert_model_parallel_world_size(), "etp": ps.get_expert_tensor_parallel_world_size(),
                      "edp": ps.get_expert_data_parallel_world_size()}
            stage = "layer_split"
            from megatron.core.transformer.transformer_block import get_num_layers_to_build

            from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank

            split, mtp_ranks = [], []
            for r in range(args.pipeline_model_parallel_size):
                ps.set_pipeline_model_parallel_rank(r)
                split.append([get_num_layers_to_build(cfg, vp_stage=v if vpp else None) for v in range(vpp or 1)])
                # the ranks that build the MTP depths, by Megatron's own rule (layout, else the last stage)
                if cfg.mtp_num_layers and mtp_on_this_rank(cfg.pipeline_model_parallel_layout, cfg.mtp_num_layers):
                    mtp_ranks.append(r)
            hybrid = None
            if getattr(args, "hybrid_layer_pattern", None):  # a hybrid stack's layers per rank, by its own rule
                split, hybrid = _hybrid_split(args, vpp)
            stage = "attention"  # which layers Megatron windows, by its own rule
            from megatron.core.transformer.utils import is_layer_window_attention

            windowed = sum(is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, n)
                           for n in range(1, cfg.num_layers + 1))
            stage = "schedule_rule"
            pp = args.pipeline_model_parallel_size
            # Re-stated from pipeline_parallel/schedules.py (raised only at the first training step):
            # the interleaved schedule needs num_microbatches a multiple of pp (group size defaults to pp).
            if vpp and (m < pp or m % pp):
                return {"ok": False, "stage": stage,
                        "message": f"interleaved schedule: num_microbatches ({m}) must be a multiple of pp ({pp})"}
    except Exception as e:  # a rejection by Megatron's own checks
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{_where(e)}"
        return {"ok": False, "stage": stage, "message": msg}
    details = {"world_size": args.world_size, "tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
               "cp": args.context_parallel_size, "dp": args.data_parallel_size, "vpp": vpp,
               "sequence_parallel": bool(args.sequence_parallel), "micro_batch_size": args.micro_batch_size,
               "global_batch_size": args.global_batch_size, "num_microbatches": m,
               "recompute_granularity": args.recompute_granularity, "layers_per_rank": split,
               # a hybrid model's layer symbols on each rank's virtual stages (None for GPTModel)
               "hybrid_layers": hybrid,
               "mamba": [cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_dim, cfg.mamba_num_groups]
               if hybrid is not None else None,
               "position_embedding_type": args.position_embedding_type, "spec": args.spec,
               "recompute_modules": sorted(cfg.recompute_modules or []) if args.recompute_granularity == "selective" else None,
               "num_experts": args.num_experts, "moe_router_topk": args.moe_router_topk if args.num_experts else None,
               # 1 for an MoE layer, as TransformerConfig holds it (an int: every n-th from layer 0)
               "moe_layer_freq": (list(cfg.moe_layer_freq) if isinstance(cfg.moe_layer_freq, list) else cfg.moe_layer_freq)
               if args.num_experts else None,
               **expert,
               # what TransformerConfig will run the linear layers with (None: BF16/FP16)
               "fp8": cfg.fp8, "fp8_recipe": str(cfg.fp8_recipe) if cfg.fp8 else None,
               "fp8_param": bool(getattr(cfg, "fp8_param", False)),
               # the attention core in FP8 (handed to the recipe as fp8_dpa: fp8_utils.get_fp8_recipe)
               "fp8_dot_product_attention": bool(getattr(cfg, "fp8_dot_product_attention", False)),
               "fp4": getattr(cfg, "fp4", None),
               "fp4_recipe": str(cfg.fp4_recipe) if getattr(cfg, "fp4", None) else None,
               "reuse_grad_buf_for_mxfp8_param_ag": bool(getattr(args, "reuse_grad_buf_for_mxfp8_param_ag", False)),
               # the layers TransformerConfig keeps in BF16 under the recipe (fp8_utils.get_fp8_context)
               "bf16_end_layers": [cfg.num_layers_at_start_in_bf16, cfg.num_layers_at_end_in_bf16]
               if getattr(cfg, "first_last_layers_bf16", False) else None,
               # the layer as TransformerConfig builds it: windows, sinks, biases, the MLP's activation
               "window_size": list(cfg.window_size) if cfg.window_size else None, "windowed_layers": windowed,
               "softmax_type": cfg.softmax_type, "add_bias_linear": bool(cfg.add_bias_linear),
               "hidden_dropout": cfg.hidden_dropout, "attention_dropout": cfg.attention_dropout,
               "activation": getattr(cfg.activation_func, "__name__", str(cfg.activation_func)),
               "gated_linear_unit": bool(cfg.gated_linear_unit), "glu_linear_offset": cfg.glu_linear_offset,
               "activation_func_clamp_value": cfg.activation_func_clamp_value,
               # the loss GPTModel computes (language_module.py: compute_language_model_loss)
               "cross_entropy": (cfg.cross_entropy_fusion_impl if cfg.cross_entropy_loss_fusion else "unfused"),
               "overlap_moe_expert_parallel_comm": bool(getattr(cfg, "overlap_moe_expert_parallel_comm", False)),
               "moe_shared_expert_gate": bool(getattr(cfg, "moe_shared_expert_gate", False)),
               "moe_router_num_groups": getattr(cfg, "moe_router_num_groups", None),
               "mtp_num_layers": getattr(cfg, "mtp_num_layers", None), "mtp_ranks": mtp_ranks,
               "mtp_use_repeated_layer": bool(getattr(cfg, "mtp_use_repeated_layer", False)),
               # a hybrid model's MTP depth as HybridModel parses it from the unified pattern ('main/*E/*E')
               "hybrid_mtp": _hybrid_mtp(args) if hybrid is not None else None,
               "moe_latent_size": getattr(cfg, "moe_latent_size", None),
               "moe_token_dispatcher_type": getattr(cfg, "moe_token_dispatcher_type", None),
               # token dropping as the router and dispatcher read it (moe_utils.get_capacity)
               "moe_expert_capacity_factor": getattr(cfg, "moe_expert_capacity_factor", None),
               "moe_pad_expert_input_to_capacity": bool(getattr(cfg, "moe_pad_expert_input_to_capacity", False)),
               "moe_router_group_topk": getattr(cfg, "moe_router_group_topk", None),
               "moe_shared_expert_intermediate_size": getattr(cfg, "moe_shared_expert_intermediate_size", None),
               # Adam state dtypes as validate_args mapped them (OptimizerConfig reads the same args)
               "precision_aware_optimizer": bool(args.use_precision_aware_optimizer),
               "exp_avg_dtype": str(args.exp_avg_dtype), "exp_avg_sq_dtype": str(args.exp_avg_sq_dtype),
               # HybridDeviceOptimizer's arguments as validate_args left them
               "optimizer_cpu_offload": bool(getattr(args, "optimizer_cpu_offload", False)),
               "optimizer_offload_fraction": getattr(args, "optimizer_offload_fraction", None),
               "overlap_cpu_optimizer_d2h_h2d": bool(getattr(args, "overlap_cpu_optimizer_d2h_h2d", False))}
    return {"ok": True, "stage": "done", "message": "", "details": details}


def _hybrid_mtp(args) -> list:
    """[depth pattern, depths] of a hybrid pattern's MTP part (parse_hybrid_pattern; [None, 0] without)."""
    from megatron.core.models.hybrid.hybrid_layer_allocation import parse_hybrid_pattern

    parsed = parse_hybrid_pattern(args.hybrid_layer_pattern)
    return [parsed.mtp_pattern, parsed.mtp_num_depths]


def _hybrid_split(args, vpp) -> tuple[list[list[int]], list[list[str]]]:
    """Layer counts and symbols of each pipeline rank's virtual stages as HybridModel selects them
    (megatron-core models/hybrid/hybrid_layer_allocation.py: select_pipeline_segment, which asks torch for
    the rank and size of the pipeline group: answered per rank here, as the fake group has one rank)."""
    import torch.distributed as dist
    from megatron.core.models.hybrid.hybrid_layer_allocation import parse_hybrid_pattern, select_pipeline_segment

    main = parse_hybrid_pattern(args.hybrid_layer_pattern).main_pattern
    pp, asked = args.pipeline_model_parallel_size, (dist.get_rank, dist.get_world_size)
    symbols = []
    try:
        for r in range(pp):
            dist.get_rank = lambda group=None, r=r: r
            dist.get_world_size = lambda group=None: pp
            symbols.append(["".join(select_pipeline_segment(
                main, object(), v if vpp else None, args.decoder_first_pipeline_num_layers,
                args.decoder_last_pipeline_num_layers)[0]) for v in range(vpp or 1)])
    finally:
        dist.get_rank, dist.get_world_size = asked
    return [[len(x) for x in row] for row in symbols], symbols


def _start(p: dict, env: dict) -> tuple[int, int]:
    """Fork a child that validates one configuration in the caller's environment `env` and writes
    its result to a pipe: (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: validate one configuration, report, exit without cleanup
        os.close(r)
        # Megatron's prints and logs go to the worker's stderr, never onto the verdict stream: children
        # run side by side, and a line one of them wrote there could land inside another's verdict
        os.dup2(2, 1)
        os.environ.clear()
        os.environ.update(env)
        try:
            out = _validate(p)
        except BaseException as e:  # noqa: BLE001 - report anything, never hang the parent
            out = {"ok": False, "stage": "worker", "message": f"{type(e).__name__}: {e}"}
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(w)
    return pid, r


def _finish(pid: int, r: int) -> str:
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return data if data else json.dumps({"ok": False, "stage": "worker", "message": "the child died"})


READY = "READY"
VERDICT = "VERDICT "
"""Prefixes each result line: Megatron's own prints on stdout are other lines."""


def _verdict(text: str) -> None:
    """One result line on stdout, written in one call (flushing what Python buffered first)."""
    sys.stdout.flush()
    data = (VERDICT + text + "\n").encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data):]


def main() -> int:
    """Per input line (a batch): one result line per configuration, in input order; as many
    children at a time as there are CPUs."""
    from planner._cpus import usable_cpus

    _setup()
    _verdict(READY)
    width = max(1, min(usable_cpus(), 8))
    for line in sys.stdin:
        batch = json.loads(line)
        running: list[tuple[int, int]] = []
        for p in batch["payloads"]:
            if len(running) == width:
                _verdict(_finish(*running.pop(0)))
            running.append(_start(p, batch["env"]))
        for child in running:
            _verdict(_finish(*child))
    return 0


if __name__ == "__main__":
    sys.exit(main())
