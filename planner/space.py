"""The legality rules of a layout, shared by evaluate, the CP-SAT search and the enumerator.

Rules are those Megatron-LM enforces (shared/reference/launch-configs.md §2.2) plus the ones it
leaves to run time (ffn % tp, (seq/cp) % tp with SP), each reported with its arithmetic.
"""

from __future__ import annotations

from planner import apex_engine
from planner.deepspeed_engine import overlaps_reduction as deepspeed_overlaps_reduction
from planner.deepspeed_engine import pipeline_split as deepspeed_pipeline_split
from planner.deepspeed_engine import uses_deepspeed, zero0_runs
from planner.deepspeed_engine import wrapper as deepspeed_wrapper
from planner.errors import InvalidLayout, PlannerError, SpecError
from planner.memory import dense_layers_on, stage_layers, symbols_on
from planner.specs import MAX_GPUS, ClusterSpec, Family, Layout, ModelSpec, Recompute, TrainingSpec, num_microbatches
from planner.torchtitan_engine import DEFAULT_END_WEIGHTS, MAX_END_WEIGHT, end_weights, rank_splits, unbuilt_features, uses_torchtitan
from planner.torchtitan_engine import KERNELS as TORCHTITAN_KERNELS
from planner.torchtitan_engine import LOSS_CHUNKS as TORCHTITAN_LOSS_CHUNKS
from planner.torchtitan_engine import stage_split as torchtitan_stage_split

__all__ = ["check_layout", "layout_problems", "num_microbatches", "divisors", "validate_constraints"]

LOSS_KERNELS = {"fused": "flash-attn's loss, llm-foundry's",
                "te": "Transformer Engine's loss, Megatron-Bridge's; megatron-core 0.19.2's launcher rejects it"}
"""The loss kernels TrainingSpec.cross_entropy prices that no launch config turns on."""


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _recompute_module_problems(model: ModelSpec, training: TrainingSpec, lay: Layout) -> list[str]:
    """Megatron's rules for --recompute-modules [megatron-core 0.19.2 transformer/transformer_config.py:
    TransformerConfig.__post_init__] and the planner's pricing limits."""
    return [why for m in lay.recomputed_modules if (why := _recompute_module_problem(model, training, m))]


def _recompute_module_problem(model: ModelSpec, training: TrainingSpec, module: str) -> str | None:
    """Why one recompute module cannot run for this model and training (None: it can)."""
    if module == "moe" and model.moe is None:
        return "recompute_modules 'moe' needs an MoE model (it checkpoints the MoE block)"
    if module == "moe_act" and model.moe is None:
        return "recompute_modules 'moe_act' needs an MoE model (Megatron: only with moe_grouped_gemm)"
    if module == "mla_up_proj" and model.mla is None:
        return "recompute_modules 'mla_up_proj' needs multi-latent attention (Megatron: only with multi_latent_attention)"
    if module == "mlp" and model.family == Family.GPT:
        return "recompute_modules 'mlp' is priced for llama-family (SwiGLU) MLPs only"
    if module in ("moe_act", "layernorm") and training.fp8 == "delayed":
        return (f"recompute_modules '{module}' with fp8='delayed': Megatron refuses it "
                "('Delayed scaling does not support moe_act and layernorm recompute for fp8')")
    return None


