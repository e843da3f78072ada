"""What torchtitan builds for a plan (TrainingSpec.optimizer_impl = 'fsdp2', the engine a torchtitan
plan runs on): how it splits the decoder over its pipeline stages, which kernels it runs and how its
async tensor parallelism overlaps. The layout checks (planner.space), the cost model, the search and
the torchtitan emitter read these, so what is written is what is priced.

Read in torchtitan 0.3.0, the version the emitter targets (its files under torchtitan/):
    [Compile] config/configs.py: CompileConfig (--compile.enable compiles every TransformerBlock,
             distributed/compile.py: apply_compile; enable_async_tensor_parallel requires it and
             turns on Inductor's micro-pipelined TP, _maybe_enable_async_tp).
In distributed/pipeline_parallel.py:
    [Meta]   _get_pipeline_metadata: the stage count is ceil((L + first_less + last_less) /
             pipeline_parallel_layers_per_stage) where that is set -- a multiple of pp, one stage per
             rank for a single-stage schedule (1F1B), at least two for a looped one (Interleaved1F1B)
             -- else pp (single-stage) or 2 pp (looped). first_less and last_less are
             pipeline_parallel_first/last_stage_less_layers (torchtitan/config/configs.py, default 1).
    [Split]  _generate_llm_fqn_per_model_part: the embedding counts as first_less layers and the
             final norm with the output layer as last_less; the L + first_less + last_less
             "effective layers" are dealt evenly over the stages, the remainder one each to the first
             stages; the first stage holds its share less first_less decoder layers, the last its
             share less last_less. Refused: more stages than effective layers, a share of 0, a
             weight above the smallest share.
    [Ranks]  _get_pp_rank_to_stage_indices_mapping: looped schedules place stage s on rank s % pp
             (the order of Layout.pipeline_layers).
In torch 2.13 (what torchtitan's pipeline runs on):
    [Recv]   distributed/pipelining/stage.py: _PipelineStage._setup_forward_recv_info allocates a receive
             buffer for every micro-batch of the step on every stage but the first, and
             _setup_backward_recv_info (_create_grad_recv_info) one for every micro-batch's gradient on
             every stage but the last (_make_tensor_from_meta, once, when the schedule first runs, kept
             by the stage); forward_one_chunk takes the received buffer itself as the stage's input
             (_retrieve_recv_activations, requires_grad_) and keeps the stage's output in fwd_cache
             until that micro-batch's backward (nothing frees it after the send, as Megatron's
             deallocate_pipeline_outputs does: Megatron-LM@d98e8a6 megatron/training/argument_utils.py
             sets it).
    [NoSync] distributed/pipelining/stage.py: backward_maybe_with_nosync (every micro-batch's
             backward with set_requires_gradient_sync(False)), perform_reduce_grad (the one
             reduce-scatter, after the last); distributed/fsdp/_fully_shard/_fsdp_param_group.py:
             post_backward, _fsdp_param.py: to_accumulated_grad_if_needed (the first micro-batch's
             BF16 gradient cast to the FP32 reduce dtype, unsharded_grad.to(reduce_dtype)) and
             accumulate_unsharded_grad_if_needed (each later one added, unsharded_accumulated_grad +=
             unsharded_param.grad).
    [Offload] training.enable_cpu_offload (config/configs.py: TrainingConfig; distributed/fsdp.py:
             apply_fsdp, offload_policy=CPUOffloadPolicy(); trainer.py builds the model on the CPU)
             and torch's CPUOffloadPolicy (fsdp/_fully_shard/_fsdp_api.py): the sharded FP32
             parameters and gradients, pinned, and the optimizer states stay on the host;
             _fsdp_param.py: FSDPParam.all_gather_inputs copies each FP32 shard to the GPU
             (.to(device, non_blocking=True)) before every unshard's all-gather, forward and backward;
             _fsdp_collectives.py: foreach_reduce copies each reduced FP32 shard to the host -- non-
             blocking for the first micro-batch's, blocking when it is added on the CPU into the host
             gradient a previous micro-batch left (grad._local_tensor += new_sharded_grad). The
             optimizer (components/optimizer/optimizer.py: implementation 'fused', torch's fused
             AdamW, which runs on CPU tensors) steps the host shards after
             trainer.py: train_step clips the host gradients (dist_utils.clip_grad_norm_).
    [Loss]   components/loss.py: ChunkedLossWrapper (the registry configs' loss,
             models/llama3/config_registry.py: llama3_8b, llama3_70b; num_chunks 8): the decoder
             stops before the output layer; its output (replicated over TP) is split along the
             sequence into detached chunks -- contiguous copies, unless the batch is 1 -- and each
             chunk runs the output layer, the loss and their backward in turn, its gradient written
             into an FP32 accumulator of the whole output (GradAccumulator, dtype float32) that the
             decoder's backward then takes; the output layer stays gathered and syncs its gradient
             at the last chunk only (set_requires_gradient_sync(False) before), so it accumulates
             unsharded in the FP32 reduce dtype across the chunks [NoSync]. After the loop it
             re-enables that sync and reshards the [norm, output] unit (lm_head.reshard()): the
             decoder's backward gathers the unit again in every micro-batch, and under the pipeline
             (whose schedule turns sync off before each backward, stage.py: backward_maybe_with_nosync)
             the output layer's gradient is still reduce-scattered at every micro-batch's last chunk.
             Each chunk's loss is CrossEntropyLoss, compiled where compile.enable is on (the emitter
             turns it on; CompileConfig.components defaults to ["model", "loss"], BaseLoss._maybe_compile):
             cross_entropy_loss is cross_entropy(pred.flatten(0, 1).float(), labels, reduction="sum")
             without TP and _LossParallelCrossEntropy (FP32 log-probabilities saved; its backward
             scatters into zeros_like, then (grad_input + exp(log_probs)) * grad_output cast to BF16)
             with it; the loop holds the chunk's BF16 logits through the chunk's backward.
Before 0.3 (the published rows' torchtitan, commit 9dec370, December 2024):
    [WholeLoss] train.py: loss_fn is cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)) over
             the whole sequence, and the step deletes pred before loss.backward() ("need to free to
             before bwd to avoid peaking memory"); with TP it runs inside torch's loss_parallel()
             unless training.disable_loss_parallel (the output layer's logits stay vocab-sharded), whose
             handlers are torch distributed/tensor/parallel/loss.py: _log_softmax (x - max, exp, the
             shifted copy minus the log-sum-exp) and _nll_loss_and_log_softmax_backward (zeros_like,
             then (grad_input + exp(x)) * grad_output). Under the pipeline the last stage keeps its
             output for backward (torch distributed/pipelining/stage.py: forward_one_chunk stores it in
             fwd_cache, backward_one_chunk pops it).
"""

