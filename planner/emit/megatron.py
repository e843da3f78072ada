"""Megatron-LM: pretrain_gpt.py arguments, a torchrun script and a SLURM script.

Flags as in megatron-core 0.19.2 / Megatron-LM main (shared/reference/launch-configs.md §2.1);
there is no --virtual-pipeline-model-parallel-size flag: interleaving is
--num-virtual-stages-per-pipeline-rank, which also works with uneven first/last stages.
"""

from __future__ import annotations

import shlex

from planner.emit import LaunchFiles, dump_json, refuse_other_engine, refuse_unemitted, script_word
from planner.errors import PlannerError
from planner.memory import TE_FP8_RECIPES, virtual_stage_layers
from planner.pipeline_layout import layout_string as pipeline_layout_string
from planner.plans import Plan
from planner.specs import Family, Recompute

__all__ = ["megatron_args", "megatron_env", "to_megatron", "pipeline_layout_string", "moe_layer_pattern",
           "hybrid_pattern", "training_script", "HYBRID_SPEC", "MEGATRON_VERSION"]

MEGATRON_VERSION = "megatron-core 0.19.2"
MASTER_PORT = 29500


def moe_layer_pattern(model) -> str:
    """--moe-layer-freq as the list expression Megatron evaluates into one 0/1 per layer (1: MoE)
    [Megatron-LM@d98e8a6 megatron/training/arguments.py: moe_freq_type; models/gpt/gpt_layer_specs.py:
    the pattern's length must be num_layers]: ModelSpec.is_moe_layer's leading dense layers, then
    layer_step - 1 dense and one MoE layer, repeated. (Megatron's integer form puts the MoE layer
    first in each group, Hugging Face's step last: the list says which.)"""
    e = model.moe
    k, step = e.first_dense_layers, e.layer_step
    group = "[1]" if step == 1 else f"([0]*{step - 1}+[1])"
    parts = ([f"[0]*{k}"] if k else []) + [f"{group}*{model.moe_layers}"]
    return "(" + "+".join(parts) + ")"


HYBRID_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec")
"""The layer spec pretrain_hybrid.py builds a hybrid model from (--spec module attribute): Transformer Engine
linears and norms, the Mamba-2 mixer, attention, MLP and MoE layers the cost model prices [megatron-core 0.19.2
models/hybrid/hybrid_layer_specs.py: hybrid_stack_spec; Megatron-LM hybrid_builders.py: hybrid_builder
requires --spec]."""


def training_script(model) -> str:
    """Megatron-LM's entry point for the model: pretrain_hybrid.py for a hybrid (layer_pattern) model,
    pretrain_gpt.py otherwise (pretrain_mamba.py is its deprecated wrapper)."""
    return "pretrain_hybrid.py" if model.hybrid else "pretrain_gpt.py"


def hybrid_pattern(plan: Plan) -> str:
    """--hybrid-layer-pattern for the plan: the model's layer symbols, with a '|' between virtual pipeline
    stages when pp > 1 (Megatron derives the stage layout and the interleaving from the pipes and takes
    no --pipeline-model-parallel-layout, --num-virtual-stages-per-pipeline-rank or, with pipes, uneven
    first/last counts beside them [megatron-core 0.19.2 training/arguments.py: validate_args,
    get_hybrid_total_pipeline_segment_count]). The stages hold the layers planner.memory.symbols_on
    counts (virtual_stage_layers). MTP depths follow after a '/' each, ModelSpec.mtp_pattern, on the last
    rank (models/hybrid/hybrid_layer_allocation.py: parse_hybrid_pattern; hybrid_model.py: mtp_process)."""
    m, lay = plan.model, plan.layout
    mtp = "".join("/" + m.mtp_pattern for _ in range(m.mtp_layers))
    if lay.pp == 1:
        return m.layer_pattern + mtp
    parts, start = [], 0
    for n in virtual_stage_layers(m, lay):
        parts.append(m.layer_pattern[start:start + n])
        start += n
    return "|".join(parts) + mtp


