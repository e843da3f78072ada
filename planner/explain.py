"""The reasoning behind a plan as short sentences with numbers, in the seed's order:
static memory, the NVLink cap on TP, the pipeline bubble, what the sequence length costs, what
binds the chosen plan, where an MoE model's all-to-all runs, and sensitivities (FP8 on or off, 2x scale-out bandwidth, 2x GPUs, 2x sequence)."""

from __future__ import annotations

from typing import Any

from planner.comm import alltoall_time, node_dedup_alltoall_time
from planner.cost import (attention_speed, computed_score_share, expert_gemm_times, fp8_attention_speed,
                          fsdp_prefetch_priced, loss_traffic_bytes, model_flops_per_token, mtp_time, output_time,
                          stage_coefficients, stage_dp_time, stage_offload_time)
from planner.emit.megatron import EP_OVERLAP_CONNECTIONS
from planner.errors import PlannerError
from planner.memory import (activation_bytes_per_layer, adam_bytes, routed_rows, saved_gather_bytes, stage_static_items,
                            static_memory, weight_and_adam_bytes)
from planner.plans import evaluate
from planner.search import plan
from planner.space import check_precision, default_fp8_recipe, framework_training, offloaded
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec
from planner.torchtitan_engine import uses_torchtitan
from planner.topology import placement
from planner.uncertainty import fp8_speedup_check, fp8_speedup_note

__all__ = ["explain", "explain_with_status"]

GB, GiB = 1e9, 2.0**30


def _sensitivity(label, model, cluster, training, base, framework, time_limit_s, constraints) -> str:
    try:
        r = plan(model, cluster, training, top_k=1, structural=False, framework=framework,
                 time_limit_s=time_limit_s, **constraints)
    except PlannerError as err:  # the target does not run this workload as priced
        return f"{label}: {err}"
    if r.best is None:
        return f"{label}: nothing fits"
    b = r.best
    tps = b.tokens_per_second / base.tokens_per_second - 1
    return (f"{label}: {b.layout.short()}, {b.step_time_s:.2f} s/step, tokens/s {tps:+.0%} "
            f"(per GPU {b.tokens_per_second / b.num_gpus / (base.tokens_per_second / base.num_gpus) - 1:+.0%})")


def _fp8_alternative(cluster: ClusterSpec, training: TrainingSpec, framework: str | None) -> TrainingSpec | None:
    """The same workload with FP8 linear layers toggled: the target's default recipe (Megatron's
    delayed on Hopper, MXFP8 on Blackwell; torchtitan's rowwise on Hopper, torchao's MXFP8 on
    Blackwell); None where the cluster cannot price FP8 or the launch target does not emit it (DeepSpeed)."""
    if training.fp8 is not None:
        return training.model_copy(update={"fp8": None, "fp8_attention": False})
    if framework == "deepspeed":
        return None
    recipe = default_fp8_recipe(cluster, framework)
    try:
        check_precision(cluster, training.model_copy(update={"fp8": recipe}))
    except PlannerError:
        return None
    return training.model_copy(update={"fp8": recipe})


_ACCUMULATOR = {"deepspeed": "DeepSpeed's optimizer wrapper", "fsdp2": "FSDP2 under torchtitan's pipeline"}


def _routing_phrase(training: TrainingSpec) -> str:
    """How the routed tokens are priced on the busiest rank (TrainingSpec.moe_routing, memory.routed_rows)."""
    r = training.moe_routing
    spread = ("tokens are assumed balanced over the experts" if r.imbalance == 1 else
              f"the busiest rank receives {r.imbalance:g}x the mean tokens (--moe-imbalance)")
    if r.capacity_factor is None:
        return spread
    if r.pad:
        return (f"every expert computes exactly its capacity, {r.capacity_factor:g}x its balanced share of each "
                "rank's tokens, padded (--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity)")
    return (f"{spread}, capped at {r.capacity_factor:g}x the balanced share, the rest dropped "
            "(--moe-expert-capacity-factor)")