from __future__ import annotations

from functools import lru_cache

from planner.errors import SpecError
from planner.specs import Family, Layout, ModelSpec, TrainingSpec, num_microbatches

__all__ = ["MOE_FLAVOURS", "DENSE_FLAVOURS", "moe_flavour", "registry_flavour", "unbuilt_features", "MAX_END_WEIGHT", "DEFAULT_END_WEIGHTS", "KERNELS",
           "uses_torchtitan", "fuses_qkv", "stage_split", "layers_per_stage", "end_weights", "rank_splits", "accumulation_bytes",
           "FIRST_CAST_BYTES", "ACCUMULATE_BYTES",
           "OFFLOAD_HOST_BYTES", "OFFLOAD_H2D_BYTES", "OFFLOAD_D2H_BYTES", "CPU_ACCUMULATE_BYTES", "CPU_CLIP_BYTES",
           "LOSS_CHUNKS", "whole_loss_peak_sbv", "chunk_loss_peak_sbv", "pipeline_edge_tensors",
           "whole_loss_traffic_bytes", "chunk_loss_traffic_bytes"]

KERNELS = "unfused"
"""The kernel family a torchtitan plan is priced with (TrainingSpec.kernels): PyTorch's own kernels,
whose parameters are fitted on llm-foundry MPT and torchtitan runs. The emitter compiles the blocks
([Compile]): priced this way, the compiled torchtitan runs published beside eager ones of the same
layout are predicted within -1.6 % / -1.8 % (Llama-3-8B on 8 / 128 of Meta's 500 W H100), the eager ones
13.9 % / 14.1 % too fast (torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 5,762 -> 6,667 and
5,605 -> 6,514 tokens/s/GPU with torch.compile; benchmarks/fidelity.py --rows prints both)."""