def megatron_args(plan: Plan) -> list[str]:
    """The pretrain_gpt.py (pretrain_hybrid.py: training_script) argument list for the plan (deterministic order)."""
    refuse_unemitted(plan, "Megatron")
    m, t, lay = plan.model, plan.training, plan.layout
    a: list[str] = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
    ]
    if m.kv_channels is not None:  # Q is a*d wide, not h (megatron arguments.py: --kv-channels)
        a += ["--kv-channels", str(m.kv_channels)]
    if m.kv_heads != m.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.family == Family.LLAMA:
        # GPT-OSS's GLU: quick-GELU gate, +1 on the linear half, inputs clamped to 7 [megatron-core 0.19.2
        # transformer_config.py: glu_linear_offset, activation_func_clamp_value; Megatron-Bridge
        # models/gpt_oss/gpt_oss_bridge.py: GPTOSSBridge.provider_bridge]
        a += (["--swiglu"] if m.activation == "swiglu" else ["--squared-relu"] if m.activation == "squared-relu" else
              ["--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0"])
        a += ["--normalization", "RMSNorm"] + ([] if m.linear_bias else ["--disable-bias-linear"])
        if m.qk_norm:
            a += ["--qk-layernorm"]
        if m.qkv_bias:
            a += ["--add-qkv-bias"]
    if not m.uses_dropout:  # Megatron's defaults are 0.1 (TransformerConfig.hidden_dropout, attention_dropout)
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]  # the ledger keeps no masks
    if m.sliding_window is not None:  # priced by planner.cost.computed_score_share
        # Megatron's window is (keys left of the query, keys right): w keys with the query itself
        a += ["--window-size", f"{m.sliding_window - 1},0"]
        if m.full_attention_every is not None:
            a += ["--window-attn-skip-freq", str(m.full_attention_every)]
    if m.attention_sinks:  # one learnable logit per head [megatron-core 0.19.2 transformer_config.py: softmax_type]
        a += ["--softmax-type", "learnable"]
    if m.mla is not None:  # Megatron's MLA flags [Megatron-LM@d98e8a6 megatron/training/arguments.py]
        ml = m.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", str(ml.kv_lora_rank), "--qk-head-dim", str(ml.qk_head_dim),
              "--qk-pos-emb-head-dim", str(ml.qk_rope_head_dim), "--v-head-dim", str(ml.v_head_dim)]
        if ml.q_lora_rank is not None:
            a += ["--q-lora-rank", str(ml.q_lora_rank)]
    if m.hybrid:  # one word: a pattern may start with '-', which argparse would read as a flag
        mb = m.mamba
        a += [f"--hybrid-layer-pattern={hybrid_pattern(plan)}", "--spec", *HYBRID_SPEC]
        if mb is not None:  # priced by planner.cost (mamba_gemm_flops, mamba_scan_time), memory.mamba_saved_bytes
            a += ["--mamba-num-heads", str(mb.num_heads), "--mamba-head-dim", str(mb.head_dim),
                  "--mamba-state-dim", str(mb.state_dim), "--mamba-num-groups", str(mb.num_groups)]
    if m.moe is not None:  # the leading dense layers (ffn_hidden_size), then MoE layers, or every layer_step-th
        e = m.moe
        if (e.first_dense_layers or e.layer_step > 1) and not m.hybrid:  # Megatron evaluates the string into a per-layer 0/1 list
            a += ["--moe-layer-freq", moe_layer_pattern(m)]
        # priced as planner.cost.moe_time prices it: the all-to-all, all-gather or DeepEP dispatcher, dropless
        # (Megatron's default capacity None) unless the workload drops tokens, TE grouped GEMMs over the local
        # experts; the auxiliary loss only nudges the router toward the balance the cost model assumes
        a += ["--num-experts", str(e.num_experts), "--moe-router-topk", str(e.top_k),
              "--moe-ffn-hidden-size", str(e.expert_ffn_hidden_size), "--moe-grouped-gemm",
              # LatentMoE: the experts' width from dispatch to combine (moe_time, moe_routed_bytes, tp_whole_params)
              *(["--moe-latent-size", str(e.latent_size)] if e.latent_size else []),
              *(["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
                if lay.moe_dispatcher == "deepep" else ["--moe-token-dispatcher-type", lay.moe_dispatcher]),
              "--moe-router-load-balancing-type", "aux_loss",
              "--moe-aux-loss-coeff", "1e-3",
              "--expert-model-parallel-size", str(lay.ep), "--expert-tensor-parallel-size", str(lay.expert_tp)]
        if e.router_groups is not None:  # group-limited routing: caps the nodes DeepEP sends a token to
            # (planner.comm.remote_nodes) [megatron-core 0.19.2 transformer_config.py: moe_router_num_groups]
            a += ["--moe-router-num-groups", str(e.router_groups), "--moe-router-group-topk", str(e.router_group_topk)]
        if e.top_k == 1:  # a softmax over one score has no gradient: Megatron requires it before the top-k
            # [Megatron-LM@d98e8a6 megatron/core/transformer/transformer_config.py: __post_init__]; the
            # router's cost is priced either way as its h x E GEMM
            a += ["--moe-router-pre-softmax"]
        if e.shared_expert_ffn_hidden_size:
            a += ["--moe-shared-expert-intermediate-size", str(e.shared_expert_ffn_hidden_size)]
            if e.shared_expert_gate:  # its 1 x h weight per layer is in ModelSpec.moe_layer_params
                a += ["--moe-shared-expert-gate"]
        if t.moe_capacity_factor is not None:  # token dropping: the rows memory.routed_rows prices
            a += ["--moe-expert-capacity-factor", str(float(t.moe_capacity_factor)), "--moe-token-drop-policy", "probs"]
            if t.moe_pad_to_capacity:
                a += ["--moe-pad-expert-input-to-capacity"]
        if lay.ep_overlap:  # the combined 1F1B schedule, priced by planner.cost.ep_overlap_exposed
            a += ["--overlap-moe-expert-parallel-comm"]
    if m.mtp_layers:  # on the last rank (Megatron's place without a layout; the layout string puts 'm' there),
        # priced by planner.cost.mtp_head_time and the last rank's MTP layer terms, held in the ledger's mtp item
        a += ["--mtp-num-layers", str(m.mtp_layers)]
        if m.mtp_shared:  # one block's weights for every depth (ModelSpec.mtp_param_depths in the ledger)
            a += ["--mtp-use-repeated-layer"]
    if m.positions in ("rope", "none"):
        a += ["--position-embedding-type", m.positions]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    max_pos = max(t.seq_length, m.max_position_embeddings or 0)
    a += [
        "--seq-length", str(t.seq_length), "--max-position-embeddings", str(max_pos),
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size),
        "--micro-batch-size", str(lay.micro_batch_size), "--global-batch-size", str(t.global_batch_size),
        "--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp),
        "--context-parallel-size", str(lay.cp),
    ]
    if m.hybrid:  # the stages are the pattern's pipes (hybrid_pattern)
        pass
    elif lay.pipeline_layers is not None:  # any split, with the embedding and the loss as items
        a += ["--pipeline-model-parallel-layout", pipeline_layout_string(lay.pipeline_layers, m.mtp_layers)]
    elif lay.vpp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)]
    if lay.vpp > 1 and not lay.p2p_overlapped:  # on by default for interleaving; priced exposed when off
        if lay.pp == 2:
            raise PlannerError("Megatron: interleaving without p2p overlap needs pp > 2 (validate_args)")
        a += ["--no-overlap-p2p-communication"]
    if lay.first_stage_layers is not None and not m.hybrid:
        a += ["--decoder-first-pipeline-num-layers", str(lay.first_stage_layers)]
    if lay.last_stage_layers is not None and not m.hybrid:
        a += ["--decoder-last-pipeline-num-layers", str(lay.last_stage_layers)]
    if lay.sequence_parallel and lay.tp > 1:
        a += ["--sequence-parallel"]
    if lay.tp_comm_overlap:  # Transformer Engine userbuffers; priced by planner.cost (overlapped pairs)
        a += ["--tp-comm-overlap"]
    if lay.rank_order == "tp-cp-pp-dp":
        a += ["--use-tp-pp-dp-mapping"]
    if lay.zero_stage == 1:
        a += ["--use-distributed-optimizer"]
    elif lay.zero_stage in (2, 3):
        if lay.pp > 1:
            raise PlannerError(f"Megatron: ZeRO-{lay.zero_stage} (Megatron-FSDP) is not emitted with pp({lay.pp}) > 1")
        strategy = "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, "--ckpt-format", "fsdp_dtensor"]
    # exactly the overlaps the plan was priced with (planner.cost.stage_dp_time reads the same fields)
    if lay.overlap_grad_reduce:
        a += ["--overlap-grad-reduce"]
    if lay.overlap_param_gather:
        a += ["--overlap-param-gather"]
    if lay.recompute == Recompute.OP:
        raise PlannerError("Megatron: recompute 'op' is torchtitan's per-op checkpointing; Megatron's selective "
                           "recompute is the attention core (plan with framework='megatron')")
    if lay.recompute == Recompute.SELECTIVE:
        a += ["--recompute-granularity", "selective"]
        if lay.recompute_modules is not None:  # what the ledger frees and the recompute term re-runs
            a += ["--recompute-modules", *lay.recompute_modules]
    elif lay.recompute == Recompute.FULL:
        if lay.recompute_num_layers is None:  # every layer checkpointed on its own: stores 2sbh per layer
            a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        else:  # the first N layers of each stage recomputed, the rest kept
            a += ["--recompute-granularity", "full", "--recompute-method", "block",
                  "--recompute-num-layers", str(lay.recompute_num_layers)]
    a += ["--bf16" if t.precision == "bf16" else "--fp16"]
    if t.cross_entropy != "unfused":  # the loss the cost model prices (cost.loss_traffic_bytes)
        a += ["--cross-entropy-loss-fusion"]
    if t.fp8 is not None:  # the linear layers of every transformer layer (TE modules); the LM head stays BF16
        # Megatron's --fp8-recipe choices are Transformer Engine's recipes [Megatron-LM@d98e8a6
        # megatron/core/transformer/transformer_config.py: fp8_recipe; 'custom' is not priced];
        # --fp8-format hybrid: E4M3 forward, E5M2 gradients (TE's default format)
        if t.fp8 == "nvfp4":  # Megatron's FP4 flags, TE's NVFP4BlockScaling [megatron-core 0.19.2
            # transformer_config.py: fp4 ('e2m1'), fp4_recipe ('nvfp4'); arguments.py: fp4 excludes fp8]
            a += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
        elif t.fp8 not in TE_FP8_RECIPES:
            raise PlannerError(f"Megatron: FP8 recipe '{t.fp8}' is torchao's (torchtitan); Megatron's --fp8-recipe "
                               f"offers {', '.join(sorted(TE_FP8_RECIPES))}")
        else:
            a += ["--fp8-format", "hybrid", "--fp8-recipe", t.fp8]
        if t.fp8_param_gather:  # FP8 weights, all-gathered in FP8 (priced in planner.cost / memory)
            a += ["--fp8-param-gather"]
            if t.fp8 == "mxfp8":  # gathered in BF16 through the gradient buffer (memory.MXFP8_GATHER_BYTES),
                # as Megatron recommends and Megatron-Bridge's bf16_with_mxfp8_mixed sets
                a += ["--reuse-grad-buf-for-mxfp8-param-ag"]
        if t.fp8_attention:  # priced (planner.cost.fp8_attention_speed), but pretrain_gpt cannot turn it on
            raise PlannerError("Megatron: training.fp8_attention has no command-line flag in megatron-core 0.19.2 "
                               "(arguments.py _add_network_size_args excludes TransformerConfig.fp8_dot_product_attention); "
                               "set it in your own launcher, as Megatron-Bridge's recipes do, or plan without it")
        if any(t.bf16_end_layers):  # their linears in BF16 (planner.memory.bf16_layers_on)
            first, last = t.bf16_end_layers
            a += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(first),
                  "--num-layers-at-end-in-bf16", str(last)]
    if t.optimizer_states == "bf16":  # BF16 moments (and master remainders): planner.memory.adam_bytes
        a += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    if t.optimizer_offload:  # HybridDeviceOptimizer, which needs the precision-aware optimizer's code path
        # [megatron/training/arguments.py: validate_args]; priced with the D2H / CPU / H2D overlap
        # (planner.cost.OffloadTime), host memory in planner.memory.stage_host_bytes
        a += ["--use-precision-aware-optimizer", "--optimizer-cpu-offload",
              "--optimizer-offload-fraction", repr(float(t.optimizer_offload)), "--overlap-cpu-optimizer-d2h-h2d"]
    # the gradient buffer the ledger prices (TrainingSpec.grad_dtype): Megatron keeps fp32 main
    # grads with --bf16 unless told otherwise, and 2-byte grads with --fp16 unless told otherwise
    # [megatron-core 0.19.2 training/arguments.py: validate_args, bf16 block]
    if t.precision == "bf16" and t.grad_dtype == "bf16":
        a += ["--grad-reduce-in-bf16"]
    if t.precision == "fp16" and t.grad_dtype == "fp32":
        a += ["--accumulate-allreduce-grads-in-fp32"]
    if t.attention == "flash":
        a += ["--attention-backend", "flash"]
    a += ["--mock-data", "--lr", "3.0e-4", "--min-lr", "3.0e-5", "--lr-decay-style", "cosine",
          "--weight-decay", "0.1", "--clip-grad", "1.0"]
    iters = int(t.token_budget // plan.tokens_per_step) if t.token_budget else 1000
    a += ["--train-iters", str(max(1, iters)), "--log-interval", "1"]
    refuse_other_engine(plan, "Megatron")  # after the layout rules, which say more
    return a


EP_OVERLAP_CONNECTIONS = {"deepep": "32", "alltoall": "8"}
"""CUDA_DEVICE_MAX_CONNECTIONS under the EP overlap (--overlap-moe-expert-parallel-comm) with TP or CP before
Blackwell, by token dispatcher: Megatron-Bridge's performance scripts' choice [NVIDIA-NeMo/Megatron-Bridge
scripts/performance/utils/overrides.py: 32 for DeepEP/HybridEP, else 8; 1 only with TP or CP and no overlap].
The overlap needs more than one hardware queue (megatron-core transformer/moe/README.md: 'Requirements for EP A2A
Overlap: ... CUDA_DEVICE_MAX_CONNECTIONS > 1'); with one, every stream's kernels queue in launch order and the
second micro-batch's all-to-alls wait behind the first one's compute, which cost.ep_overlap_exposed does not
price. TP's collectives lose nothing the cost model credits: without --tp-comm-overlap they are priced exposed
(calibration.tp_comm_exposed), and Transformer Engine's userbuffers order their kernels on Hopper with more than
one queue (comm_gemm_overlap.cpp: Fast Dependent Launch when CUDA_DEVICE_MAX_CONNECTIONS > 1)."""


def megatron_env(plan: Plan) -> dict[str, str]:
    """Environment Megatron requires: CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before Blackwell,
    and never with Megatron-FSDP (validate_args, launch-configs.md §2.2); where the plan runs the EP overlap
    too, EP_OVERLAP_CONNECTIONS instead (megatron-core 0.19.2 validate_args only warns there: 'you can set
    CUDA_DEVICE_MAX_CONNECTIONS to 1 or 32, which depends on which parallelization you want to prioritize';
    the plan priced the overlap). With optimizer offload,
    OMP_NUM_THREADS gives each rank its share of the node's cores: torchrun sets 1 per process
    otherwise, and torch's CPU AdamW would step the offloaded states on one core (the cost model
    prices the node's memory bandwidth, planner.cost.stage_offload_time)."""
    lay, env = plan.layout, {}
    fsdp = lay.zero_stage in (2, 3)
    if (lay.tp > 1 or lay.cp > 1) and plan.cluster.gpu.arch < 10 and not fsdp:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = EP_OVERLAP_CONNECTIONS[lay.moe_dispatcher] if lay.ep_overlap else "1"
    if plan.training.optimizer_offload and plan.cluster.host is not None:
        env["OMP_NUM_THREADS"] = str(max(1, plan.cluster.host.cores // plan.cluster.gpus_per_node))
    return env


def _script(plan: Plan, args: list[str], env: dict[str, str], slurm: bool) -> str:
    c = plan.cluster
    name, gpu = script_word(plan.model.name), script_word(c.gpu.name)  # user strings: a safe alphabet only
    lines = ["#!/usr/bin/env bash"]
    if slurm:
        lines += [f"#SBATCH --job-name={name}", f"#SBATCH --nodes={c.num_nodes}",
                  "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={c.gpus_per_node}", "#SBATCH --exclusive"]
    lines += [f"# {name} on {c.num_nodes} x {c.gpus_per_node} {gpu}: {plan.layout.short()}",
              f"# generated by planner for {MEGATRON_VERSION} (predictions: planner evaluate, or plan --json)",
              "set -euo pipefail", ': "${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}"']
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if slurm:
        lines += ['MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  f"srun torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node} \\",
                  f'  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{MASTER_PORT}" --rdzv-id "$SLURM_JOB_ID" \\']
    else:
        lines += [f"torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node} \\",
                  f'  --node-rank "${{NODE_RANK:-0}}" --master-addr "${{MASTER_ADDR:-localhost}}" --master-port {MASTER_PORT} \\']
    lines.append(f'  "$MEGATRON_LM/{training_script(plan.model)}" \\')
    pairs, i = [], 0
    while i < len(args):  # one flag (with its value) per line, every word quoted where it needs it
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{shlex.quote(args[i])} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            pairs.append(shlex.quote(args[i]))
            i += 1
    lines += [f"  {p} \\" for p in pairs[:-1]] + [f"  {pairs[-1]}"]
    return "\n".join(lines) + "\n"


def to_megatron(plan: Plan) -> LaunchFiles:
    """Megatron-LM launch files: megatron_args.json, train.sh (torchrun), sbatch.sh (SLURM)."""
    args, env = megatron_args(plan), megatron_env(plan)
    payload = {"args": args, "env": env, "world_size": plan.num_gpus, "gpu_arch": plan.cluster.gpu.arch,
               "target": MEGATRON_VERSION}
    files = {"megatron_args.json": dump_json(payload), "train.sh": _script(plan, args, env, slurm=False),
             "sbatch.sh": _script(plan, args, env, slurm=True)}
    return LaunchFiles("megatron", files, tuple(args), env)