def layout_problems(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *, allow_idle: bool = False,
    pipeline_split: bool = True, zero_rules: bool = True,
) -> list[str]:
    """Every rule the layout breaks, each as one line with its arithmetic (empty when legal).

    pipeline_split=False leaves out the stage-layer rules (build_space checks splits on their own);
    zero_rules=False the ZeRO stage's engine rules (build_space offers only what zero_stages allows).
    """
    lay, bad = layout, []
    tp, pp, dp, cp, v = lay.tp, lay.pp, lay.dp, lay.cp, lay.vpp
    world, n = cluster.world_size, lay.world_size
    prod = f"tp({tp})*pp({pp})*dp({dp})*cp({cp})={n}"
    if allow_idle and n > world:
        bad.append(f"{prod} > world_size({world})")
    elif not allow_idle and n != world:
        bad.append(f"{prod} != world_size({world})")
    a, g, f, L = model.num_attention_heads, model.kv_heads, model.ffn_hidden_size, model.num_layers
    if a % tp:
        bad.append(f"num_attention_heads({a}) % tp({tp}) = {a % tp} != 0")
    if g % tp and tp % g:
        bad.append(f"num_kv_heads({g}) and tp({tp}): neither divides the other")
    if f % tp:
        bad.append(f"ffn_hidden_size({f}) % tp({tp}) = {f % tp} != 0")
    gbs, mbs = training.global_batch_size, lay.micro_batch_size
    if gbs % (dp * mbs):
        bad.append(f"global_batch_size({gbs}) % (dp({dp})*micro_batch_size({mbs})) = {gbs % (dp * mbs)} != 0")
    s = training.seq_length
    if why := chunk_problem(model, training):
        bad.append(why)
    if cp > 1 and s % (2 * cp):
        bad.append(f"seq_length({s}) % (2*cp({cp})) = {s % (2 * cp)} != 0")
    if (s // cp) % training.loss_chunks:  # ChunkedLossWrapper splits each rank's local sequence
        bad.append(f"seq_length({s}) / cp({cp}) does not divide into loss_chunks({training.loss_chunks})")
    if cp > 1 and training.attention != "flash":
        bad.append(f"cp({cp}) > 1 needs attention='flash'")
    if lay.sequence_parallel:
        if tp == 1:
            bad.append("sequence_parallel needs tp > 1 (tp(1))")
        elif (s // cp) % tp:
            bad.append(f"(seq_length({s})/cp({cp})) % tp({tp}) = {(s // cp) % tp} != 0 (sequence parallel)")
    if lay.recompute_num_layers is not None and lay.recompute != Recompute.FULL:
        bad.append("recompute_num_layers is only for recompute='full'")
    if lay.recompute == Recompute.OP:
        if not model.op_recompute_priced:
            bad.append(f"recompute 'op' (torchtitan's per-op checkpointing) is priced for dense llama-family "
                       f"models only; {model.name} is not one")
        if lay.tp_comm_overlap and not uses_torchtitan(training):
            bad.append("recompute 'op' is torchtitan's and tp_comm_overlap Transformer Engine's: not one run")
    bad += _recompute_module_problems(model, training, lay)
    if lay.overlap_param_gather and lay.zero_stage == 0:
        bad.append("overlap_param_gather needs the distributed optimizer (zero_stage >= 1)")
    if lay.tp_comm_overlap and not (lay.sequence_parallel and tp > 1):
        bad.append("tp_comm_overlap needs sequence_parallel with tp > 1 (Megatron validate_args)")
    if lay.overlap_p2p and lay.vpp == 1:
        bad.append("overlap_p2p needs the interleaved schedule (vpp > 1)")
    bad += _expert_problems(model, training, lay, zero_rules)
    if model.hybrid:
        bad += _hybrid_problems(model, training, lay)
    if training.optimizer_offload and lay.zero_stage not in offload_zero_stages(training) and zero_rules:
        bad.append(f"optimizer_offload needs {_offload_optimizer(training)}, got zero_stage {lay.zero_stage}")
    if training.optimizer_offload and uses_torchtitan(training) and pp > 1:
        # torchtitan's pipeline keeps every unit gathered and its gradients unsharded on the GPU for
        # the step (memory's fsdp2_pipeline_grads): the per-unshard copies priced are not what it runs
        bad.append(f"optimizer_offload with FSDP2 is priced without pipeline parallelism, got pp {pp}")
    if uses_deepspeed(training) and zero_rules:
        bad += _deepspeed_problems(training, lay)
    if apex_engine.uses_apex(training):
        bad += apex_engine.problems(model, training, lay, zero_rules)
    if model.mla is not None:
        if tp > 1 and not lay.sequence_parallel:
            bad.append(f"multi-latent attention with tp({tp}) > 1 is priced with sequence_parallel only")
        if lay.tp_comm_overlap:
            bad.append("tp_comm_overlap with multi-latent attention is not priced")
        if training.attention != "flash":
            bad.append("multi-latent attention is priced with attention='flash' only")
    if pipeline_split and uses_deepspeed(training) and pp > 1:
        bad += _deepspeed_split_problems(L, pp, lay)
    elif pipeline_split and uses_torchtitan(training) and pp > 1:
        bad += _torchtitan_split_problems(L, pp, v, lay)
    elif pipeline_split and lay.pipeline_layers is not None:
        bad += _explicit_split_problems(L, pp, v, lay)
    elif pipeline_split:
        bad += _pipeline_problems(L, pp, v, lay.first_stage_layers, lay.last_stage_layers)
    if any(training.bf16_end_layers):
        bad += _bf16_rule_problems(model, training, lay)
    if pipeline_split and not bad:
        bad += _dense_first_problems(model, lay) + _bf16_end_problems(model, training, lay)
    if v > 1:
        m = num_microbatches(training, lay)
        if m < pp or m % pp:
            bad.append(f"interleaved schedule: num_microbatches({m}) must be a multiple of pp({pp})")
    return bad


def _hybrid_problems(model: ModelSpec, training: TrainingSpec, lay: Layout) -> list[str]:
    """What a hybrid (layer_pattern) model runs and the planner prices: Megatron's hybrid stack only
    (megatron-core 0.19.2 models/hybrid), its Mamba-2 heads and groups split over TP (ssm/mamba_mixer.py:
    MambaMixer.__init__ asserts nheads % tp and ngroups % tp; under FP8 in_proj's output width a multiple of
    16), without what the hybrid cost terms leave out (CP's Mamba all-to-alls, ZeRO-3, TP overlap)."""
    mb, bad = model.mamba, []
    if uses_deepspeed(training) or uses_torchtitan(training):
        bad.append(f"{model.name}: hybrid Mamba-2 models run on Megatron's hybrid stack only, not "
                   f"{training.optimizer_impl}")
    if mb is not None:
        if mb.num_heads % lay.tp or mb.num_groups % lay.tp:
            bad.append(f"mamba num_heads({mb.num_heads}) and num_groups({mb.num_groups}) must both divide by tp({lay.tp})")
        if training.fp8 is not None and mb.in_proj_width % 16:
            bad.append(f"FP8 needs the Mamba-2 in_proj width 2 d_in + 2 G N + H = {mb.in_proj_width} to be a multiple of 16")
    if lay.cp > 1:
        bad.append(f"cp({lay.cp}) > 1 with Mamba-2 layers is not priced (their context-parallel all-to-alls)")
    if lay.zero_stage == 3:
        bad.append("zero_stage 3 with a hybrid model is not priced")
    if lay.tp_comm_overlap:
        bad.append("tp_comm_overlap with a hybrid model is not priced")
    if lay.vpp > 1 and lay.pipeline_layers is None and (lay.first_stage_layers is not None
                                                        or lay.last_stage_layers is not None):
        bad.append("a hybrid model with interleaving and uneven first/last stages: give pipeline_layers "
                   "(which virtual stage holds which layers)")
    return bad


def _expert_problems(model: ModelSpec, training: TrainingSpec, lay: Layout, zero_rules: bool = True) -> list[str]:
    """Expert-parallel rules: Megatron's (megatron-core 0.19.2 arguments.py validate_args: experts
    divisible by EP; parallel_state.initialize_model_parallel: the expert grid etp x ep x edp divides
    each stage's tp x cp x dp GPUs; moe_layer.MoELayer.forward: TP needs sequence parallelism in
    training) and what the planner prices (ZeRO 2/3 as Megatron-FSDP shards experts, no TP overlap,
    Megatron's default rank order)."""
    ep, etp = lay.ep, lay.expert_tp
    if model.moe is None:
        bad = [f"ep({ep}) / etp({lay.etp}) / moe_dispatcher / ep_overlap need a Mixture-of-Experts model; "
               f"{model.name} is dense"] \
            if ep > 1 or lay.etp is not None or lay.moe_dispatcher != "alltoall" or lay.ep_overlap else []
        if training.moe_capacity_factor is not None:
            bad.append(f"moe_capacity_factor needs a Mixture-of-Experts model; {model.name} is dense")
        return bad
    e, bad = model.moe, []
    if training.moe_pad_to_capacity and lay.moe_dispatcher == "deepep":
        # megatron-core 0.19.2 transformer_config.py: TransformerConfig.__post_init__
        bad.append("moe_pad_to_capacity does not run with the deepep dispatcher (Megatron's flex dispatcher with "
                   "the DeepEP backend does not pad)")
    if (e.layer_step > 1 and lay.vpp > 1 and lay.pipeline_layers is None
            and (lay.first_stage_layers is not None or lay.last_stage_layers is not None)):
        bad.append(f"layer_step({e.layer_step}) with interleaving and uneven first/last stages: give pipeline_layers "
                   "(which virtual stage holds which dense and MoE layers)")
    if e.num_experts % ep:
        bad.append(f"num_experts({e.num_experts}) % ep({ep}) = {e.num_experts % ep} != 0")
    inner = lay.tp * lay.cp * lay.dp
    if inner % (ep * etp):
        bad.append(f"tp({lay.tp})*cp({lay.cp})*dp({lay.dp}) = {inner} is not a multiple of ep({ep})*etp({etp}) "
                   "(the expert grid folds onto each pipeline stage's GPUs)")
    if e.expert_ffn_hidden_size % etp:
        bad.append(f"expert_ffn_hidden_size({e.expert_ffn_hidden_size}) % etp({etp}) != 0")
    if e.shared_expert_ffn_hidden_size % lay.tp:
        bad.append(f"shared_expert_ffn_hidden_size({e.shared_expert_ffn_hidden_size}) % tp({lay.tp}) != 0")
    if lay.tp > 1 and not lay.sequence_parallel:
        bad.append(f"MoE with tp({lay.tp}) > 1 needs sequence_parallel (megatron-core MoELayer.forward)")
    if lay.zero_stage > 1 and uses_deepspeed(training):
        bad.append(f"zero_stage({lay.zero_stage}) with experts is priced as Megatron-FSDP shards them (each "
                   f"layer's experts over the expert-data-parallel group), not {training.optimizer_impl}'s")
    if uses_torchtitan(training):
        bad += _torchtitan_expert_problems(training, lay, zero_rules)
    if lay.tp_comm_overlap:
        bad.append("tp_comm_overlap with MoE layers is not priced")
    if lay.moe_dispatcher == "deepep" and (ep == 1 or etp != 1):
        bad.append(f"moe_dispatcher 'deepep' is priced with ep > 1 and etp 1 (ep({ep}), etp({etp}))")
    if ep > 1 and lay.rank_order != "tp-cp-dp-pp":
        bad.append(f"ep({ep}) > 1 is placed in Megatron's default rank order tp-cp-dp-pp only")
    if lay.ep_overlap:  # megatron-core 0.19.2 transformer_config.py: TransformerConfig.__post_init__
        if ep == 1:
            bad.append("ep_overlap needs ep > 1 (there is no all-to-all to hide)")
        if lay.pp > 1 and lay.vpp == 1:
            bad.append(f"ep_overlap with pp({lay.pp}) > 1 needs interleaving (vpp > 1)")
        if lay.recompute == Recompute.FULL:
            bad.append("ep_overlap does not run with full recompute")
        if "moe" in lay.recomputed_modules:  # megatron-core 0.19.2 transformer_config.py: __post_init__
            bad.append("ep_overlap does not run with recompute_modules 'moe'")
        if model.mtp_layers > 1:
            bad.append(f"ep_overlap runs at most one MTP depth (mtp_layers {model.mtp_layers})")
        if lay.moe_dispatcher == "allgather":
            bad.append("ep_overlap runs with the alltoall or deepep dispatcher, not allgather")
    return bad


def _torchtitan_expert_problems(training: TrainingSpec, lay: Layout, zero_rules: bool = True) -> list[str]:
    """What torchtitan 0.3 runs for an MoE model, as the planner prices it. Its sparse mesh puts the
    routed experts on efsdp x ep, EP borrowing ranks from dp_shard x cp x tp, so experts are never
    TP-sharded beside EP [torchtitan 0.3 config/configs.py: ParallelismConfig.expert_parallel_degree;
    distributed/parallel_dims.py: ParallelDims.build_mesh, efsdp = dp_shard cp tp / ep]; FSDP2 shards
    them over efsdp in the block's unit [distributed/fsdp.py: apply_fsdp_to_decoder]; the standard
    dispatcher is dropless, all-to-all [models/common/token_dispatcher.py: AllToAllTokenDispatcher]."""
    bad = []
    if lay.zero_stage != 3 and zero_rules:  # build_space offers it zero_stage 3 alone
        bad.append(f"torchtitan's MoE is priced with FSDP2 sharding (zero_stage 3), got zero_stage {lay.zero_stage}")
    if lay.expert_tp != 1:
        bad.append(f"torchtitan does not shard experts over TP beside EP (etp 1), got etp {lay.expert_tp}")
    if lay.tp > 1 and lay.ep == 1:
        bad.append(f"torchtitan with tp({lay.tp}) > 1 and ep 1 shards experts over TP, which is not priced; "
                   "give ep > 1")
    if lay.moe_dispatcher != "alltoall" or lay.ep_overlap:
        bad.append("torchtitan is priced with its standard all-to-all dispatcher, without EP overlap")
    if training.moe_capacity_factor is not None:
        bad.append("torchtitan's standard dispatcher is dropless (moe_capacity_factor is Megatron's)")
    if why := torchtitan_moe_workload_problem(training):
        bad.append(why)
    return bad


FLOAT8_EXPERT_ARCHS = (9, 9)
"""Compute-capability majors (lo, hi) on which torchtitan's float8 routed experts run: torchao's
_Float8GroupedMM calls torch._scaled_grouped_mm with row-wise scales, which PyTorch runs on SM90
(Hopper) only -- "CUDA SM90 (H100) only - not supported on SM100 (B200)" [pytorch/pytorch
benchmarks/operator_benchmark/pt/scaled_grouped_mm_test.py; torchtitan 0.3 components/quantization/
float8.py: Float8GroupedExpertsConverter, which asks for SM89+]; Blackwell's grouped experts run
torchao's MXFP8 (fp8='torchao-mxfp8': MXFP8GroupedExpertsConverter)."""


def torchtitan_moe_workload_problem(training: TrainingSpec, cluster: ClusterSpec | None = None) -> str | None:
    """What of an MoE workload torchtitan runs that the planner does not price, one line naming the field.
    Low precision is one torchao recipe in the linears (the router's gate and the LM head in BF16) and the
    routed experts' grouped GEMMs: rowwise float8 (Float8LinearConverter, Float8GroupedExpertsConverter) on
    Hopper only (FLOAT8_EXPERT_ARCHS, checked where the cluster is given), or MXFP8 (MXFP8LinearConverter,
    MXFP8GroupedExpertsConverter; FP8_ARCHS keeps it on Blackwell)."""
    if training.fp8 is not None and training.fp8 not in TORCHTITAN_FP8_RECIPES:
        return (f"training.fp8: torchtitan's MoE runs low-precision routed experts as torchao's rowwise "
                f"(Float8GroupedExpertsConverter) or MXFP8 (MXFP8GroupedExpertsConverter), not '{training.fp8}'")
    lo, hi = FLOAT8_EXPERT_ARCHS
    if training.fp8 == "rowwise" and cluster is not None and not lo <= cluster.gpu.arch <= hi:
        return (f"training.fp8: torchtitan's float8 routed experts (torch._scaled_grouped_mm, row-wise) run on "
                f"compute capability 9.x only; {cluster.gpu.name} is {cluster.gpu.arch}.x (Blackwell: fp8='torchao-mxfp8')")
    if training.optimizer_offload:
        return "training.optimizer_offload: FSDP2's CPU offload with experts is not priced"
    return None


def first_rank_min_layers(model: ModelSpec, training: TrainingSpec, vpp: int) -> int:
    """The fewest layers the first pipeline rank may hold: an MoE model's leading dense layers and
    the BF16 first layers (TrainingSpec.bf16_first_layers) sit in its first virtual stage (the planner
    prices them there), which holds ceil(n / vpp) of its n layers (pipeline_layers: the first chunks
    take the remainder)."""
    k = max(model.moe.first_dense_layers if model.moe is not None else 0,
            training.bf16_end_layers[0])
    return (k - 1) * vpp + 1 if k else 1


def last_rank_min_layers(training: TrainingSpec, vpp: int) -> int:
    """The fewest layers the last pipeline rank may hold: the BF16 last layers sit in its last
    virtual stage, which holds floor(n / vpp) of its n layers."""
    k = training.bf16_end_layers[1]
    return k * vpp if k else 1


def _bf16_end_problems(model: ModelSpec, training: TrainingSpec, lay: Layout) -> list[str]:
    """Without an explicit split the BF16 first/last layers are priced on the first and last rank:
    their first and last virtual stages must hold them."""
    k1, k2 = training.bf16_end_layers
    if not (k1 or k2) or lay.pipeline_layers is not None or model.hybrid:  # a hybrid's split is fixed: they fall
        return []  # where it puts them (memory.bf16_kinds_on)
    n = stage_layers(model, lay)
    if lay.pp * lay.vpp == 1:
        return [f"bf16_first_layers({k1}) + bf16_last_layers({k2}) > num_layers({model.num_layers})"] \
            if k1 + k2 > model.num_layers else []
    first = -(-n[0] // lay.vpp) if lay.first_stage_layers is None else n[0] // lay.vpp
    last = n[-1] // lay.vpp
    bad = []
    if first < k1:
        bad.append(f"the first virtual stage holds {first} layers, fewer than bf16_first_layers({k1}); "
                   "give pipeline_layers to place them over several stages")
    if last < k2:
        bad.append(f"the last virtual stage holds {last} layers, fewer than bf16_last_layers({k2}); "
                   "give pipeline_layers to place them over several stages")
    return bad


def _bf16_rule_problems(model: ModelSpec, training: TrainingSpec, lay: Layout) -> list[str]:
    """BF16 first/last layers: Megatron's option (dense, MoE and hybrid layers alike, memory.bf16_kinds_on);
    at most num_layers // pp each (megatron-core 0.19.2 TransformerConfig.__post_init__:
    max_bf16_layers_per_pipeline_stage)."""
    bad, most = [], model.num_layers // lay.pp
    if uses_deepspeed(training) or uses_torchtitan(training):
        bad.append("bf16_first_layers / bf16_last_layers are Megatron's (--first-last-layers-bf16)")
    for name, k in zip(("bf16_first_layers", "bf16_last_layers"), training.bf16_end_layers):
        if k > most:
            bad.append(f"{name}({k}) > num_layers({model.num_layers}) // pp({lay.pp}) = {most} (Megatron's limit)")
    return bad


def _dense_first_problems(model: ModelSpec, lay: Layout) -> list[str]:
    """Without an explicit split the leading dense layers are priced on the first rank: its first
    virtual stage must hold them (an explicit split places them wherever it puts the first layers)."""
    k = model.moe.first_dense_layers if model.moe is not None else 0
    if not k or lay.pp == 1 or lay.pipeline_layers is not None:
        return []
    n0 = stage_layers(model, lay)[0]
    first = -(-n0 // lay.vpp) if lay.first_stage_layers is None else n0 // lay.vpp
    if first < k:
        return [f"the first virtual stage holds {first} layers, fewer than the {k} leading dense layers "
                f"(first_dense_layers); give pipeline_layers to place them over several stages"]
    return []


def _middle_ranks_differ(model: ModelSpec, lay: Layout) -> bool:
    """Whether the even split gives the middle pipeline ranks different dense-layer counts (dense
    layers between MoE ones, MoESpec.layer_step, with chunks not aligned to the pattern): the search
    prices every middle rank as one (cpsat._positions), so such shapes are left to evaluate."""
    if model.hybrid and lay.pp >= 4:
        return len({tuple(sorted(symbols_on(model, lay, r).items())) for r in range(1, lay.pp - 1)}) > 1
    if model.moe is None or model.moe.layer_step == 1 or lay.pp < 4:
        return False
    return len({dense_layers_on(model, lay, r) for r in range(1, lay.pp - 1)}) > 1


def _deepspeed_split_problems(L: int, pp: int, lay: Layout) -> list[str]:
    """DeepSpeed's pipeline engine places the layers itself (deepspeed_engine.pipeline_split): a
    layout runs on it only with that split, given or left to evaluate (framework_layout)."""
    if pp > L:
        return [f"pp({pp}) > num_layers({L}): DeepSpeed's pipeline engine would leave stages without a decoder layer"]
    if lay.vpp > 1:
        return [f"vpp({lay.vpp}) > 1: DeepSpeed's pipeline engine has no interleaved schedule"]
    ds = deepspeed_pipeline_split(L, pp)
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
        return [f"DeepSpeed's pipeline engine places the layers itself ({', '.join(map(str, ds))}: PipelineModule "
                "partition_method='type:transformer'); first_stage_layers / last_stage_layers are not what it runs"]
    split = lay.pipeline_layers if lay.pipeline_layers is not None else (L // pp,) * pp if L % pp == 0 else None
    if split != ds:
        given = "no split (pass it, or let evaluate fill it)" if split is None else f"pipeline_layers {list(split)}"
        return [f"DeepSpeed's pipeline engine places {L} layers on pp({pp}) as {list(ds)} (PipelineModule "
                f"partition_method='type:transformer'); {given} is not what it runs"]
    return []


def _torchtitan_split_problems(L: int, pp: int, v: int, lay: Layout) -> list[str]:
    """torchtitan places the layers from two weights (torchtitan_engine.stage_split): a layout runs on
    it only with a split those weights make, given or left to evaluate (framework_layout)."""
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
        return ["torchtitan places the layers from its first/last stage weights; give pipeline_layers (layers per "
                "virtual stage), not first_stage_layers / last_stage_layers"]
    if lay.pipeline_layers is None:
        if L % (pp * v) == 0:
            return []
        return [f"num_layers({L}) does not divide over pp({pp}) x vpp({v}) and torchtitan's default weights "
                f"{DEFAULT_END_WEIGHTS} cannot be launched on {pp * v} stages; give pipeline_layers"]
    bad = _explicit_split_problems(L, pp, v, lay)
    if bad:
        return bad
    if end_weights(L, pp, v, lay.pipeline_layers) is None:
        return [f"pipeline_layers {list(lay.pipeline_layers)} is not a split torchtitan makes on pp({pp}) x vpp({v}) "
                f"stages: it deals num_layers + first/last stage weights (0-{MAX_END_WEIGHT}) evenly, the remainder "
                "to the first stages (torchtitan 0.3 _generate_llm_fqn_per_model_part)"]
    return []


def framework_layout(training: TrainingSpec, layout: Layout, num_layers: int) -> tuple[Layout, str | None]:
    """The layout as the training's engine runs it, and a note where that fills something in: a
    pipeline whose stages do not divide the layers takes the split the engine computes -- DeepSpeed's
    (deepspeed_engine.pipeline_split) or torchtitan's with its default weights
    (torchtitan_engine.stage_split) -- or, on Megatron's engine, the one its
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split flags make where the layers
    and the two ends divide (account_for_ends_split: Llama-3.1-405B's 126 layers over 16 stages)."""
    pp, v = layout.pp, layout.vpp
    given = (layout.pipeline_layers is not None or layout.first_stage_layers is not None
             or layout.last_stage_layers is not None)
    if given or pp == 1:
        return layout, None
    if uses_deepspeed(training) and pp <= num_layers and num_layers % pp:
        split = deepspeed_pipeline_split(num_layers, pp)
        note = (f"layers split as DeepSpeed's pipeline engine places them: {', '.join(map(str, split))} "
                "(PipelineModule partition_method='type:transformer', Megatron-DeepSpeed's GPTModelPipe)")
        return layout.model_copy(update={"pipeline_layers": split}), note
    if uses_torchtitan(training) and num_layers % (pp * v):
        try:
            split = torchtitan_stage_split(num_layers, pp * v, *DEFAULT_END_WEIGHTS)
        except SpecError:
            return layout, None  # _torchtitan_split_problems says why
        if end_weights(num_layers, pp, v, split) is None:
            return layout, None
        note = (f"layers split as torchtitan places them with its default first/last stage weights "
                f"{DEFAULT_END_WEIGHTS}: {', '.join(map(str, split))} per virtual stage "
                "(torchtitan 0.3 _generate_llm_fqn_per_model_part)")
        return layout.model_copy(update={"pipeline_layers": split}), note
    if training.optimizer_impl not in FRAMEWORK_ENGINES.values():
        ends = account_for_ends_split(num_layers, pp * v)
        if ends is not None:
            note = (f"{num_layers} layers do not divide over pp({pp}) x vpp({v}); priced with Megatron's "
                    f"--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split split "
                    f"({ends[0]}|{ends[1]}|...|{ends[-1]}), emitted as --pipeline-model-parallel-layout")
            return layout.model_copy(update={"pipeline_layers": ends}), note
    return layout, None


def _explicit_split_problems(L: int, pp: int, v: int, lay: Layout) -> list[str]:
    """Rules of an explicit split (Megatron's PipelineParallelLayerLayout.validate_layer_layout)."""
    split = lay.pipeline_layers
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
        return ["pipeline_layers replaces first_stage_layers / last_stage_layers: give one or the other"]
    if len(split) != pp * v:
        return [f"pipeline_layers has {len(split)} entries; it needs pp({pp})*vpp({v}) = {pp * v}"]
    if sum(split) != L:
        return [f"pipeline_layers sum to {sum(split)} != num_layers({L})"]
    empty = [r for r in range(pp) if not any(split[c * pp + r] for c in range(v))]
    if empty:
        return [f"pipeline rank {empty[0]} would hold no decoder layer (pipeline_layers {list(split)})"]
    return []


def _pipeline_problems(L: int, pp: int, v: int, first: int | None, last: int | None) -> list[str]:
    bad = []
    if v > 1 and pp == 1:
        bad.append(f"vpp({v}) > 1 needs pp > 1")
    if first is None and last is None:
        if L % pp:
            bad.append(f"num_layers({L}) % pp({pp}) = {L % pp} != 0 (give the split: pipeline_layers, the CLI's "
                       "--pipeline-layers, which also reads Megatron's --pipeline-model-parallel-layout strings)")
        elif (L // pp) % v:
            bad.append(f"layers per stage({L // pp}) % vpp({v}) = {(L // pp) % v} != 0")
        return bad
    if pp == 1:
        return bad + ["uneven first/last stage layers need pp > 1"]
    middle = pp - (first is not None) - (last is not None)
    rest = L - (first or 0) - (last or 0)
    if rest < 0 or (middle == 0 and rest != 0):
        return bad + [f"first({first}) + last({last}) layers must equal num_layers({L}) with pp({pp})"]
    if middle and (rest <= 0 or rest % middle):
        return bad + [f"remaining layers({rest}) % middle stages({middle}) != 0"]
    per = [x for x in (first, last, rest // middle if middle else None) if x is not None]
    if any(x % v for x in per):
        bad.append(f"stage layer counts {per} must each be divisible by vpp({v})")
    return bad


FP8_ARCHS = {"delayed": (9, 99), "tensorwise": (9, 99), "blockwise": (9, 99), "mxfp8": (10, 11), "nvfp4": (10, 99),
             "rowwise": (9, 99), "torchao-tensorwise": (9, 99), "torchao-mxfp8": (10, 99)}
"""Compute-capability majors (lo, hi) each FP8 recipe runs on: Transformer Engine's
_compute_fp8_support (>= 9.0; Ada 8.9 is not a catalogued GPU), _compute_fp8_block_scaling_support
(>= 9.0 with CUDA >= 12.9), _compute_mxfp8_support (10.x and 11.x; not 12.0+), _compute_nvfp4_support (>= 10.0)
[NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/quantization.py]; torchao's rowwise
and tensor-wise float8 need Hopper's FP8 tensor cores too, its MXFP8 SM100 or later (torchtitan 0.3
components/quantization/mx.py: MXFP8LinearConverter, "MXFP8 is only supported on SM100 or later")."""


def account_for_ends_split(layers: int, stages: int) -> tuple[int, ...] | None:
    """Where the layers do not divide over the pp x vpp stages but layers + 2 do, the split Megatron
    makes with --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split:
    the embedding and the loss each count as a layer, so the first and last virtual stage hold one
    layer fewer (NeMo's Llama-3.1-405B recipes: 126 layers over 64 virtual stages = 1, 2, ..., 2, 1)
    [Megatron-LM@d98e8a6 megatron/core/transformer/transformer_config.py:
    account_for_embedding_in_pipeline_split]; None otherwise."""
    if stages == 1 or layers % stages == 0 or (layers + 2) % stages:
        return None
    k = (layers + 2) // stages
    return (k - 1, *[k] * (stages - 2), k - 1)


def check_precision(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """Refuse an FP8 recipe the GPU cannot run or the catalog cannot price (one line, named)."""
    if training.fp8 is None:
        return
    lo, hi = FP8_ARCHS[training.fp8]
    gpu = cluster.gpu
    if not lo <= gpu.arch <= hi:
        raise PlannerError(f"training.fp8: recipe '{training.fp8}' needs compute capability {lo}.x"
                           + (f" to {hi}.x" if hi < 99 else " or newer") + f"; {gpu.name} is {gpu.arch}.x")
    if training.fp8 == "nvfp4" and gpu.peak_fp4_flops is None:
        raise PlannerError(f"training.fp8: cluster '{cluster.name}' has no FP4 peak (gpu.peak_fp4_flops); add it to price NVFP4")
    if gpu.peak_fp8_flops is None or cluster.calibration.gemm_efficiency_fp8 is None:
        raise PlannerError(f"training.fp8: cluster '{cluster.name}' has no measured FP8 GEMM curve "
                           "(calibration.gemm_efficiency_fp8) or FP8 peak (gpu.peak_fp8_flops); add them to price FP8")


def default_fp8_recipe(cluster: ClusterSpec, framework: str | None = None) -> str:
    """The FP8 recipe 'FP8' means on this GPU when no recipe is named: for torchtitan its float8
    converter's default, torchao's rowwise, on Hopper, and torchao's MXFP8 on Blackwell, whose float8 routed
    experts torch runs on Hopper only and whose rowwise GEMMs gained 4 % over BF16 on Llama-3-8B where MXFP8
    gained 16-20 % (TORCHTITAN_FP8_RECIPES; torchao prototype/mx_formats/README.md, 8 B200); else Megatron's
    default on Hopper (delayed scaling: TransformerConfig.fp8_recipe), MXFP8 on Blackwell (the only FP8
    recipe Transformer Engine's Blackwell path and Megatron-Bridge's Blackwell presets use)."""
    if framework == "torchtitan":
        return "torchao-mxfp8" if cluster.gpu.arch >= 10 else "rowwise"
    return "mxfp8" if cluster.gpu.arch in (10, 11) else "delayed"


TORCHTITAN_FP8_RECIPES = ("rowwise", "torchao-mxfp8")
"""The low-precision recipes torchtitan 0.3 runs that the planner prices: Float8LinearConverter.Config's
recipe_name takes 'rowwise' (its default) or 'rowwise_with_gw_hp' (weight gradients in high
precision, not priced); torchao's tensor-wise scaling is no longer offered there [torchtitan 0.3
components/quantization/float8.py: Float8LinearConverter.Config]; MXFP8LinearConverter and
MXFP8GroupedExpertsConverter run torchao's MXFP8 (components/quantization/mx.py). NVFP4 is not priced."""


def offloaded(cluster: ClusterSpec, training: TrainingSpec, framework: str | None) -> TrainingSpec | None:
    """The same workload with the whole optimizer shard on the host (Megatron's optimizer CPU offload,
    DeepSpeed's ZeRO-Offload, or FSDP2's CPU offload under torchtitan), where the cluster has a host
    spec, the workload can offload and the target runs it; else None (already offloaded, BF16 states,
    FP8 weights gathered outside delayed scaling). DeepSpeed accumulating 16-bit gradients offloads at
    ZeRO-3 only (offload_zero_stages)."""
    if training.optimizer_offload or cluster.host is None:
        return None
    try:
        candidate = TrainingSpec.model_validate({**training.model_dump(), "optimizer_offload": 1.0})
        framework_training(candidate, framework)  # the target's own rules
        return candidate
    except (ValueError, PlannerError):
        return None


def check_offload(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """Refuse optimizer offload where the cluster says nothing about its hosts (one line, named)."""
    if training.optimizer_offload and cluster.host is None:
        raise PlannerError(f"training.optimizer_offload: cluster '{cluster.name}' has no host spec (host: memory, "
                           "memory_bandwidth, link_bandwidth, cores); add it to price CPU offload")


def check_layout(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *, allow_idle: bool = False
) -> None:
    """Raise InvalidLayout naming every broken rule with its arithmetic, on one line (a layout with several
    mistakes is fixed in one go)."""
    check_precision(cluster, training)
    check_offload(cluster, training)
    if uses_torchtitan(training) and model.moe is not None and (why := torchtitan_moe_workload_problem(training, cluster)):
        raise PlannerError(why)
    bad = layout_problems(model, cluster, training, layout, allow_idle=allow_idle)
    if bad:
        raise InvalidLayout("invalid layout: " + "; ".join(bad))


# ---------------------------------------------------------------------------------------------
# The candidate space: shared by the CP-SAT search and the exhaustive enumerator
# ---------------------------------------------------------------------------------------------

import math  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from typing import Any  # noqa: E402



FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "any")
MAX_MICRO_BATCH = 8
# ASSUMPTION: micro-batches above 8 sequences rarely raise GEMM efficiency further and only add
# activation memory; a user can widen the range with micro_batch_size=(lo, hi).
MIN_CP_CHUNK = 4096
# ASSUMPTION: context parallelism is searched only while each rank keeps >= 4096 tokens of the
# sequence (shorter chunks leave ring attention bound by its K/V exchange and kernel overheads the
# cost model does not price). NVIDIA's Llama-3.1-405B recipe at seq 8192 on H100 stops at CP 2
# (NVIDIA/dgxc-benchmarking llama3.1/README.md: TP8 PP8 CP2 VP8).
MAX_VPP = 8
# ASSUMPTION: more than 8 virtual stages per rank multiplies p2p traffic for a bubble that is
# already small; widen with vpp=(1, N).


def _bound_texts(capped: set[str], max_cp: int) -> tuple[str, ...]:
    """The ASSUMPTION caps above that cut candidates from a space (build_space records which), each with the
    constraint that widens it: a plan is optimal over the space they leave, so a report names them."""
    texts = {"micro_batch_size": f"micro-batch <= {MAX_MICRO_BATCH} (micro_batch_size=(1, N) widens it)",
             "vpp": f"vpp <= {MAX_VPP} (vpp=(1, N) widens it)",
             "cp": f"cp <= {max_cp}: at least {MIN_CP_CHUNK} tokens a rank (cp=(1, N) widens it)"}
    return tuple(text for key, text in texts.items() if key in capped)


@dataclass(frozen=True)
class Shape:
    """The structural part of a layout: degrees, micro-batch, interleaving, sequence parallel."""

    tp: int
    pp: int
    dp: int
    cp: int
    mbs: int
    vpp: int
    sp: bool
    ep: int = 1
    etp: int | None = None
    """Expert degrees (MoE; etp None = tp)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (Layout.moe_dispatcher)."""
    ep_overlap: bool = False
    """MoE: Megatron's combined 1F1B (Layout.ep_overlap)."""


@dataclass(frozen=True)
class Space:
    """Every candidate the search may choose from, in a fixed (deterministic) order.

    A candidate is a configuration (shape, recompute, ZeRO stage) with a split of the layers over
    the pipeline ranks: any split with at least one layer per rank where the target places layers
    freely (free_split; Megatron's --pipeline-model-parallel-layout), else the splits the target
    makes itself (fixed_splits: DeepSpeed's, torchtitan's) or the even one."""

    shapes: tuple[Shape, ...]
    recomputes: dict[tuple[int, int], tuple[tuple, ...]]
    """(pp, vpp) -> (mode, recompute_num_layers) options; a selective option may carry its
    recompute_modules third (offered_recompute_modules)."""
    zeros: dict[int, tuple[int, ...]]
    """pp -> ZeRO stages the target framework allows."""
    num_layers: int = 1
    free_split: bool = True
    """Any per-rank layer counts (else fixed_splits': the even one, DeepSpeed's, or torchtitan's)."""
    first_last_only: bool = False
    """Only the first and last rank may differ, the middle ranks hold equal counts (what Megatron's
    --decoder-first/last-pipeline-num-layers express; of torchtitan's splits, those)."""
    rank_order: str = "tp-cp-dp-pp"
    """Rank placement used for every candidate."""
    allow_idle: bool = False
    """Candidates may leave GPUs idle (tp*pp*dp*cp divides the world size)."""

    framework: str | None = "megatron"
    """The launch target, which decides the overlaps each candidate runs with (overlaps())."""
    framework_tp_overlap: bool = True
    """Sequence-parallel candidates run --tp-comm-overlap where the target offers it (not priced for MoE)."""
    training: TrainingSpec | None = None
    """The workload, whose engine decides DeepSpeed's gradient overlap (overlaps())."""
    engine_weights: bool = True
    """On torchtitan: the plan chooses its first/last stage weights (else the even split only)."""
    bounds: tuple[str, ...] = ()
    """The default caps (MAX_MICRO_BATCH, MAX_VPP, MIN_CP_CHUNK) that cut candidates from this space."""

    def layouts(self, shape: Shape, split: tuple[int, ...] | None, rc, zero) -> Layout:
        """The Layout of one candidate; split: layers per pipeline rank (None: even)."""
        return Layout(tp=shape.tp, pp=shape.pp, dp=shape.dp, cp=shape.cp, micro_batch_size=shape.mbs,
                      vpp=shape.vpp, sequence_parallel=shape.sp, ep=shape.ep, etp=shape.etp,
                      moe_dispatcher=shape.dispatcher, ep_overlap=shape.ep_overlap,
                      pipeline_layers=self.virtual_split(shape.pp, shape.vpp, split),
                      recompute=rc[0], recompute_num_layers=rc[1], recompute_modules=rc[2] if len(rc) > 2 else None,
                      zero_stage=zero,
                      rank_order=self.rank_order,
                      **overlaps(self.framework, shape.pp, zero, shape.vpp, shape.sp and self.framework_tp_overlap,
                                 self.training))

    def rc_options(self, shape: Shape) -> tuple[tuple[str, int | None], ...]:
        """The (mode, recompute_num_layers) options of a shape: its (pp, vpp)'s, less full recompute
        under ep_overlap (Megatron refuses the pair)."""
        options = self.recomputes[(shape.pp, shape.vpp)]
        return tuple(o for o in options if o[0] != "full") if shape.ep_overlap else options

    def fixed_splits(self, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
        """Without free_split, the per-rank splits a configuration with pp ranks of vpp chunks runs:
        DeepSpeed's where the training runs its engine, torchtitan's (every split its first/last
        stage weights make, torchtitan_engine.rank_splits) where it runs torchtitan -- both place
        the layers themselves -- else the even one."""
        if self.training is not None and uses_deepspeed(self.training):
            return (deepspeed_pipeline_split(self.num_layers, pp),)
        even = (self.num_layers // pp,) * pp
        if self.training is not None and uses_torchtitan(self.training) and pp > 1:
            if not self.engine_weights:  # every virtual stage equal (weights 0 and 0)
                return (even,) if self.num_layers % (pp * vpp) == 0 else ()
            return tuple(c for c in rank_splits(self.num_layers, pp, vpp)
                         if not self.first_last_only or len(set(c[1:-1])) <= 1)
        return (even,)

    def virtual_split(self, pp: int, vpp: int, split: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Layout.pipeline_layers of a per-rank split: torchtitan's own placement over the virtual
        stages where it runs (None for the even one), else pipeline_layers'."""
        if (split is not None and pp > 1 and self.training is not None and uses_torchtitan(self.training)
                and not self.free_split):
            virtual = rank_splits(self.num_layers, pp, vpp)[split]
            return None if len(set(virtual)) == 1 else virtual
        return pipeline_layers(self.num_layers, pp, vpp, split)

    def splits(self, pp: int, vpp: int = 1) -> int:
        """Number of layer splits a configuration with pp ranks (vpp chunks each) ranges over."""
        if not self.free_split:
            return len(self.fixed_splits(pp, vpp))
        if self.first_last_only and pp > 2:  # middle count k, then first + last = L - (pp-2)k, each >= 1
            return sum(max(0, self.num_layers - (pp - 2) * k - 1) for k in range(1, self.num_layers // (pp - 2) + 1))
        return math.comb(self.num_layers - 1, pp - 1)

    def size(self) -> int:
        """Number of full candidate layouts (configurations x splits)."""
        return sum(self.splits(s.pp, s.vpp) * len(self.rc_options(s)) * len(self.zeros[s.pp])
                   for s in self.shapes)


def pipeline_layers(num_layers: int, pp: int, vpp: int, split: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Layout.pipeline_layers for per-rank layer counts: None when the split is even and Megatron's
    plain flags express it (every virtual stage equal), else each rank's layers spread over its
    vpp chunks, the first chunks taking the remainder (stage i on rank i % pp, chunk i // pp)."""
    if split is None:
        return None
    if len(split) != pp or sum(split) != num_layers:
        raise PlannerError(f"internal: split {split} does not place {num_layers} layers on {pp} ranks")
    if len(set(split)) == 1 and split[0] % vpp == 0:
        return None
    out = [0] * (pp * vpp)
    for r, n in enumerate(split):
        for c in range(vpp):
            out[c * pp + r] = n // vpp + (1 if c < n % vpp else 0)
    return tuple(out)


def _allowed(name: str, value: int | bool | str, constraints: dict[str, Any]) -> bool:
    if name not in constraints or constraints[name] is None:
        return True
    rule = constraints[name]
    if isinstance(rule, tuple) and len(rule) == 2 and not isinstance(value, (bool, str)):
        lo, hi = rule
        return (lo is None or value >= lo) and (hi is None or value <= hi)
    if isinstance(rule, (list, set, frozenset)):
        return value in rule
    return value == rule


CONSTRAINT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "moe_dispatcher", "ep_overlap", "zero_stage", "micro_batch_size",
                   "recompute", "vpp", "sequence_parallel", "uneven_stages", "rank_order")
_INT_KEYS = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "micro_batch_size": 1, "zero_stage": 0}
_BOOL_KEYS = ("sequence_parallel", "uneven_stages", "partial_recompute")
RANK_ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp")
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")


def _whole(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise PlannerError(f"constraint {name}: expected a whole number from {lo} to {hi}, "
                           f"a (lo, hi) range or a list of them, got {v!r}")
    return v


def validate_constraints(constraints: dict[str, Any]) -> dict[str, Any]:
    """Check every constraint's type and range; returns them normalised (lists become frozensets).

    Degrees and micro-batch: N, (lo, hi) with None for an open end, or a list/set of N; zero_stage
    likewise in 0..3; recompute: a mode or a list of modes; sequence_parallel: bool; uneven_stages:
    bool or 'first_last' (only the first and last rank differ); ep_overlap: True, False (the default,
    Megatron's) or 'both' (searched where Megatron allows it); rank_order: one of RANK_ORDERS;
    moe_dispatcher: one of MOE_DISPATCHERS or a list of them.

    Raises:
        PlannerError: one line naming the constraint and the rule.
    """
    out: dict[str, Any] = {}
    for name, rule in constraints.items():
        if rule is None:
            continue
        if name in _INT_KEYS:
            lo, hi = _INT_KEYS[name], (3 if name == "zero_stage" else MAX_GPUS)
            if isinstance(rule, tuple) and len(rule) == 2:
                a, b = (None if x is None else _whole(name, x, lo, hi) for x in rule)
                if a is not None and b is not None and a > b:
                    raise PlannerError(f"constraint {name}: range ({a}, {b}) is empty (lo > hi)")
                out[name] = (a, b)
            elif isinstance(rule, (list, set, frozenset, tuple)):
                if not rule:
                    raise PlannerError(f"constraint {name}: an empty list allows nothing")
                out[name] = frozenset(_whole(name, x, lo, hi) for x in rule)
            else:
                out[name] = _whole(name, rule, lo, hi)
        elif name == "recompute":
            modes = [rule] if isinstance(rule, (str, Recompute)) else rule
            if not isinstance(modes, (list, set, frozenset, tuple)) or not modes or any(
                    str(m) not in RECOMPUTE_MODES for m in modes):
                raise PlannerError(f"constraint recompute: expected 'none', 'selective', 'full', 'op' or a list of "
                                   f"them, got {rule!r}")
            out[name] = frozenset(str(m) for m in modes)
        elif name == "uneven_stages" and rule == "first_last":
            out[name] = rule
        elif name == "ep_overlap":
            if rule not in (True, False, "both") or not isinstance(rule, (bool, str)):
                raise PlannerError(f"constraint ep_overlap: expected True, False or 'both', got {rule!r}")
            out[name] = rule
        elif name in _BOOL_KEYS:
            if not isinstance(rule, bool):
                raise PlannerError(f"constraint {name}: expected True or False, got {rule!r}")
            out[name] = rule
        elif name == "moe_dispatcher":
            values = [rule] if isinstance(rule, str) else rule
            if not isinstance(values, (list, set, frozenset, tuple)) or not values or any(
                    v not in MOE_DISPATCHERS for v in values):
                raise PlannerError(f"constraint moe_dispatcher: expected {' or '.join(MOE_DISPATCHERS)} or a list of "
                                   f"them, got {rule!r}")
            out[name] = frozenset(values)
        elif name == "rank_order":
            if rule not in RANK_ORDERS:
                raise PlannerError(f"constraint rank_order: expected one of {', '.join(RANK_ORDERS)}, got {rule!r}")
            out[name] = rule
        else:
            raise PlannerError(f"unknown constraint {name!r}; known: {', '.join(CONSTRAINT_KEYS)}")
    return out


def _deepspeed_problems(training: TrainingSpec, lay: Layout) -> list[str]:
    """What DeepSpeed's engine would not run as the layout says (planner.deepspeed_engine)."""
    try:
        wrapper = deepspeed_wrapper(training, lay)
    except SpecError as err:
        return [str(err)]
    bad = []
    if lay.overlap_grad_reduce and not (deepspeed_overlaps_reduction(training, lay.zero_stage) and lay.pp == 1):
        bad.append(f"overlap_grad_reduce: DeepSpeed's {wrapper} at zero_stage "
                   f"{lay.zero_stage} with pp({lay.pp}) reduces the gradients after the backward (no overlap_comm)")
    if lay.overlap_param_gather and lay.zero_stage < 3:
        bad.append("overlap_param_gather: DeepSpeed's ZeRO-1/2 gathers the weights after the step, not overlapped")
    return bad


FRAMEWORK_ENGINES = {"deepspeed": "deepspeed", "torchtitan": "fsdp2"}
"""The optimizer engine (TrainingSpec.optimizer_impl) each launch target runs; Megatron's is the default."""


def framework_training(training: TrainingSpec, framework: str | None) -> TrainingSpec:
    """The workload as the launch target runs it: framework='deepspeed' prices DeepSpeed's engine
    and 'torchtitan' FSDP2 (TrainingSpec.optimizer_impl, FRAMEWORK_ENGINES); 'any' keeps what the
    training says.

    Raises:
        PlannerError: optimizer_impl names an engine the target does not run.
    """
    impl = training.optimizer_impl
    if framework in (None, "any"):
        return training
    runs = FRAMEWORK_ENGINES.get(framework)
    if impl not in (None, runs):
        raise PlannerError(f"training.optimizer_impl: '{impl}' is not the engine framework '{framework}' runs "
                           f"({runs or 'megatron'}; leave it unset or use framework='any')")
    update = {"optimizer_impl": runs} if runs and impl is None else {}
    if framework == "torchtitan" and training.kernels != TORCHTITAN_KERNELS:
        if "kernels" in training.model_fields_set:
            raise PlannerError(f"training.kernels: torchtitan runs PyTorch's kernels (compiled), priced as "
                               f"'{TORCHTITAN_KERNELS}', not '{training.kernels}' (Megatron / Transformer Engine's)")
        update["kernels"] = TORCHTITAN_KERNELS
    if framework == "torchtitan" and training.grad_dtype != "fp32":
        # its FSDP2 mixed-precision policy reduces in training.mixed_precision_reduce, which takes
        # only "float32" [torchtitan 0.3 config/configs.py]
        raise PlannerError(f"training.grad_dtype: torchtitan reduces and keeps gradients in FP32 "
                           f"(mixed_precision_reduce float32), not '{training.grad_dtype}'")
    if framework == "torchtitan" and training.loss_chunks != TORCHTITAN_LOSS_CHUNKS:
        if "loss_chunks" in training.model_fields_set:
            raise PlannerError(f"training.loss_chunks: torchtitan's registry configs run the loss in "
                               f"{TORCHTITAN_LOSS_CHUNKS} chunks (ChunkedLossWrapper), not {training.loss_chunks}")
        update["loss_chunks"] = TORCHTITAN_LOSS_CHUNKS
    if (update.get("optimizer_impl") in ("deepspeed", "fsdp2") and training.optimizer_offload) or "loss_chunks" in update:
        return TrainingSpec(**{**training.model_dump(exclude_unset=True), **update})  # their rules (SpecError)
    return training.model_copy(update=update) if update else training


def overlaps(framework: str | None, pp: int, zero: int, vpp: int = 1, sp: bool = False,
             training: TrainingSpec | None = None) -> dict[str, bool | None]:
    """The overlap fields of a Layout a searched plan runs with: what the target offers
    (overlap_p2p None = Megatron's default: on with interleaving).

    Overlap never costs time in the model (an exposed collective only shrinks), so the search does
    not branch on it; the emitters turn on exactly these flags.
    Megatron (and 'any'): --overlap-grad-reduce always, --overlap-param-gather with the distributed
    optimizer, and p2p overlap for interleaving (its default). DeepSpeed: overlap_comm for ZeRO-1/2
    without its pipeline engine (the emitter keeps it off with pp > 1); no parameter-gather overlap
    for ZeRO-1/2; no interleaving. torchtitan: replicate (ZeRO-0) is FSDP2 over a replicate x 1
    mesh (torchtitan 0.3 models/llama3/parallelize.py: apply_fsdp_to_decoder always runs), which
    reduces each unit's gradient as its backward ends -- except under its pipeline, whose schedule
    turns gradient sync off until every micro-batch is done and then reduces, exposed [torch
    distributed/pipelining/stage.py: backward_maybe_with_nosync, perform_reduce_grad]; FSDP2's
    prefetch is priced by calibration.dp_overlap; its interleaved schedule batches p2p between
    chunks rather than overlapping it.
    With sequence parallelism, --tp-comm-overlap (Transformer Engine) for Megatron, async TP
    (--compile.enable_async_tensor_parallel) for torchtitan.
    """
    if framework == "deepspeed":  # its ZeRO optimizer only: BF16_Optimizer all-reduces after the backward
        grad = zero in (1, 2) and pp == 1 and (training is None or deepspeed_overlaps_reduction(training, zero))
        param, p2p = False, None
    elif framework == "torchtitan":
        grad, param, p2p = zero == 0 and pp == 1, False, (False if vpp > 1 else None)
    else:  # with ZeRO-2/3 (Megatron-FSDP) the flags are emitted; calibration.dp_overlap prices them
        grad, param, p2p = True, zero >= 1, None
    return {"overlap_grad_reduce": grad, "overlap_param_gather": param, "overlap_p2p": p2p,
            "tp_comm_overlap": sp and framework in (None, "any", "megatron", "torchtitan")}


def _offload_optimizer(training: TrainingSpec) -> str:
    """The optimizer whose offload is priced for the training's engine, for messages."""
    if uses_torchtitan(training):
        return "FSDP2's fully sharded parameters (zero_stage 3)"
    if uses_deepspeed(training) and training.grad_dtype != "fp32":
        return ("DeepSpeed's ZeRO-3 optimizer with 16-bit gradient accumulation (zero_stage 3; ZeRO-1/2's offload "
                "is priced with FP32 accumulation, grad_dtype='fp32': in the model dtype every gradient round-trips "
                "through the host in each micro-batch)")
    if uses_deepspeed(training):
        return "DeepSpeed's ZeRO optimizer (zero_stage 1, 2 or 3)"
    return "Megatron's distributed optimizer (zero_stage 1)"


def offload_zero_stages(training: TrainingSpec) -> tuple[int, ...]:
    """The ZeRO stages whose optimizer offloads as priced: Megatron's HybridDeviceOptimizer needs
    --use-precision-aware-optimizer, which needs the distributed optimizer [Megatron-LM@d98e8a6
    training/arguments.py: validate_args; optimizer/__init__.py: get_megatron_optimizer]; DeepSpeed's
    ZeRO optimizer offloads at every stage as planner.deepspeed_engine prices it ([Offload] for
    stages 1-2, priced as the compact FP32 partition that crosses once a step, so with FP32 gradient
    accumulation only; [Offload3] for stage 3, in either dtype); FSDP2's CPUOffloadPolicy shards with
    fully_shard (planner.torchtitan_engine [Offload])."""
    if uses_torchtitan(training):
        return (3,)
    if uses_deepspeed(training):
        return (1, 2, 3) if training.grad_dtype == "fp32" else (3,)
    return (1,)


def zero_stages(framework: str | None, pp: int, training: TrainingSpec | None = None) -> tuple[int, ...]:
    """ZeRO stages the target framework supports at this pipeline degree (and, for DeepSpeed, with
    the training's precision: without ZeRO it keeps FP32 master weights only for FP16 weights with
    16-bit gradients, planner.deepspeed_engine.zero0_runs).

    Megatron: 0, 1 (distributed optimizer), 2 and 3 (Megatron-FSDP optim_grads / optim_grads_params)
    -- ASSUMPTION: Megatron-FSDP only with pp = 1 (the emitter refuses it with pp > 1);
    DeepSpeed: ZeRO-2/3 are rejected with its pipeline engine (launch-configs.md §3.3);
    torchtitan: FSDP2 (3) or plain replication (0). None: every stage.
    """
    if training is not None and training.optimizer_offload:  # DeepSpeed's pipeline engine: ZeRO-1 only
        if pp > 1:  # FSDP2's offload: none priced with its pipeline (planner.space layout problems)
            return () if uses_torchtitan(training) else tuple(z for z in offload_zero_stages(training) if z == 1)
        return offload_zero_stages(training)
    if training is not None and apex_engine.uses_apex(training):  # DistributedFusedAdam: ZeRO-1
        return (1,)
    if framework in (None, "any"):
        return (0, 1, 2, 3)
    if framework == "deepspeed" and training is not None and not zero0_runs(training):
        return (1, 2, 3) if pp == 1 else (1,)
    if framework in ("megatron", "deepspeed"):
        return (0, 1, 2, 3) if pp == 1 else (0, 1)
    return (0, 3)


# What each launch target cannot express (launch-configs.md §3-4): DeepSpeed has no context
# parallelism, no interleaved pipeline and places the layers itself (its engine's split, Space.fixed_splits,
# whatever the pipeline degree: uneven_stages False means no split of the plan's choosing); torchtitan
# places them itself too, from two weights the plan chooses (Space.fixed_splits; uneven_stages False
# keeps the even split); neither has "recompute the first N layers of each stage".
FRAMEWORK_LIMITS: dict[str, dict[str, Any]] = {
    "deepspeed": {"cp": 1, "vpp": 1, "uneven_stages": False, "partial_recompute": False, "rank_order": "tp-cp-dp-pp"},
    "torchtitan": {"partial_recompute": False, "rank_order": "tp-cp-dp-pp"},
}


MEGATRON_ONLY_REFUSED_BY = ("deepspeed", "torchtitan")
"""Launch targets whose emitters refuse what only Megatron's turns on (FP8 linears, BF16 Adam states,
the model features of ModelSpec.megatron_only): a search for them must not offer it."""

RECOMPUTE_MODES = tuple(m.value for m in Recompute)
"""Every recompute mode a constraint may name."""


def framework_recomputes(framework: str | None, model: ModelSpec) -> tuple[str, ...]:
    """The recompute modes a launch target runs: torchtitan's selective checkpointing is per-op
    (Recompute.OP; it has no attention-core recompute), Megatron's and Megatron-DeepSpeed's is the
    attention core (Recompute.SELECTIVE); 'any' searches Megatron's set."""
    if framework == "torchtitan":
        return ("none", "op", "full") if model.op_recompute_priced else ("none", "full")
    return ("none", "selective", "full")


def offered_recompute_modules(model: ModelSpec, training: TrainingSpec, framework: str | None) -> tuple[str, ...] | None:
    """The second selective option a Megatron search offers MoE and MLA models: the output-discarding
    checkpoints that apply (layernorm, mla_up_proj, moe_act; not layernorm or moe_act under delayed
    scaling, which Megatron refuses), the modules NVIDIA's MoE recipes choose; None for other models
    and launch targets (Megatron-DeepSpeed and torchtitan have no --recompute-modules)."""
    if framework not in ("megatron", None) or (model.moe is None and model.mla is None):
        return None
    mods = tuple(m for m in ("layernorm", "mla_up_proj", "moe_act") if not _recompute_module_problem(model, training, m))
    return mods or None


def _recomputes(L: int, pp: int, v: int, constraints: dict[str, Any],
                modes: tuple[str, ...], modules: tuple[str, ...] | None = None) -> tuple[tuple, ...]:
    """(mode, recompute_num_layers[, recompute_modules]) options of one (pp, vpp)."""
    out: list[tuple] = []
    for mode in modes:
        if _allowed("recompute", mode, constraints):
            out.append((mode, None))
            if mode == "selective" and modules:
                out.append((mode, None, modules))
    if _allowed("recompute", "full", constraints) and v == 1 and constraints.get("partial_recompute", True):
        per_stage = max(1, L // pp)
        for n in sorted({per_stage // 4, per_stage // 2, 3 * per_stage // 4}):
            if 0 < n < per_stage:
                out.append(("full", n))
    return tuple(out)


def chunk_problem(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Why the model's chunked attention cannot be planned at this sequence length (ModelSpec.attention_chunk), or None."""
    c, s = model.attention_chunk, training.seq_length
    if c is None or s <= c:
        return None
    return (f"seq_length({s}) > attention_chunk({c}): chunked attention is planned only where one chunk spans the "
            f"sequence (no launch target runs it; causal attention over {s} tokens would be another model)")


def check_workload(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, framework: str | None) -> None:
    """Refuse a workload the cluster or the target framework would not run as priced (one line,
    named): the precision and offload the cluster supports, and what each framework's launch config
    turns on. build_space calls it, and a choice search for each combination (planner.choices).

    Raises:
        PlannerError: the first rule the workload breaks.
    """
    check_precision(cluster, training)
    check_offload(cluster, training)
    if why := chunk_problem(model, training):
        raise PlannerError(f"training.{why}")
    if training.optimizer_states != "fp32" and framework in MEGATRON_ONLY_REFUSED_BY:
        raise PlannerError(f"training.optimizer_states: BF16 Adam states are Megatron's precision-aware optimizer; "
                           f"framework '{framework}' would not run them (use framework='megatron' or 'any')")
    if training.fp8 is not None and framework == "deepspeed":
        raise PlannerError("training.fp8: DeepSpeed's launch config runs no FP8 linears; framework 'deepspeed' "
                           "would drop it (use framework='megatron', 'torchtitan' with fp8='rowwise', or 'any')")
    if training.fp8 not in (None, *TORCHTITAN_FP8_RECIPES) and framework == "torchtitan":
        raise PlannerError(f"training.fp8: torchtitan 0.3 runs torchao's float8 as 'rowwise' and its MXFP8 as "
                           f"'torchao-mxfp8', not '{training.fp8}' (use one of those, or framework='megatron' for "
                           f"Transformer Engine's recipes)")
    if framework == "torchtitan" and model.moe is not None and (why := torchtitan_moe_workload_problem(training, cluster)):
        raise PlannerError(f"{why} (use framework='megatron' or 'any')")
    unbuilt = unbuilt_features(model) if framework == "torchtitan" else model.megatron_only
    if unbuilt and framework in MEGATRON_ONLY_REFUSED_BY:
        raise PlannerError(f"model: {', '.join(unbuilt)} emitted for Megatron only so far; framework "
                           f"'{framework}' would build another model (use framework='megatron' or 'any')")
    if training.cross_entropy == "unfused" and framework not in (None, "any", "megatron"):
        raise PlannerError(f"training.cross_entropy: 'unfused' is megatron-core's loss without "
                           f"--cross-entropy-loss-fusion; framework '{framework}' runs its own (use 'fp32')")
    if training.cross_entropy in LOSS_KERNELS and framework not in (None, "any"):
        raise PlannerError(f"training.cross_entropy: '{training.cross_entropy}' ({LOSS_KERNELS[training.cross_entropy]}) "
                           f"is priced but no launch config turns it on; framework '{framework}' would keep FP32 logits "
                           "(use framework='any')")
    if training.fp8_attention and framework not in (None, "any"):
        raise PlannerError(f"training.fp8_attention: priced, but no launch config turns it on (megatron-core 0.19.2 has no "
                           f"flag for fp8_dot_product_attention); framework '{framework}' would attend in BF16 "
                           "(use framework='any')")
    if training.document_tokens is not None and framework in ("megatron", "deepspeed"):
        raise PlannerError(f"training.document_tokens: per-document attention masks are torchtitan's; framework "
                           f"'{framework}' attends causally over the whole sequence (use framework='torchtitan' or 'any')")
    if training.loss_chunks > 1 and framework in ("megatron", "deepspeed"):
        raise PlannerError(f"training.loss_chunks: a chunked loss is torchtitan's (ChunkedLossWrapper); framework "
                           f"'{framework}' computes the logits of the whole sequence at once (use framework='torchtitan' "
                           "or 'any')")
    if framework is not None and framework not in FRAMEWORKS:
        raise PlannerError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")
    runs = framework_training(training, framework)
    if runs != training:
        field = next(f for f in ("optimizer_impl", "kernels", "loss_chunks") if getattr(runs, f) != getattr(training, f))
        raise PlannerError(f"training.{field}: framework '{framework}' runs its own engine; price it with "
                           f"{field}='{getattr(runs, field)}' (planner.space.framework_training)")


def build_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    framework: str | None = None,
    allow_idle: bool = False,
    constraints: dict[str, Any] | None = None,
) -> Space:
    """Enumerate the legal candidates: the TP group stays inside an NVLink domain (hard), the
    product and divisibility rules of check_layout hold, and user constraints are respected.

    Raises:
        PlannerError: an unknown framework or constraint name.
    """
    constraints = validate_constraints(dict(constraints or {}))
    check_workload(model, cluster, training, framework)
    if "zero_stage" in constraints and not any(_allowed("zero_stage", z, constraints)
                                               for z in zero_stages(framework, 1, training)):
        raise PlannerError(f"constraint zero_stage={_shown(constraints['zero_stage'])} is impossible with framework "
                           f"'{framework}' (it offers ZeRO {', '.join(map(str, zero_stages(framework, 1, training)))} for "
                           f"{training.precision} with {training.grad_dtype} gradients)")
    rc_modes = framework_recomputes(framework, model)
    if "recompute" in constraints and not any(_allowed("recompute", m, constraints) for m in rc_modes):
        raise PlannerError(f"constraint recompute={_shown(constraints['recompute'])} is impossible with framework "
                           f"'{framework or 'any'}' for {model.name} (it offers {', '.join(rc_modes)})")
    limits = {**FRAMEWORK_LIMITS.get(framework or "any", {}), **(apex_engine.LIMITS if apex_engine.uses_apex(training) else {})}
    for key, limit in limits.items():
        if key in constraints and key not in ("uneven_stages", "partial_recompute") and not _allowed(key, limit, constraints):
            raise PlannerError(f"constraint {key}={constraints[key]!r} is impossible with framework '{framework}' "
                               f"(it needs {key}={limit})")
        constraints[key] = limit
    L, s, gbs = model.num_layers, training.seq_length, training.global_batch_size
    world, domain = cluster.world_size, cluster.nvlink_domain_size
    capped: set[str] = set()  # the default caps that cut a candidate (Space.bounds)
    default_mbs = "micro_batch_size" not in constraints
    if default_mbs:
        constraints["micro_batch_size"] = (1, MAX_MICRO_BATCH)
    # NVLink is a hard rule: aligned TP groups stay in one domain iff tp divides the domain size
    tps = [t for t in divisors(domain) if t <= world and _allowed("tp", t, constraints)]
    chunk_rule = training.attention == "flash" and not model.hybrid  # else cp 1 is a rule (_hybrid_problems), not a cap
    max_cp = max(1, s // MIN_CP_CHUNK) if chunk_rule else 1
    cps = [c for c in divisors(world) if (c == 1 or c <= max_cp or "cp" in constraints) and _allowed("cp", c, constraints)]
    if chunk_rule and "cp" not in constraints and any(c > max_cp for c in divisors(world)):
        capped.add("cp")
    # DeepSpeed's engine places the layers itself: its split only (deepspeed_engine.pipeline_split)
    engine_split = uses_deepspeed(training)
    # torchtitan places them from its first/last stage weights: the splits those make (rank_splits)
    titan_split = uses_torchtitan(training)
    uneven = constraints.get("uneven_stages", True) is not False
    # dense layers interleaved with MoE ones: a rank's dense count depends on where its layers fall,
    # which the rows (affine in the rank's layer count) cannot follow: the even split only
    # (so do a hybrid model's layer kinds)
    interleaved = model.kinds_follow_split
    free = uneven and not engine_split and not titan_split and not interleaved
    first_last = constraints.get("uneven_stages") == "first_last"
    moe = model.moe is not None
    if not moe and (any(_constrained(k, constraints) for k in ("ep", "etp"))
                    or set(constraints.get("moe_dispatcher") or ()) - {"alltoall"}):
        raise PlannerError(f"constraint ep/etp: {model.name} is dense (expert parallelism needs a Mixture-of-Experts model)")
    eps = [e for e in divisors(model.moe.num_experts) if _allowed("ep", e, constraints)] if moe else [1]

    dispatchers = sorted(constraints.get("moe_dispatcher") or {"alltoall"})
    # Megatron's default is off; searching both doubles the expert-parallel shapes (DeepSeek-V3 on 1,024
    # H100: 4.5 s -> 8.2 s to proof), so it is asked for, and explain prices the other setting
    overlap_options = {True: [True], False: [False], "both": [False, True]}[constraints.get("ep_overlap", False)]
    if constraints.get("ep_overlap") and not moe:
        raise PlannerError(f"constraint ep_overlap: {model.name} is dense (there is no all-to-all to overlap)")
    if constraints.get("ep_overlap") is True and model.mtp_layers > 1:
        raise PlannerError(f"constraint ep_overlap: Megatron runs at most one MTP depth beside it "
                           f"({model.name} trains {model.mtp_layers})")
    if model.mtp_layers > 1:  # megatron-core 0.19.2 transformer_config.py: TransformerConfig.__post_init__
        overlap_options = [False]

    def experts(tp: int) -> list[tuple[int, int | None, str, bool]]:
        """(ep, etp, dispatcher, ep_overlap) options at this tp: etp = tp (Megatron's default, None) or
        1 (experts whole); the constraint's dispatchers where each is priced (DeepEP: ep > 1, etp 1;
        all-gather: a group to gather over, without the combined 1F1B, which Megatron runs with the
        others only), all-to-all where none is (with ep = etp = 1 nothing is dispatched across GPUs);
        the combined 1F1B on or off with ep > 1."""
        if not moe:
            return [(1, None, "alltoall", False)]
        titan = uses_torchtitan(training)  # experts on EP alone, all-to-all (_torchtitan_expert_problems)
        etps = ([1] if tp > 1 else [None]) if titan else [None] + ([1] if tp > 1 else [])
        out = []
        for e in eps:
            if titan and tp > 1 and e == 1:
                continue
            for t in etps:
                et = tp if t is None else t
                if not _allowed("etp", et, constraints):
                    continue
                ds = [d for d in dispatchers if d == "alltoall"
                      or (d == "deepep" and e > 1 and et == 1 and not training.moe_pad_to_capacity)
                      or (d == "allgather" and e * et > 1)] or ["alltoall"]
                ovs = overlap_options if e > 1 else [False]
                out += [(e, t, d, o) for d in ds for o in ovs if not (o and d == "allgather")]
        return list(dict.fromkeys(out))

    shapes = []
    worlds = range(1, world + 1) if allow_idle else [world]
    for n in worlds:
        if allow_idle and world % n:
            continue
        for tp in tps:
            for cp in cps:
                if n % (tp * cp):
                    continue
                for pp in divisors(n // (tp * cp)):
                    if pp > L or not _allowed("pp", pp, constraints):
                        continue
                    dp = n // (tp * cp * pp)
                    if not _allowed("dp", dp, constraints) or gbs % dp:
                        continue
                    for mbs in divisors(gbs // dp):
                        if not _allowed("micro_batch_size", mbs, constraints):
                            if default_mbs:
                                capped.add("micro_batch_size")
                            continue
                        for v in (range(1, L // pp + 1) if pp > 1 and not engine_split else [1]):
                            if v > MAX_VPP and "vpp" not in constraints:
                                capped.add("vpp")
                                break
                            if not _allowed("vpp", v, constraints):
                                continue
                            for sp in ((False, True) if tp > 1 else (False,)):
                                if not _allowed("sequence_parallel", sp, constraints):
                                    continue
                                for ep, etp, disp, ov in experts(tp):
                                    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch_size=mbs, vpp=v,
                                                 sequence_parallel=sp, ep=ep, etp=etp, moe_dispatcher=disp,
                                                 ep_overlap=ov)
                                    probs = layout_problems(model, cluster, training, lay, allow_idle=allow_idle,
                                                            pipeline_split=False, zero_rules=False)
                                    if not probs and (free or (engine_split and v == 1)
                                                      or (titan_split and pp > 1)
                                                      or not _pipeline_problems(L, pp, v, None, None)
                                                      and not _dense_first_problems(model, lay)
                                                      and not _bf16_end_problems(model, training, lay)
                                                      and not _middle_ranks_differ(model, lay)):
                                        shapes.append(Shape(tp, pp, dp, cp, mbs, v, sp, ep, etp, disp, ov))
    order = constraints.get("rank_order") or "tp-cp-dp-pp"
    keys = {(sh.pp, sh.vpp) for sh in shapes}
    modules = offered_recompute_modules(model, training, framework)
    recomputes = {k: _recomputes(L, k[0], k[1], constraints, rc_modes, modules) for k in keys}
    titan_moe = moe and uses_torchtitan(training)  # FSDP2 shards its experts (_torchtitan_expert_problems)
    zeros = {pp: tuple(z for z in zero_stages(framework, pp, training) if _allowed("zero_stage", z, constraints)
                       and (z == 3 or not titan_moe) and not (z == 3 and model.hybrid))  # _hybrid_problems
             for pp in {sh.pp for sh in shapes}}
    space = Space(tuple(shapes), recomputes, zeros, L, free, first_last, order, allow_idle, framework,
                  not moe and not model.hybrid, training,
                  engine_weights=uneven, bounds=_bound_texts(capped, max_cp))
    if free:
        return space
    return replace(space, shapes=tuple(sh for sh in shapes if space.fixed_splits(sh.pp, sh.vpp)))


_DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch_size", "vpp")


def empty_space_reasons(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                        framework: str | None = None, allow_idle: bool = False,
                        constraints: dict[str, Any] | None = None, deadline: float | None = None) -> list[str]:
    """Where build_space under `constraints` has no candidate: each constraint without which it has some,
    as 'name=rule: why', the why from a candidate of the space without it given the constraint's value (the
    first rule that value breaks there, with its arithmetic); [] where no single constraint is to blame.
    Past `deadline` (a time.perf_counter() value) the constraints left are not tried, and the last entry
    says so."""
    constraints = validate_constraints(dict(constraints or {}))
    fixed = {k: constraints[k] for k in ("tp", "pp", "dp", "cp") if isinstance(constraints.get(k), int)}
    n, world = math.prod(fixed.values()), cluster.world_size
    if len(fixed) > 1 and (n > world if allow_idle else world % n):
        rule = "exceeds" if allow_idle else "does not divide"
        return [" x ".join(f"{k}({v})" for k, v in fixed.items()) + f" = {n} {rule} world_size({world})"]
    out = []
    for name, rule in constraints.items():
        if deadline is not None and time.perf_counter() > deadline:
            out.append(f"{'the other constraints' if out else 'the constraints'} not checked one by one within the "
                       "time limit")
            break
        rest = {k: v for k, v in constraints.items() if k != name}
        shapes = build_space(model, cluster, training, framework=framework, allow_idle=allow_idle,
                             constraints=rest).shapes
        if shapes:
            out.append(f"{name}={_shown(rule)}: " + _breaks(model, cluster, training, shapes[0], name, rule, allow_idle))
    return out


def _breaks(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, shape: Shape, name: str, rule: Any,
            allow_idle: bool) -> str:
    """Why a degree constraint's value has no place beside `shape` (a candidate without it): the rules build_space
    enumerates by (pp <= num_layers, tp inside the NVLink domain), the batch's divisibility (before the product
    rule a changed dp would break), else the first of layout_problems on the shape with that value (dp rescaled
    to keep the product). Other constraints and ranges: that nothing it allows is legal."""
    if name not in _DEGREES or not isinstance(rule, (int, frozenset)) or isinstance(rule, bool):
        return "nothing it allows has a legal layout beside the other constraints"
    value = rule if isinstance(rule, int) else min(rule)
    domain, gbs, L = cluster.nvlink_domain_size, training.global_batch_size, model.num_layers
    if name == "pp" and value > L:
        return f"pp({value}) > num_layers({L}): every pipeline rank needs a layer"
    if name == "tp" and domain % value:
        return (f"tp({value}) must divide the NVLink domain ({domain} GPUs): tensor parallelism never leaves it")
    lay = replace(shape, **{{"micro_batch_size": "mbs"}.get(name, name): value})
    if name in ("tp", "pp", "cp"):  # the data-parallel degree that keeps the product
        lay = replace(lay, dp=max(1, cluster.world_size // (lay.tp * lay.pp * lay.cp)))
    if name in ("micro_batch_size", "dp") and gbs % (lay.dp * lay.mbs):
        return (f"global_batch_size({gbs}) % (dp({lay.dp}) x micro_batch_size({lay.mbs})) = "
                f"{gbs % (lay.dp * lay.mbs)} != 0")
    layout = Layout(tp=lay.tp, pp=lay.pp, dp=lay.dp, cp=lay.cp, micro_batch_size=lay.mbs, vpp=lay.vpp,
                    sequence_parallel=lay.sp and lay.tp > 1, ep=lay.ep, etp=lay.etp, moe_dispatcher=lay.dispatcher,
                    ep_overlap=lay.ep_overlap)
    probs = layout_problems(model, cluster, training, layout, allow_idle=allow_idle, zero_rules=False)
    return probs[0] if probs else f"it leaves no legal layout beside the others (e.g. {layout.short()})"


def _constrained(name: str, constraints: dict[str, Any]) -> bool:
    """Whether a constraint excludes the dense value 1 of an expert degree."""
    return name in constraints and not _allowed(name, 1, constraints)


def _shown(rule: Any) -> str:
    return ",".join(map(str, sorted(rule))) if isinstance(rule, frozenset) else str(rule)