MOE_FLAVOURS = {
    # (layers, hidden, heads, kv heads, head dim, vocab, experts, top-k, expert ffn): (module, config, flavour)
    (48, 2048, 32, 4, 128, 151936, 128, 8, 768): ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    (94, 4096, 64, 4, 128, 151936, 128, 8, 1536): ("qwen3", None, "235B-A22B"),
}
"""The MoE models torchtitan 0.3's registry builds as the planner prices them, by shape: Qwen3's MoE
flavours (Q/K RMSNorm, softmax top-k routing renormalised, no shared experts, untied) [torchtitan 0.3
models/qwen3/__init__.py: _30b_a3b, _235b_a22b; config_registry.py: qwen3_30b_a3b -- the 235B flavour
has no config function of its own]. Other MoE shapes (DeepSeek-V3's MLA and shared experts, GPT-OSS's
sinks and windows) are refused for torchtitan."""

DENSE_FLAVOURS = {
    # (layers, hidden, heads, kv heads, head dim, vocab, ffn, tied embeddings): (module, config, flavour)
    (28, 1024, 16, 8, 128, 151936, 3072, True): ("qwen3", "qwen3_0_6b", "0.6B"),
    (28, 2048, 16, 8, 128, 151936, 6144, True): ("qwen3", "qwen3_1_7b", "1.7B"),
    (36, 2560, 32, 8, 128, 151936, 9728, True): ("qwen3", None, "4B"),
    (36, 4096, 32, 8, 128, 151936, 12288, False): ("qwen3", None, "8B"),
    (40, 5120, 40, 8, 128, 151936, 17408, False): ("qwen3", "qwen3_14b", "14B"),
    (64, 5120, 64, 8, 128, 151936, 25600, False): ("qwen3", "qwen3_32b", "32B"),
}
"""The dense models with per-head Q/K norms torchtitan 0.3's registry builds, by shape: Qwen3's dense
flavours (Q/K RMSNorm, SwiGLU, no biases; 0.6B-4B tie the LM head to the embedding) [torchtitan 0.3
models/qwen3/__init__.py: _0_6b, _1_7b, _4b, _8b, _14b, _32b; config_registry.py: qwen3_0_6b, qwen3_1_7b,
qwen3_14b, qwen3_32b -- 4B and 8B have no plain pretraining config function]. Llama-family models without
Q/K norms are llama3's (torchtitan_config_name)."""

_TORCHTITAN_BUILT = ("experts (moe)", "Q/K norms (qk_norm)")


def moe_flavour(model: ModelSpec) -> tuple[str, str | None, str] | None:
    """(module, config function or None, flavour) of torchtitan's registry MoE model with this model's
    shape (MOE_FLAVOURS), else None."""
    e = model.moe
    if e is None or not model.qk_norm or e.shared_expert_ffn_hidden_size or model.tied_embeddings:
        return None
    if (e.first_dense_layers or e.layer_step > 1 or e.router_groups or model.linear_bias
            or model.activation != "swiglu"):
        return None
    return MOE_FLAVOURS.get((model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads,
                             model.head_dim, model.vocab_size, e.num_experts, e.top_k, e.expert_ffn_hidden_size))


def registry_flavour(model: ModelSpec) -> tuple[str, str | None, str] | None:
    """(module, config function or None, flavour) of the torchtitan registry model with this model's shape:
    an MoE model's (moe_flavour), a dense one with per-head Q/K norms (DENSE_FLAVOURS); else None."""
    if model.moe is not None:
        return moe_flavour(model)
    if (not model.qk_norm or model.linear_bias or model.qkv_bias or model.activation != "swiglu"
            or model.family != Family.LLAMA):
        return None
    return DENSE_FLAVOURS.get((model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads,
                               model.head_dim, model.vocab_size, model.ffn_hidden_size, model.tied_embeddings))


