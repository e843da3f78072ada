"""DeepSpeed: ds_config.json and the `deepspeed` launcher command (Megatron-DeepSpeed arguments for TP/PP).

Keys as in DeepSpeed 0.19.8 (shared/reference/launch-configs.md §3.2). Rules: train_batch_size =
micro x GAS x DP with DP = world/(TP*PP); ZeRO-2/3 are rejected with DeepSpeed's pipeline engine;
DeepSpeed has no context parallelism or interleaved pipeline, so such plans are refused.
"""

from __future__ import annotations

import shlex

from planner.deepspeed_engine import (ALLGATHER_BUCKET_ELEMENTS, MAX_LIVE_PARAMETERS, MAX_REUSE_DISTANCE,
                                      PREFETCH_BUCKET_ELEMENTS, REDUCE_BUCKET_ELEMENTS, overlap_comm, pipeline_split)
from planner.emit import LaunchFiles, dump_json, refuse_megatron_only, refuse_other_engine, script_word
from planner.errors import PlannerError
from planner.plans import Plan
from planner.specs import Family, Recompute, num_microbatches

__all__ = ["ds_config", "to_deepspeed", "DEEPSPEED_VERSION"]

DEEPSPEED_VERSION = "deepspeed 0.19.8"


def _check(plan: Plan) -> None:
    lay = plan.layout
    refuse_megatron_only(plan, "DeepSpeed")
    if lay.rank_order != "tp-cp-dp-pp":
        raise PlannerError(f"DeepSpeed: rank order {lay.rank_order} is Megatron's --use-tp-pp-dp-mapping; not emitted here")
    if lay.recompute == Recompute.OP:
        raise PlannerError("DeepSpeed: recompute 'op' is torchtitan's per-op checkpointing; Megatron-DeepSpeed's "
                           "selective recompute is the attention core (plan with framework='deepspeed')")
    if lay.cp > 1:
        raise PlannerError(f"DeepSpeed: cp({lay.cp}) > 1 has no DeepSpeed equivalent; plan with framework='deepspeed'")
    if lay.vpp > 1:
        raise PlannerError(f"DeepSpeed: vpp({lay.vpp}) > 1 (interleaved pipeline) is not supported by its pipeline engine")
    if lay.pp > 1 and lay.zero_stage > 1:
        raise PlannerError(f"DeepSpeed: ZeRO-{lay.zero_stage} cannot run with pipeline parallelism (pp({lay.pp}) > 1)")
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None or (
            lay.pipeline_layers is not None and lay.pipeline_layers != pipeline_split(plan.model.num_layers, lay.pp)):
        raise PlannerError(f"DeepSpeed: its pipeline engine places the layers itself "
                           f"({', '.join(map(str, pipeline_split(plan.model.num_layers, lay.pp)))}, "
                           f"partition_method='type:transformer'); this plan's split is not emitted")
    if lay.recompute_num_layers is not None:
        raise PlannerError(f"DeepSpeed: recomputing {lay.recompute_num_layers} layers per stage is not emitted "
                           "(only every layer); plan with framework='deepspeed'")
    if lay.tp_comm_overlap:
        raise PlannerError("DeepSpeed: Megatron-DeepSpeed has no TE userbuffers TP overlap (tp_comm_overlap); "
                           "plan with framework='deepspeed'")
    refuse_other_engine(plan, "DeepSpeed")


def ds_config(plan: Plan) -> dict:
    """The ds_config dictionary (train_batch_size = micro x GAS x DP)."""
    _check(plan)
    lay, t = plan.layout, plan.training
    gas = num_microbatches(t, lay)
    zero: dict = {"stage": lay.zero_stage}
    if lay.zero_stage >= 1:  # the buckets and overlap the ledger and cost model price (planner.deepspeed_engine)
        zero.update({"contiguous_gradients": True, "reduce_scatter": True, "overlap_comm": overlap_comm(lay),
                     "reduce_bucket_size": REDUCE_BUCKET_ELEMENTS, "allgather_bucket_size": ALLGATHER_BUCKET_ELEMENTS})
    if t.optimizer_offload:  # ZeRO-Offload: the partition and DeepSpeedCPUAdam on the host, pinned
        # (planner.deepspeed_engine [Offload]; --cpu-optimizer hands DeepSpeed the CPU Adam)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.zero_stage == 3:  # overlap_comm on: DeepSpeed's stage-3 default, priced by calibration.dp_overlap;
        # the gathered weights the ledger counts (deepspeed_engine.zero3_gathered_params)
        zero.update({"stage3_prefetch_bucket_size": PREFETCH_BUCKET_ELEMENTS, "stage3_param_persistence_threshold": 100_000,
                     "stage3_max_reuse_distance": MAX_REUSE_DISTANCE, "stage3_max_live_parameters": MAX_LIVE_PARAMETERS})
    cfg = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "bf16" if t.precision == "bf16" else "fp16": {"enabled": True},
        # the gradient bytes the ledger prices; DeepSpeed accumulates in the model dtype by default
        # [DeepSpeed runtime/engine.py: get_data_types, grad_accum_dtype]
        "data_types": {"grad_accum_dtype": "fp32" if t.grad_dtype == "fp32" else t.precision},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if lay.recompute != Recompute.NONE:
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return cfg