def _experts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b) -> list[str]:
    """Why this expert parallelism: where its all-to-all runs, what it costs, and the chosen layout
    with EP halved and doubled (priced by evaluate; 'does not fit' / 'illegal' where so)."""
    lay, e = b.layout, model.moe
    group = placement(cluster, (lay.ep, lay.expert_tp))
    where = ("inside one NVLink domain" if group.tier in ("nvlink", "local") else
             f"across {group.domains} NVLink domains ({group.per_domain} in each reach each other over NVLink)"
             if group.domains else f"across {group.nodes} nodes ({group.per_node} per node share its NICs)")
    tokens = lay.micro_batch_size * training.seq_length / (lay.cp * lay.tp)
    width = e.width(model.hidden_size)  # the routed rows' width (LatentMoE: the latent)
    per_gpu = routed_rows(model, tokens, 1, training.moe_routing) * width * 2  # the busiest rank's
    pipe = b.time.pipeline  # the rank that spends most on dispatch (the slowest may hold dense layers only)
    ep_s = max(st.ep_comm for st in pipe.stages) * pipe.num_microbatches
    if lay.moe_dispatcher == "allgather":  # every token gathered over etp x ep (planner.cost.moe_time)
        gathered = tokens * width * 2 * lay.ep * lay.expert_tp
        moves = (f"the all-gather dispatcher gathers every rank's tokens, {gathered / 1e6:,.0f} MB, to each GPU and "
                 "reduce-scatters the outputs back, each again in backward")
    else:
        moves = f"each all-to-all moves {per_gpu / 1e6:,.0f} MB per GPU, four per layer and micro-batch"
    latent = f" on a {e.latent_size:,}-wide latent (LatentMoE: what the tokens carry to them)" if e.latent_size else ""
    cal = cluster.calibration
    fitted = [f"at {cal.ep_comm_speed:.2f}x the priced speed"] if cal.ep_comm_speed != 1 else []
    if cal.moe_host_stall:  # calibration.moe_host_stall: counted with the forward's dispatch
        fitted.append(f"with a {cal.moe_host_stall * 1e3:.2f} ms host stall in each MoE forward")
    whose = "as calibrated" if cal.moe_fitted_on else "the catalog's, fitted on the published MoE runs"
    calibrated = f" ({' and '.join(fitted)}, {whose})" if fitted else ""
    out = [f"Experts: {e.num_experts} per layer, top-{e.top_k}{latent}; ep {lay.ep} x etp {lay.expert_tp} puts "
           f"{e.num_experts // lay.ep} experts on each GPU (expert data parallel {lay.edp}); the EP group runs "
           f"{where}: {moves}, {ep_s:.2f} s of the step on the busiest rank ({ep_s / b.step_time_s:.0%}){calibrated}; "
           f"{_routing_phrase(training)}."]
    (gpu1, floor), (gpu2, _) = expert_gemm_times(model, cluster, b.training, lay.tp, lay.cp, lay.micro_batch_size,
                                                  lay.ep, lay.expert_tp)
    if floor > min(gpu1, gpu2):  # planner.cost.expert_gemm_times: the host issues one GEMM per local expert
        local = e.num_experts // lay.ep
        out.append(f"The expert GEMMs wait on the host: Transformer Engine issues one cuBLASLt call per local expert, "
                   f"{local} x {cluster.calibration.grouped_gemm_call * 1e6:.0f} us = {floor * 1e3:.2f} ms for each "
                   f"grouped GEMM against {gpu1 * 1e3:.2f} ms (FC1) and {gpu2 * 1e3:.2f} ms (FC2) of GPU work a micro-batch; "
                   "fewer experts a GPU (a larger EP) or more rows an expert (a larger micro-batch) bring it closer "
                   "to the GPU's pace, and runs that capture the experts in CUDA graphs do not pay it.")
    if (group.tier == "scaleout" and lay.moe_dispatcher == "alltoall" and lay.expert_tp == 1
            and not training.moe_pad_to_capacity):  # DeepEP does not pad (space._expert_problems)
        a2a = alltoall_time(cluster, group, per_gpu)
        deep = node_dedup_alltoall_time(cluster, group, tokens * training.moe_routing.share, width * 2,
                                        e.top_k, e.num_experts, e.router_groups, e.router_group_topk)
        out.append(f"The EP group crosses nodes with NCCL's all-to-all; DeepEP would send each token once per remote "
                   f"node ({deep / a2a:.0%} of the all-to-all's time here): plan with --moe-dispatcher "
                   "alltoall,deepep if the cluster has the deep_ep package.")
    if lay.ep > 1 and not uses_torchtitan(training):  # torchtitan's all-to-all has no such schedule
        name = "Megatron's EP overlap (--overlap-moe-expert-parallel-comm: one micro-batch's all-to-alls beside another's compute)"
        try:
            p = evaluate(model, cluster, training, lay.model_copy(update={"ep_overlap": not lay.ep_overlap}))
            change = (f"the step would take {p.step_time_s / b.step_time_s - 1:+.1%}"
                      + ("" if p.fits else " and does not fit"))
        except PlannerError as err:
            change = f"the layout is not legal ({err})"
        queues = ""
        if lay.ep_overlap and (lay.tp > 1 or lay.cp > 1) and cluster.gpu.arch < 10:
            queues = (f" Before Blackwell, TP or CP asks for CUDA_DEVICE_MAX_CONNECTIONS=1 and the overlap for more "
                      f"(megatron-core's validate_args warns); the launch sets "
                      f"{EP_OVERLAP_CONNECTIONS[lay.moe_dispatcher]}, Megatron-Bridge's choice, as priced: the TP "
                      f"collectives are priced exposed either way.")
        out.append(f"{name} is {'on' if lay.ep_overlap else 'off'}; "
                   f"{'without' if lay.ep_overlap else 'with'} it {change}.{queues}")
    alts = []
    for ep in (lay.ep // 2, lay.ep * 2):
        if ep < 1 or lay.ep % 2:
            continue
        try:
            p = evaluate(model, cluster, training, lay.model_copy(update={"ep": ep, "ep_overlap": lay.ep_overlap and ep > 1}))
        except PlannerError:
            alts.append(f"ep {ep} is not a legal layout here")
            continue
        alts.append(f"ep {ep}: {p.step_time_s / b.step_time_s - 1:+.1%}" + ("" if p.fits else " and does not fit"))
    if alts:
        out.append("Same layout with " + "; ".join(alts) + ".")
    return out


def _offload_sentence(b) -> str:
    """What optimizer offload does for the chosen plan: the GPU bytes it frees, the host bytes it pins,
    and which chain of the offloaded step sets its time (planner.cost.OffloadTime)."""
    st = b.memory.peak_stage.stage
    layers = b.memory.stages[st].layers
    t = stage_offload_time(b.model, b.cluster, b.training, b.layout, st, layers)
    kept = b.training.model_copy(update={"optimizer_offload": 0.0})  # the ledger's twin with nothing offloaded
    freed = sum(i.bytes for i in stage_static_items(b.model, kept, b.layout, st, layers)) - sum(
        i.bytes for i in stage_static_items(b.model, b.training, b.layout, st, layers))
    slowest = max(t.chains, key=t.chains.get)
    how = (f"set by {slowest}" if t.overlapped else
           f"copy, CPU step and copy back in series, {slowest} the largest ({t.chains[slowest]:.2f} s)")
    # the copies that run beside the collectives in every micro-batch (FSDP2, DeepSpeed ZeRO-3) are DP time
    copies = (stage_dp_time(b.model, b.cluster, b.training, b.layout, st, layers)
              - stage_dp_time(b.model, b.cluster, kept, b.layout, st, layers))
    extra = f"; the micro-batches' copies to and from the host add {copies:.2f} s of exposed DP time" if copies > 5e-4 else ""
    return (f"Optimizer offload ({b.training.optimizer_offload:.0%} of each shard on the host): {freed / GiB:.1f} GiB per "
            f"GPU freed on stage {st}, {b.memory.host[st] / GiB:.1f} GiB pinned of {b.memory.host_capacity / GiB:.1f} GiB of "
            f"host memory per GPU; the step's optimizer takes {t.total:.2f} s, {how}{extra}.")


FSDP_OVERLAP_CHECK = 0.5
"""The FSDP prefetch share explain prices the plan's layout at beside the cluster's: about what torchtitan's
FSDP2 405B run hid (a third of its 8.5 s of collectives, README), where FSDP1's published runs fit none."""


def _fsdp_sentence(b) -> str:
    """What FSDP's collectives (ZeRO-3, or ZeRO-2 outside DeepSpeed) leave exposed in the plan, whose prefetch share
    prices them, and the step with FSDP_OVERLAP_CHECK of each micro-batch's compute hiding them; '' elsewhere."""
    lay, cal = b.layout, b.cluster.calibration
    if not fsdp_prefetch_priced(b.training, lay):
        return ""
    dp = b.time.breakdown()["dp_comm"]
    if dp <= 0:
        return ""
    calibrated = b.cluster.provenance.get("calibration.dp_overlap", "").startswith("planner calibrate")
    whose = "as calibrated" if calibrated else "the catalog's, fitted on the published FSDP runs"
    shown = f"{FSDP_OVERLAP_CHECK:.0%}" if cal.dp_overlap < FSDP_OVERLAP_CHECK else "none"
    other = cal.model_copy(update={"dp_overlap": FSDP_OVERLAP_CHECK if cal.dp_overlap < FSDP_OVERLAP_CHECK else 0.0})
    p = evaluate(b.model, b.cluster.model_copy(update={"calibration": other}), b.training, lay)
    return (f"FSDP's gathers and reduce-scatters leave {dp:.2f} s of the step exposed ({dp / b.step_time_s:.0%}), the "
            f"prefetch hiding {cal.dp_overlap:.0%} of each micro-batch's compute ({whose}); were it to hide {shown}, "
            f"the step would take {p.step_time_s / b.step_time_s - 1:+.1%}: planner calibrate fits your cluster's share "
            "from FSDP logs (fsdp_overlap).")


def _attention_speed_clause(model, cluster, training, cp: int) -> str:
    """Where the attention kernel's speed comes from: the rates the plan prices it at, forward and
    backward (planner.cost.attention_speed), and the curve they follow."""
    fwd, bwd = attention_speed(model, cluster, training, cp)
    if training.kernels != "fused":  # Calibration.attention_efficiency_unfused: cited for one kernel, used for all
        source = (f"FlashAttention-2's H100 length curve at {cluster.calibration.attention_efficiency_unfused:.0%} of "
                  "peak, the eager-kernel stacks' figure, cited for llm-foundry's Triton FlashAttention; torchtitan's "
                  "SDPA runs FlashAttention-2 and is priced at it too, an assumption its published runs support")
    elif cluster.calibration.attention_length_curve is not None:
        source = "the cluster's measured curve of its fused kernel"
    else:
        source = "FlashAttention-2's H100 length curve at the cluster's efficiency"
    return f"; its kernel is priced at {fwd / 1e12:,.0f} / {bwd / 1e12:,.0f} TFLOP/s forward / backward here ({source})"


def explain(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, framework: str | None = "megatron",
            time_limit_s: float = 10.0, sensitivities: bool = True, **constraints: Any) -> list[str]:
    """Sentences explaining the optimum for this problem (or why nothing fits)."""
    return explain_with_status(model, cluster, training, framework=framework, time_limit_s=time_limit_s,
                               sensitivities=sensitivities, **constraints)[0]


def explain_with_status(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                        framework: str | None = "megatron", time_limit_s: float = 10.0, sensitivities: bool = True,
                        **constraints: Any) -> tuple[list[str], str]:
    """explain(), and the status of the plan it explains (one of planner.search.STATUSES)."""
    lines = []
    psi = model.num_params
    param_bytes, optimizer_bytes = weight_and_adam_bytes(framework_training(training, framework))  # the target's engine
    st = static_memory(psi, grad_dtype=training.grad_dtype, optimizer_bytes=optimizer_bytes, param_bytes=param_bytes).total
    per_param = f"{st / psi:g}"
    usable = cluster.usable_memory
    need = "must be sharded (ZeRO) or split (TP/PP)" if st > usable else "fits on one GPU unsharded"
    shared = " sharing one block" if model.mtp_shared and model.mtp_layers > 1 else ""
    mtp = (f" (its {model.mtp_layers} multi-token prediction depth(s){shared}, {model.mtp_params / 1e9:.1f}B more, sit on "
           "the last pipeline rank)") if model.mtp_layers else ""
    lines.append(f"Static memory: {psi / 1e9:.1f}B parameters x {per_param} bytes = {st / GB:,.0f} GB against "
                 f"{cluster.gpu.memory / GB:.0f} GB per GPU ({usable / GB:.0f} GB after the overhead item), so the model state "
                 f"{need}{mtp}.")
    if st > usable:
        lines.append(f"Spread over all {cluster.world_size} GPUs that is {st / cluster.world_size / GB:.1f} GB each at best.")
    lines.append(f"Tensor parallelism stays inside one NVLink domain of {cluster.nvlink_domain_size} GPUs "
                 f"(tp <= {cluster.nvlink_domain_size}); beyond it TP traffic would ride the {cluster.scaleout.nic_busbw / GB:.0f} GB/s NICs.")
    r = plan(model, cluster, training, top_k=2, structural=False, framework=framework, time_limit_s=time_limit_s, **constraints)
    if r.best is None:
        lines.append(r.infeasibility.message if r.infeasibility else r.explanation[0])
        return lines, r.status
    b, lay = r.best, r.best.layout
    lines.append(f"Chosen: {lay.short()} ({r.status}), {b.step_time_s:.2f} s/step, MFU {b.mfu:.1%}, "
                 f"{b.tokens_per_second:,.0f} tokens/s.")
    i80, i95, e = b.step_time_interval(0.8), b.step_time_interval(0.95), b.error_model
    lines.append(f"How far to trust it: the measured step should fall in {i80.lo:.2f}-{i80.hi:.2f} s (80 %) or "
                 f"{i95.lo:.2f}-{i95.hi:.2f} s (95 %), from {e.basis}; out-of-memory risk {b.oom_risk:.1%} "
                 f"(peak {b.peak_memory_bytes / GiB:.1f} of {b.memory.capacity / GiB:.1f} GiB).")
    if model.moe is not None:
        lines += _experts(model, cluster, b.training, b)  # the engine the plan is priced on
    pipe = b.time.pipeline
    if lay.pp > 1:
        lines.append(f"Pipeline: {lay.pp} stages x {lay.vpp} virtual, {pipe.num_microbatches} micro-batches: the bubble "
                     f"(p-1)/(v m) = {(lay.pp - 1) / (lay.vpp * pipe.num_microbatches):.1%} of the ideal, "
                     f"{pipe.bubble:.2f} s per step.")
        out = output_time(b.model, b.cluster, b.training, lay)
        per_layer = stage_coefficients(b.model, b.cluster, b.training, lay, lay.pp - 1).per_layer * 1e-6
        last = pipe.stages[-1].layers
        lines.append(f"The last rank also runs the output layer and the loss: {out.total * 1e3:.1f} ms a micro-batch "
                     f"(the logits GEMMs {out.gemm * 1e3:.1f} ms, the loss's passes over its logits {out.loss * 1e3:.1f} ms "
                     f"at {loss_traffic_bytes(b.training, lay.tp):g} B a logit), {out.total / per_layer:.1f} layers' time; "
                     f"it holds {last} of the layers, the busiest rank {max(st.layers for st in pipe.stages)}.")
        edges = max(st.get("pipeline_buffers") for st in b.memory.stages)
        if edges:  # the engine's tensors at the stages' edges (planner.memory: pipeline_buffers)
            lines.append(f"The pipeline engine keeps tensors at its stages' edges: up to {edges / GiB:.2f} GiB a GPU "
                         + ("(torch's receive buffers, one per micro-batch for the input and one for the output's "
                            "gradient, and the in-flight stage outputs), so more micro-batches cost memory here"
                            if uses_torchtitan(b.training) else
                            "(the in-flight micro-batches' stage outputs, held for their backward)") + ".")
        if model.mtp_layers:
            mtp = mtp_time(b.model, b.cluster, b.training, lay)
            lines.append(f"It also trains the {model.mtp_layers} multi-token prediction depth(s): each a layer of the last "
                         f"one's kind, its projection, the output layer and the loss again, {mtp * 1e3:.1f} ms a "
                         f"micro-batch ({mtp / per_layer:.1f} layers' time).")
    else:
        lines.append("No pipeline parallelism, so no bubble.")
    acc = b.time.breakdown()["grad_accum"]
    if acc > 0:
        lines.append(f"Gradient accumulation: {_ACCUMULATOR.get(b.training.optimizer_impl, 'the engine')} adds each of the "
                     f"{pipe.num_microbatches} micro-batches' gradients into FP32 outside the backward kernels, "
                     f"{acc:.2f} s of the step ({acc / b.step_time_s:.0%}); larger micro-batches pay it fewer times.")
    fsdp = _fsdp_sentence(b)
    if fsdp:
        lines.append(fsdp)
    s = training.seq_length
    sp = dict(tp=lay.tp, cp=lay.cp, sequence_parallel=lay.sequence_parallel, attention=training.attention,
              etp=lay.expert_tp, saved_gather_bytes=saved_gather_bytes(b.training),
              moe_scores_after_combine=uses_torchtitan(b.training))  # the engine the plan is priced on
    act = activation_bytes_per_layer(model, lay.micro_batch_size, s, **sp)
    half = activation_bytes_per_layer(model, lay.micro_batch_size, max(2 * lay.cp * lay.tp, s // 2), **sp)
    dqk, dv = model.core_head_dims  # the attention core's FLOPs against the layers' [Korthikanti22 Eq. 7]
    attention_layers = (model.layer_pattern.count("*") if model.hybrid else model.num_layers) + model.mtp_layers
    core = 2 * s * model.num_attention_heads * (dqk + dv) * attention_layers
    lines.append(f"Sequence length {s}: one layer's activations are {act / GiB:.2f} GiB per micro-batch per GPU "
                 f"({half / GiB:.2f} GiB at half the length); the attention core is "
                 f"{core / (model_flops_per_token(model, s) / 3):.0%} of the model FLOPs"
                 + (f", of whose score matrix the kernel computes {computed_score_share(model, s, training.document_tokens):.1%}"
                    f" (masked per document of {training.document_tokens} tokens)" if training.document_tokens else "")
                 + (f"; context parallelism {lay.cp} splits the sequence" if lay.cp > 1 else "")
                 + (_attention_speed_clause(model, b.cluster, b.training, lay.cp) if b.training.attention == "flash" else "")
                 + ".")
    head = b.memory_margin_units * 2**20 / b.memory.capacity
    binding = (f"memory binds: {head:.1%} headroom on stage {b.memory.peak_stage.stage} "
               f"(largest item: {b.memory.peak_stage.dominant.name})") if head < 0.05 else \
              f"memory does not bind ({head:.0%} headroom); time does"
    lines.append(f"What binds the chosen plan: {binding}.")
    if training.optimizer_offload:
        lines.append(_offload_sentence(b))
    if r.alternatives:
        nxt = r.alternatives[0]
        lines.append(f"Runner-up {nxt.layout.short()} is {nxt.step_time_s / b.step_time_s - 1:+.1%}.")
        tied = [p for p in r.alternatives if p.tied_with(b)]
        if tied:
            lines.append(f"{len(tied)} of the {len(r.alternatives)} runners-up are tied with the choice: their step times "
                         f"differ by less than the model can rank (80 % of the spread between two layouts on one stack, "
                         f"{e.ranking_sigma:.1%}). To break the tie, run a few steps of each, or calibrate on one log "
                         "(planner calibrate) and re-plan.")
    if sensitivities:
        so = cluster.scaleout.model_copy(update={"nic_busbw": 2 * cluster.scaleout.nic_busbw})
        other = _fp8_alternative(cluster, training, framework)
        if other is not None:
            label = f"FP8 ({other.fp8})" if other.fp8 else "BF16 GEMMs instead of FP8"
            # the gain checked is the low-precision side's, on the chosen plan's stack (its kernels)
            weighed = b.training if b.training.fp8 else b.training.model_copy(update={"fp8": other.fp8})
            lines.append("Sensitivity, " + _sensitivity(label, model, cluster, other, b, framework,
                                                        time_limit_s, constraints)
                         + "; " + fp8_speedup_note(fp8_speedup_check(cluster, weighed, model)) + ".")
        if training.fp8_attention:  # priced at cuDNN's measured FP8 / BF16 speed of the core (cost.fp8_attention_speed)
            f, bw = fp8_attention_speed(model, cluster, training)
            lines.append("Sensitivity, " + _sensitivity(f"BF16 attention (FP8's core runs {f:.2f}x forward, {bw:.2f}x "
                                                        "backward here)", model, cluster,
                                                        training.model_copy(update={"fp8_attention": False}), b,
                                                        framework, time_limit_s, constraints))
        offload = offloaded(cluster, training, framework) if head < 0.05 else None
        if offload is not None:  # memory binds: what the GPU memory Adam's states hold would buy
            lines.append("Sensitivity, " + _sensitivity("optimizer offloaded to the host", model, cluster, offload, b,
                                                        framework, time_limit_s, constraints))
        lines.append("Sensitivity, " + _sensitivity("2x scale-out bandwidth", model, cluster.model_copy(update={"scaleout": so}),
                                                     training, b, framework, time_limit_s, constraints))
        lines.append("Sensitivity, " + _sensitivity("2x GPUs", model, cluster.model_copy(update={"num_nodes": 2 * cluster.num_nodes}),
                                                     training, b, framework, time_limit_s, constraints))
        lines.append("Sensitivity, " + _sensitivity("2x sequence (same tokens per step)", model, cluster,
                                                     training.model_copy(update={"seq_length": 2 * s,
                                                                                 "global_batch_size": max(1, training.global_batch_size // 2)}),
                                                     b, framework, time_limit_s, constraints))
    return lines, r.status