def unbuilt_features(model: ModelSpec) -> tuple[str, ...]:
    """ModelSpec.megatron_only less what torchtitan's registry builds for the model (registry_flavour): the
    features a torchtitan launch would drop."""
    built = _TORCHTITAN_BUILT if registry_flavour(model) is not None else ()
    return tuple(f for f in model.megatron_only if f not in built)


def uses_torchtitan(training: TrainingSpec) -> bool:
    """The plan runs on torchtitan (FSDP2 as torchtitan applies it: TrainingSpec.optimizer_impl)."""
    return training.optimizer_impl == "fsdp2"


def fuses_qkv(training: TrainingSpec) -> bool:
    """torchtitan 0.3's registry builds each block's Q, K and V projections as one fused linear (wqkv) [torchtitan
    0.3 models/llama3/__init__.py and models/qwen3/__init__.py: fuse_qkv=True in every flavour]; the torchtitan
    before it (the published rows' 9dec370) ran wq, wk and wv apart. What marks a 0.3 plan is its chunked loss
    (loss_chunks > 1, what framework_training sets for torchtitan; memory.loss_kind's 'torchtitan-chunks'). Per-op
    checkpointing counts linears, so the fusion moves which outputs it keeps (memory._op_saved_bytes) and
    which it re-runs (cost.op_recompute_gemm_flops)."""
    return uses_torchtitan(training) and training.loss_chunks > 1


FIRST_CAST_BYTES = 2 + 4
"""HBM bytes per parameter of the first micro-batch's cast of the unsharded BF16 gradient to FP32 [NoSync]."""
ACCUMULATE_BYTES = 4 + 2 + 4
"""Each later micro-batch's in-place add of the BF16 gradient into the FP32 one: read both, write FP32 [NoSync]."""


def pipeline_edge_tensors(pp: int, vpp: int, rank: int, microbatches: int, in_flight: float) -> float:
    """Stage-boundary tensors (one micro-batch's activation or gradient at a stage's edge) that pipeline rank
    `rank` keeps beyond the stage inputs its activations already count [Recv]: each of its virtual stages
    rank, rank + pp, ... holds a receive buffer per micro-batch for its input (not the first stage) and one
    per micro-batch for its output's gradient, and the outputs of its micro-batches in flight (not the
    last); the `in_flight` micro-batches (planner.memory.in_flight_microbatches, in units of the rank's
    layers, so that many per virtual stage) whose input is a buffer are counted with the activations."""
    stages = [rank + k * pp for k in range(vpp)]
    last = pp * vpp - 1
    held = min(in_flight, microbatches)
    inputs = sum(s > 0 for s in stages) * max(0.0, microbatches - held)
    return inputs + sum(s < last for s in stages) * (microbatches + held)


LOSS_CHUNKS = 8
"""The sequence chunks torchtitan 0.3's registry configs run the output layer and loss in [Loss]."""


def chunk_loss_peak_sbv(tp: int) -> int:
    """Bytes per logit of one chunk torchtitan 0.3's compiled chunk loss holds at its peak [Loss]. Without
    TP, 2 + 2: compiled, AOTAutograd's partitioner saves only the BF16 logits (and two FP32 numbers a
    row) and the backward writes the BF16 gradient directly; measured on CPU processes with
    torch.compile (4.15; tests/test_activation_harness.py). With TP, 2 + 4 + 4 + 2: the held BF16
    logits, the FP32 log-probabilities the Function saves, the FP32 gradient its scatter builds and
    the BF16 cast of the product (ASSUMPTION: compile fuses the rest; eager it measures 18)."""
    return 4 if tp == 1 else 12


def whole_loss_peak_sbv(tp: int, pp: int) -> int:
    """Bytes per local logit (s b V / tp) the whole-sequence loss holds at its peak [WholeLoss], in its
    backward: without TP the saved FP32 log-probabilities, nll_loss's dense FP32 gradient and log_softmax's
    FP32 input gradient (4 + 4 + 4); with TP, loss_parallel's backward builds its zeros, exp and sum
    beside the saved log-probabilities before the product (4 + 4 + 4 + 4). Under the pipeline the BF16
    logits stay held too (2). Measured on CPU processes (tests/test_activation_harness.py): 11.99 and
    16.00 per logit."""
    return (16 if tp > 1 else 12) + (2 if pp > 1 else 0)