def _megatron_deepspeed_args(plan: Plan) -> list[str]:
    m, t, lay = plan.model, plan.training, plan.layout
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size), "--ffn-hidden-size", str(m.ffn_hidden_size),
         "--num-attention-heads", str(m.num_attention_heads)]
    if m.kv_channels is not None:
        a += ["--kv-channels", str(m.kv_channels)]
    if m.kv_heads != m.num_attention_heads:
        a += ["--num-key-value-heads", str(m.kv_heads)]
    if m.family == Family.LLAMA:
        a += ["--swiglu", "--normalization", "rmsnorm", "--disable-bias-linear", "--use-rotary-position-embeddings",
              "--no-position-embedding"]
    if not m.uses_dropout:  # Megatron-DeepSpeed's defaults are 0.1; the ledger keeps no masks
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    a += ["--seq-length", str(t.seq_length), "--max-position-embeddings", str(max(t.seq_length, m.max_position_embeddings or 0)),
          "--micro-batch-size", str(lay.micro_batch_size), "--global-batch-size", str(t.global_batch_size),
          "--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.sequence_parallel and lay.tp > 1:
        a += ["--sequence-parallel"]
    if lay.pp == 1:
        a += ["--no-pipeline-parallel"]
    if lay.recompute == Recompute.FULL:
        a += ["--deepspeed-activation-checkpointing", "--recompute-granularity", "full", "--recompute-method", "uniform"]
    elif lay.recompute == Recompute.SELECTIVE:
        if lay.recomputed_modules != ("core_attn",):
            raise PlannerError(f"Megatron-DeepSpeed: selective recompute re-runs the attention core only; "
                               f"recompute_modules {','.join(lay.recomputed_modules)} are megatron-core's "
                               "(emit for Megatron)")
        a += ["--recompute-granularity", "selective"]
    if t.optimizer_offload:  # DeepSpeedCPUAdam, which ZeRO-Offload requires [Megatron-DeepSpeed get_megatron_optimizer]
        a += ["--cpu-optimizer"]
    a += ["--bf16" if t.precision == "bf16" else "--fp16", "--zero-stage", str(lay.zero_stage),
          "--deepspeed", "--deepspeed_config", "ds_config.json"]
    return a


def to_deepspeed(plan: Plan) -> LaunchFiles:
    """DeepSpeed launch files: ds_config.json and launch.sh (the deepspeed launcher)."""
    cfg = ds_config(plan)
    c = plan.cluster
    args = _megatron_deepspeed_args(plan)
    script = "\n".join([
        "#!/usr/bin/env bash",
        f"# {script_word(plan.model.name)} on {c.num_nodes} x {c.gpus_per_node} {script_word(c.gpu.name)}: "
        f"{plan.layout.short()}",
        f"# generated by planner for {DEEPSPEED_VERSION} (+ Megatron-DeepSpeed for TP/PP)",
        "set -euo pipefail",
        ': "${MEGATRON_DEEPSPEED:?set MEGATRON_DEEPSPEED to your Megatron-DeepSpeed checkout}"',
        ': "${HOSTFILE:=hostfile}"',
        f"deepspeed --hostfile \"$HOSTFILE\" --num_nodes {c.num_nodes} --num_gpus {c.gpus_per_node}"
        # ZeRO-Offload's CPU Adam: each rank its NUMA-local share of the cores, OMP_NUM_THREADS set to it
        + (" --bind_cores_to_rank" if plan.training.optimizer_offload else "") + " \\",
        '  "$MEGATRON_DEEPSPEED/pretrain_gpt.py" \\',
        "  " + " ".join(shlex.quote(x) for x in args),
    ]) + "\n"
    return LaunchFiles("deepspeed", {"ds_config.json": dump_json(cfg), "launch.sh": script}, tuple(args), {}, cfg)