def whole_loss_traffic_bytes(tp: int) -> int:
    """HBM bytes per local logit the whole-sequence eager loss reads and writes in one micro-batch
    [WholeLoss]. Without TP: the FP32 cast (read 2, write 4); log_softmax's kernel for a row too long for
    shared memory reads the row three times (its maximum, the sum of exponentials, the epilogue) and
    writes once (16); backward, nll_loss's FP32 zeros (4), log_softmax's backward kernel (a sum over the
    gradient row, then the gradient and the output read and the input gradient written: 16) and the
    cast back to BF16 (6): 48 [torch aten/src/ATen/native/cuda/SoftMax.cu: host_softmax ->
    cunn_SoftMaxForward, host_softmax_backward -> cunn_SoftMaxBackward]. With TP, loss_parallel's
    handlers run as separate ops: the cast (6), the maximum (4), the shifted copy (8), exp (8), the sum
    (4), the shifted copy minus the log-sum-exp (8); backward zeros (4), exp (8), the sum with the
    scattered gradient (12), the product with the output gradient (8), the cast (6): 76."""
    return 76 if tp > 1 else 48


def chunk_loss_traffic_bytes(tp: int) -> int:
    """The same for torchtitan 0.3's compiled chunk loss [Loss]. Without TP, 4 + 4: the compiled forward
    reads the BF16 chunk twice (its maximum, then the sum of exponentials; two FP32 numbers a row kept)
    and the compiled backward reads it once more and writes the BF16 gradient (ASSUMPTION: the read
    count of Inductor's kernels, the saved tensors measured: chunk_loss_peak_sbv). With TP the
    all-reduces inside loss_parallel's handlers split the graph, so the eager count is taken (76,
    ASSUMPTION)."""
    return 76 if tp > 1 else 8


OFFLOAD_HOST_BYTES = 4 + 4 + 4 + 4
"""Host bytes per element of a rank's FSDP2 shard under CPU offload: the FP32 parameter, the FP32
gradient (the reduce dtype), AdamW's exp_avg and exp_avg_sq [Offload]."""
OFFLOAD_H2D_BYTES = 4
"""Host-link bytes per shard element of each unshard: the FP32 shard to the GPU, cast to BF16 there [Offload]."""
OFFLOAD_D2H_BYTES = 4
"""Host-link bytes per shard element of each micro-batch's reduced FP32 gradient [Offload]."""
CPU_ACCUMULATE_BYTES = 4 + 4 + 4
"""Host-memory bytes per shard element of each later micro-batch's gradient added on the CPU: read
both, write one [Offload]."""
CPU_CLIP_BYTES = 4 + 4 + 4
"""Host-memory bytes per shard element of gradient clipping on the host: get_total_norm reads the
gradient, clip_grads_with_norm_ reads and writes it -- always, by the clamped coefficient, to avoid a
host-device sync [torchtitan distributed/utils.py: clip_grad_norm_; torch 2.13 nn/utils/clip_grad.py:
_clip_grads_with_norm_]."""


def accumulation_bytes(training: TrainingSpec, layout: Layout) -> float:
    """HBM bytes per local parameter that FSDP2 spends accumulating gradients in a micro-batch (the
    step's average) under torchtitan's pipeline, which keeps them unsharded in the FP32 reduce dtype
    until the last backward [NoSync]: (FIRST_CAST_BYTES + (m - 1) ACCUMULATE_BYTES) / m; 0 without a
    pipeline (each micro-batch reduce-scatters and adds into the 1/dp shard: ASSUMPTION, not priced)."""
    if not uses_torchtitan(training) or layout.pp == 1:
        return 0.0
    m = num_microbatches(training, layout)
    return (FIRST_CAST_BYTES + (m - 1) * ACCUMULATE_BYTES) / m


DEFAULT_END_WEIGHTS = (1, 1)
"""torchtitan's pipeline_parallel_first_stage_less_layers and _last_stage_less_layers defaults."""

MAX_END_WEIGHT = 8
"""The largest first/last weight the search offers (torchtitan takes any up to the smallest share):
an output layer costs about 2 h V / (24 h^2) decoder layers of GEMM time -- 2.6 for Llama-3-8B, 1.3
for Llama-3-70B -- so eight covers vocabularies up to ~100 x the hidden size."""


def stage_split(num_layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...]:
    """Decoder layers on each of `stages` (virtual) pipeline stages as torchtitan places them ([Split]).

    Raises:
        SpecError: a split torchtitan refuses, with its rule.
    """
    if stages < 1:
        raise SpecError(f"torchtitan: {stages} pipeline stages; it needs at least 1")
    if first_less < 0 or last_less < 0:
        raise SpecError(f"torchtitan: first/last stage weights ({first_less}, {last_less}) cannot be negative")
    if stages == 1:
        return (num_layers,)
    effective = num_layers + first_less + last_less
    if stages > effective:
        raise SpecError(f"torchtitan: {stages} stages > {effective} effective layers (num_layers({num_layers}) "
                        f"+ first_less({first_less}) + last_less({last_less}))")
    base, extra = divmod(effective, stages)
    if first_less > base or last_less > base:
        raise SpecError(f"torchtitan: first/last stage weights ({first_less}, {last_less}) exceed the smallest "
                        f"stage share ({base} of {effective} effective layers over {stages} stages)")
    shares = [base + (1 if s < extra else 0) for s in range(stages)]
    shares[0] -= first_less
    shares[-1] -= last_less
    return tuple(shares)


def layers_per_stage(num_layers: int, stages: int, first_less: int, last_less: int) -> int | None:
    """The smallest pipeline_parallel_layers_per_stage for which torchtitan builds exactly `stages`
    stages ([Meta]: ceil(effective / value) == stages), or None where no value does."""
    effective = num_layers + first_less + last_less
    lo = -(-effective // stages)
    return lo if -(-effective // lo) == stages else None


def _launchable(num_layers: int, pp: int, vpp: int, first_less: int, last_less: int) -> bool:
    """Whether the torchtitan emitter can make torchtitan build pp x vpp stages with these weights:
    a layers_per_stage value gives that count, or the schedule's default count (pp for 1F1B, 2 pp
    for Interleaved1F1B) is it."""
    return vpp in (1, 2) or layers_per_stage(num_layers, pp * vpp, first_less, last_less) is not None


def _weighted_splits(num_layers: int, pp: int, vpp: int):
    """((first_less, last_less), layers per virtual stage) for every pair of weights within
    MAX_END_WEIGHT that torchtitan accepts and the emitter can launch on pp x vpp stages, the fewest
    in total first, then the smaller first weight."""
    for total in range(2 * MAX_END_WEIGHT + 1):
        for a in range(max(0, total - MAX_END_WEIGHT), min(total, MAX_END_WEIGHT) + 1):
            b = total - a
            if not _launchable(num_layers, pp, vpp, a, b):
                continue
            try:
                yield (a, b), stage_split(num_layers, pp * vpp, a, b)
            except SpecError:
                continue


def end_weights(num_layers: int, pp: int, vpp: int, split: tuple[int, ...]) -> tuple[int, int] | None:
    """The (first_less, last_less) weights, each within MAX_END_WEIGHT, with which torchtitan places
    the layers over pp x vpp stages as `split` does (the fewest in total, then the smaller first),
    or None where no weights do."""
    return next((w for w, made in _weighted_splits(num_layers, pp, vpp) if made == tuple(split)), None)


@lru_cache(maxsize=4096)
def rank_splits(num_layers: int, pp: int, vpp: int) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Every split torchtitan can be launched with on pp ranks of vpp chunks, weights within
    MAX_END_WEIGHT, each rank holding a decoder layer: {layers per rank: layers per virtual stage}
    (stage s on rank s % pp, [Ranks]); where weights differ but the ranks' counts agree, the split
    made with the fewest weight is kept, in end_weights' order."""
    out: dict[tuple[int, ...], tuple[int, ...]] = {}
    for _, split in _weighted_splits(num_layers, pp, vpp):
        ranks = tuple(sum(split[c * pp + r] for c in range(vpp)) for r in range(pp))
        if min(ranks) >= 1:  # the first weights to make a split are the ones end_weights finds
            out.setdefault(ranks, split)
    return out
