"""The memory ledger: static bytes (params, grads, Adam states) and activations, per pipeline stage.

References (keys used in comments):
    [Korthikanti22] Korthikanti et al., Reducing Activation Recomputation in Large Transformer
        Models, MLSys 2023, arXiv:2205.05198 (Table 2, Eq. 5).
    [Rajbhandari20] Rajbhandari et al., ZeRO, SC 2020, arXiv:1910.02054 (Fig. 1, 16 bytes/param).
    [MemRef] shared/reference/memory.md: per-term bytes measured byte-exact against PyTorch layers.
    [MegatronDistOpt] Megatron-LM docs/source/api-guide/dist_optimizer.md (6 + 12/d bytes/param).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from planner import apex_engine
from planner._memo import memo
from planner.deepspeed_engine import LOSS_PEAK_SBV as DEEPSPEED_LOSS_PEAK_SBV
from planner.deepspeed_engine import SUB_GROUP_ELEMENTS
from planner.deepspeed_engine import offload_host_bytes as deepspeed_offload_host_bytes
from planner.deepspeed_engine import (REDUCE_BUCKET_ELEMENTS, held_stage_outputs, lp_grad_bytes, reduce_bucket_bytes,
                                      uses_deepspeed, wrapper, zero3_gathered_params)
from planner.errors import SpecError
from planner.specs import (BALANCED, ClusterSpec, Family, Layout, ModelSpec, MoERouting, Recompute, TrainingSpec,
                           num_microbatches)
from planner.torchtitan_engine import OFFLOAD_HOST_BYTES as FSDP2_OFFLOAD_HOST_BYTES
from planner.torchtitan_engine import (chunk_loss_peak_sbv, fuses_qkv, pipeline_edge_tensors, uses_torchtitan,
                                      whole_loss_peak_sbv)

__all__ = [
    "StaticMemory",
    "static_memory",
    "weight_and_adam_bytes",
    "LossKind",
    "loss_kind",
    "activation_bytes_per_layer",
    "saved_gather_bytes",
    "stage_layers",
    "stage_params",
    "layer_params",
    "routed_params_per_layer",
    "symbols_on",
    "virtual_stage_layers",
    "moe_layers_on",
    "mamba_saved_bytes",
    "symbol_layer_params",
    "ParamShard",
    "param_shards",
    "moe_routed_bytes",
    "in_flight_microbatches",
    "MemoryItem",
    "StageMemory",
    "MemoryLedger",
    "memory_ledger",
    "stage_memory",
    "stage_static_items",
    "stage_activation_items",
    "STATIC_ITEMS",
    "optimizer_shard_params",
    "stage_host_bytes",
    "OFFLOAD_HOST_BYTES",
    "offload_host_bytes",
    "offload_host_note",
]

PARAM_BYTES = 2  # bf16/fp16 weights
ADAM_BYTES = 12  # fp32 master weights + momentum + variance [Rajbhandari20, §3.1: 12 bytes of K=12]
FSDP2_ACCUMULATED_GRAD_BYTES = 4
"""Bytes per parameter of FSDP2's unsharded gradient accumulated in its reduce dtype (FP32 under
torchtitan) while gradient sync is off -- under torchtitan's pipeline, every backward but the last."""
FSDP2_PARAM_BYTES = 4
"""FSDP2 keeps each parameter's shard in the dtype the model was built in (FP32 under torchtitan) and
gathers it in MixedPrecisionPolicy.param_dtype (BF16); the optimizer steps the FP32 shard, so it is
the master weight and Adam adds only m and v [torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:
FSDPParam (sharded_param, unsharded param_dtype); torchtitan 0.3 distributed/fsdp.py:
apply_fsdp_to_decoder: MixedPrecisionPolicy(param_dtype, reduce_dtype), [norm, lm_head] sharded with
reshard_after_forward only under the 'always' policy, blocks with it off under PP]."""
OFFLOAD_HOST_BYTES = 16
"""Host bytes per element of the optimizer shard Megatron offloads: the pinned FP32 copy of the
parameter (param_update_in_fp32), torch AdamW's FP32 exp_avg and exp_avg_sq, and the pinned FP32
gradient the copy is handed [Megatron-LM@d98e8a6 megatron/core/optimizer/cpu_offloading/
hybrid_optimizer.py: _get_sub_optimizer_param_groups (param.detach().clone().cpu(), then .float()
pinned), _set_sub_optimizer_grads (torch.empty(param.shape, dtype=param.dtype, pin_memory=True))]."""
ZERO3_PREFETCH_LAYERS = 2
# ASSUMPTION: ZeRO-3 keeps about two layers of gathered bf16 weights alive (the one in use and the
# prefetched next one), as FSDP's forward prefetch does; DeepSpeed keeps what its reuse distance
# keeps (planner.deepspeed_engine.zero3_gathered_params), FSDP2 under a pipeline the whole stage.
MEGATRON_LOSS_PEAK_SBV = 6
"""Bytes per local logit (s b V / tp) Megatron's loss holds at its peak: VocabParallelCrossEntropy casts
the BF16 logits to FP32 inside its forward and works on that copy in place (max subtracted, exp, the
division by the sum), saving it as the softmax, which its backward turns into the gradient in place
before autograd casts it to BF16: 2 + 4 in forward, 4 + 2 in backward [megatron-core 0.19.2
models/common/language_module/language_module.py: compute_language_model_loss (without
--cross-entropy-loss-fusion); tensor_parallel/cross_entropy.py: VocabParallelCrossEntropy.
calculate_logits_max, calculate_predicted_logits, calculate_cross_entropy_loss, calculate_gradients].
Measured on megatron-core's own function as the peak resident memory of CPU processes, one rank and
two: 6.01 and 6.00 (tests/test_activation_harness.py)."""


LossKind = Literal["te", "flash-attn", "torchtitan-chunks", "torchtitan-whole", "megatron-deepspeed",
                   "megatron-unfused", "megatron-fused"]


def loss_kind(training: TrainingSpec) -> LossKind:
    """The loss the last pipeline rank runs, as the ledger's logits item holds it and cost.loss_traffic_bytes
    prices its passes: the kernel TrainingSpec.cross_entropy names, else the engine's own (torchtitan 0.3's
    chunked loss or its whole-sequence one, Megatron-DeepSpeed's, megatron-core's fused one as the Megatron
    files launch it)."""
    if training.cross_entropy == "te":
        return "te"
    if training.cross_entropy == "fused":
        return "flash-attn"
    if training.loss_chunks > 1:
        return "torchtitan-chunks"
    if uses_torchtitan(training):
        return "torchtitan-whole"
    if uses_deepspeed(training):
        return "megatron-deepspeed"
    return "megatron-unfused" if training.cross_entropy == "unfused" else "megatron-fused"


@dataclass(frozen=True)
class StaticMemory:
    """Static bytes per GPU (or for the whole model when unsharded)."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        """Sum of the three items."""
        return self.params + self.grads + self.optimizer


def adam_bytes(training: TrainingSpec) -> float:
    """Bytes of Adam state per parameter: 12 (fp32 master, m, v), or with BF16 states (TrainingSpec.
    optimizer_states) 2 + 2 for m and v plus the master: its 16-bit remainder (2) where Transformer
    Engine keeps it, whole (4) under an FP8 recipe other than delayed (Megatron's test reads
    fp8_recipe only: NVFP4 keeps the remainder) [megatron-core 0.19.2 optimizer/optimizer_config.py:
    use_precision_aware_optimizer_no_fp8_or_ds_fp8]."""
    if training.optimizer_states == "fp32":
        return ADAM_BYTES
    return 4 + (2 if training.fp8 in (None, "delayed", "nvfp4") else 4)


def optimizer_shard_params(model: ModelSpec, layout: Layout, stage: int, layers: int) -> float:
    """Parameters whose Adam step one GPU of pipeline `stage` runs: each shard over its own
    data-parallel group from ZeRO-1 on (param_shards), whole without ZeRO."""
    return sum(sh.params / (sh.dp if layout.zero_stage >= 1 else 1) for sh in param_shards(model, layout, stage, layers))


def offload_host_bytes(training: TrainingSpec, zero_stage: int = 1) -> float:
    """Host bytes per offloaded element of the optimizer shard: Megatron's OFFLOAD_HOST_BYTES,
    DeepSpeed's ZeRO-Offload (planner.deepspeed_engine.offload_host_bytes: at stages 1-2 its pinned
    16-bit copy too, at stage 3 the gradient partition in the accumulation dtype) or FSDP2's CPU
    offload (planner.torchtitan_engine.OFFLOAD_HOST_BYTES: the shard's FP32 parameter and gradient
    with AdamW's m and v)."""
    if uses_torchtitan(training):
        return FSDP2_OFFLOAD_HOST_BYTES
    return deepspeed_offload_host_bytes(training, zero_stage) if uses_deepspeed(training) else OFFLOAD_HOST_BYTES


def offload_host_note(training: TrainingSpec, zero_stage: int | None = None) -> str:
    """What those host bytes are, for messages (DeepSpeed: at `zero_stage`, or both kinds)."""
    if uses_torchtitan(training):
        return f"FP32 parameter, gradient, m, v of the FSDP2 shard: {FSDP2_OFFLOAD_HOST_BYTES} B per element"
    if uses_deepspeed(training):
        low = (f"ZeRO-1/2: FP32 master, gradient, m, v and a 16-bit copy, {deepspeed_offload_host_bytes(training, 1):g} B "
               "per element, and a 16-bit staging buffer the size of the largest parameter")
        high = (f"ZeRO-3: the {training.grad_dtype} gradient partition, FP32 master, gradient, m, v, "
                f"{deepspeed_offload_host_bytes(training, 3):g} B per element, and one sub-group's 16-bit conversion")
        return low if zero_stage in (1, 2) else high if zero_stage == 3 else f"{low}; {high}"
    return f"FP32 copy, m, v, gradient: {OFFLOAD_HOST_BYTES} B per element"


def largest_tensor_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Elements of the largest weight tensor on a GPU of pipeline `stage` (dense models): the word
    embedding on the first stage and the output projection (or the tied embedding's copy) on the
    last, split over TP by vocabulary, else the largest linear -- the fused gate and up projection of
    a SwiGLU MLP (2 f x h / tp), the first MLP projection otherwise, or the fused QKV."""
    h, tp = model.hidden_size, layout.tp
    fc1 = h * model.ffn_hidden_size * (2 if model.family == Family.LLAMA else 1) / tp
    qkv = h * (model.q_hidden + 2 * model.kv_hidden) / tp
    vocab = model.vocab_size * h / tp if stage in (0, layout.pp - 1) else 0.0
    return max(fc1, qkv, vocab)


def offload_staging_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> float:
    """Bytes of each of ZeRO-Offload's two 16-bit gradient staging buffers, one on the GPU and one
    pinned on the host, the size of the rank's largest parameter (deepspeed_engine [Offload]:
    temp_grad_buffer_for_gpu_offload, temp_grad_buffer_for_cpu_offload); 0 without DeepSpeed's offload."""
    if not (uses_deepspeed(training) and training.optimizer_offload) or layout.zero_stage == 3:
        return 0.0
    return PARAM_BYTES * largest_tensor_params(model, layout, stage)


def stage_host_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, layers: int) -> float:
    """Host bytes one GPU's rank of pipeline `stage` pins for its offloaded optimizer share
    (TrainingSpec.optimizer_offload; 0 without), with DeepSpeed's host staging buffer (ZeRO-1/2) or the
    16-bit conversion of one sub-group of its partition that ZeRO-3's copy back makes on the host
    (deepspeed_engine [Offload3]; transient, counted at its peak)."""
    if not training.optimizer_offload:
        return 0.0
    psi = optimizer_shard_params(model, layout, stage, layers)
    states = offload_host_bytes(training, layout.zero_stage) * training.optimizer_offload * psi
    if uses_deepspeed(training) and layout.zero_stage == 3:
        return states + PARAM_BYTES * min(psi, SUB_GROUP_ELEMENTS)
    return states + offload_staging_bytes(model, training, layout, stage)


def weight_and_adam_bytes(training: TrainingSpec, zero_stage: int | None = None) -> tuple[float, float]:
    """(weight, Adam state) bytes per parameter on the training's engine: FSDP2, which torchtitan applies
    at ZeRO-3 and for replication alike (zero_stage 0 or 3; None: either), keeps the sharded FP32 weight
    as Adam's master, so 4 and Adam's bytes less the master's 4; NeMo's distributed_fused_adam the BF16
    weight and its shard (apex_engine.state_bytes); every other engine the BF16 weight (2) and adam_bytes."""
    if uses_torchtitan(training) and zero_stage in (None, 0, 3):
        return FSDP2_PARAM_BYTES, adam_bytes(training) - FSDP2_PARAM_BYTES
    if apex_engine.uses_apex(training):
        return PARAM_BYTES, apex_engine.state_bytes(training)
    return PARAM_BYTES, adam_bytes(training)


def static_memory(
    num_params: float, *, grad_dtype: str = "bf16", zero_stage: int = 0, shard: int = 1,
    optimizer_bytes: float = ADAM_BYTES, param_bytes: float = PARAM_BYTES,
) -> StaticMemory:
    """Bytes of weights, gradients and Adam states for `num_params` parameters.

    With bf16 grads this is the 16-bytes/param ledger (2 + 2 + 12) [Rajbhandari20, §3.1];
    with fp32 main grads it is Megatron's 18 (2 + 4 + 12), and 6 + 12/d with its distributed
    optimizer (= ZeRO-1 over d ranks) [MegatronDistOpt]. ZeRO-1 shards the optimizer states,
    ZeRO-2 also the gradients, ZeRO-3 also the weights, each over `shard` ranks [Rajbhandari20, Fig. 1].

    Args:
        num_params: parameters held (the whole model, or one GPU's TP/PP slice).
        optimizer_bytes: Adam state per parameter (adam_bytes; 12 by default).
        param_bytes: bytes per weight (2; FSDP2's sharded FP32 master: FSDP2_PARAM_BYTES).
        grad_dtype: 'bf16' (2 bytes) or 'fp32' (4 bytes).
        zero_stage: 0-3.
        shard: ranks the ZeRO states are split over (dp, or dp*cp for Megatron).

    Returns:
        StaticMemory with params, grads and optimizer bytes.
    """
    if grad_dtype not in ("bf16", "fp32"):
        raise SpecError(f"grad_dtype must be 'bf16' or 'fp32', got {grad_dtype!r}", "grad_dtype")
    if zero_stage not in (0, 1, 2, 3):
        raise SpecError(f"zero_stage must be 0-3, got {zero_stage}", "zero_stage")
    if shard < 1:
        raise SpecError(f"shard must be >= 1, got {shard}", "shard")
    grad_bytes = 2 if grad_dtype == "bf16" else 4
    return StaticMemory(
        params=num_params * param_bytes / (shard if zero_stage >= 3 else 1),
        grads=num_params * grad_bytes / (shard if zero_stage >= 2 else 1),
        optimizer=num_params * optimizer_bytes / (shard if zero_stage >= 1 else 1),
    )


def expert_params(model: ModelSpec) -> int:
    """Parameters of all routed experts (0 for a dense model): MoE layers x routed_params_per_layer."""
    return model.moe_layers * routed_params_per_layer(model)


def moe_static_memory(model: ModelSpec, *, tp: int, pp: int, dp: int, ep: int, etp: int | None = None,
                      grad_dtype: str = "bf16", zero_stage: int = 0) -> StaticMemory:
    """Weights, gradients and Adam states per GPU of an MoE model, averaged over pp stages of L / pp
    layers: param_shards' split (the non-expert part by tp with its states over dp, the routed experts
    by ep x etp with theirs over the expert-data-parallel group tp x dp / (ep x etp)) [Megatron-LM@d98e8a6
    megatron/core/parallel_state.py: initialize_model_parallel; megatron/core/distributed/
    distributed_data_parallel.py: expt_dp_group].

    Raises:
        SpecError: ep x etp does not divide tp x dp, or ep does not divide the experts.
    """
    etp = tp if etp is None else etp
    if model.moe is not None:
        if (tp * dp) % (ep * etp):
            raise SpecError(f"ep: ep({ep}) x etp({etp}) must divide tp({tp}) x dp({dp}) (the expert grid folds onto "
                            "the same GPUs)", "ep")
        if model.moe.num_experts % ep:
            raise SpecError(f"ep: ep({ep}) must divide num_experts({model.moe.num_experts})", "ep")
    elif ep != 1:
        raise SpecError(f"ep: a dense model has no experts to split (ep={ep})", "ep")
    layout = Layout(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp if model.moe is not None else None, zero_stage=zero_stage)
    per = model.num_layers / pp  # the stages' average: each holds L / pp layers, the ends their extras
    return sharded_static_memory([sh for stage in range(pp) for sh in param_shards(model, layout, stage, per)],
                                 grad_dtype=grad_dtype, zero_stage=zero_stage, scale=1 / pp)


def sharded_static_memory(shards, *, grad_dtype: str, zero_stage: int, optimizer_bytes: float = ADAM_BYTES,
                          scale: float = 1.0, param_bytes: float = PARAM_BYTES) -> StaticMemory:
    """static_memory summed over parameter shards, each sharded (ZeRO) over its own data-parallel
    group (ParamShard.dp), times `scale`."""
    parts = [static_memory(sh.params * scale, grad_dtype=grad_dtype, optimizer_bytes=optimizer_bytes,
                           zero_stage=zero_stage, shard=sh.dp, param_bytes=param_bytes) for sh in shards]
    return StaticMemory(*(sum(getattr(x, k) for x in parts) for k in ("params", "grads", "optimizer")))


# ---------------------------------------------------------------------------------------------
# Activations per layer
# ---------------------------------------------------------------------------------------------
# Each term is (bytes, kind). kind "R": replicated across the TP group unless sequence parallel
# shards it; "T": split by TP always; "C": the attention core, dropped by selective recompute;
# "N": not divided by TP (per-head-independent caches).


def _gpt_terms(b: int, s: float, h: int, a: int, f: int, s_kv: float, flash: bool,
               dropout: bool = True) -> list[tuple[float, str]]:
    """GPT layer terms, [Korthikanti22, Table 2 and §4.1] and [MemRef §2a]; s is the local sequence.
    Without dropout the masks go, and eager attention keeps one softmax output (= PV input)."""
    sbh = s * b * h
    mask = [(1 * sbh, "R")] if dropout else []  # a hidden-dropout mask (1 byte)
    terms = [
        (2 * sbh, "R"),  # LN1 input
        (8 * s * b, "R"),  # LN1 mean + rstd, fp32 on GPU [MemRef §2a, 'not in the paper']
        (2 * sbh, "G"),  # QKV GEMM input
        (6 * sbh, "T"),  # Q, K, V (views of one fused 6sbh QKV output)
        (2 * sbh, "T"),  # out-proj GEMM input (= attention output)
        *mask,  # after attention
        (2 * sbh, "R"),  # LN2 input
        (8 * s * b, "R"),  # LN2 mean + rstd
        (2 * sbh, "G"),  # FC1 input
        (2 * s * b * f, "T"),  # GeLU input (FC1 output)
        (2 * s * b * f, "T"),  # FC2 input (GeLU output)
        *mask,  # after the MLP
    ]
    if flash:
        terms.append((4 * a * s * b, "C"))  # fp32 logsumexp [MemRef §2a]
    elif dropout:
        terms += [
            (2 * a * s * s_kv * b, "C"),  # softmax output
            (1 * a * s * s_kv * b, "C"),  # attention-dropout mask
            (2 * a * s * s_kv * b, "C"),  # dropped probabilities (PV input)
        ]
    else:
        terms.append((2 * a * s * s_kv * b, "C"))  # softmax output (= PV input)
    return terms


def fused_qkv_pin_bytes(tokens: float, q_width: int, kv_width: int) -> float:
    """Bytes a saved V pins beyond itself for `tokens` tokens: V is a view of Megatron's fused QKV GEMM
    output, so the BF16 Q and K parts of that buffer (q_width + kv_width wide) stay allocated with it
    (_llama_terms' P) [MemRef §2b]."""
    return 2 * tokens * (q_width + kv_width)


def _llama_terms(
    b: int, s: float, h: int, a: int, g: int, d: int, f: int, s_kv: float, flash: bool, rope_fusion: bool,
    qkv_fused: bool = True, fc1: int | None = None, parts: str = "am",
) -> list[tuple[float, str]]:
    """Llama layer terms [MemRef §2b]: RMSNorm, RoPE, GQA, SwiGLU, Megatron's fused QKV GEMM.

    Q and the attention output are a*d wide (= h unless kv_channels is set); the residual stream is h.
    fc1: FC1's output width (2 f, SwiGLU's gate and up, unless given). parts: the attention half ('a': its
    norm, QKV, core and out-proj inputs) and the MLP half ('m'), one each in a hybrid model's layers."""
    sbh, hkv, sbq = s * b * h, g * d, s * b * a * d
    fc1 = 2 * f if fc1 is None else fc1
    view_penalty = fused_qkv_pin_bytes(s * b, a * d, hkv) if qkv_fused else 0.0  # P: a saved V pins the fused QKV buffer
    terms = []
    if "a" in parts:
        terms += [
            (2 * sbh, "R"),  # RMSNorm1 input
            (4 * s * b, "R"),  # RMSNorm1 rstd, fp32
            (2 * sbh, "G"),  # QKV GEMM input
            (2 * sbq, "T"),  # Q after RoPE (a new tensor)
            (2 * sbq, "T"),  # attention output = out-proj GEMM input
        ]
    if "m" in parts:
        terms += [
            (2 * sbh, "R"),  # RMSNorm2 input
            (4 * s * b, "R"),  # RMSNorm2 rstd
            (2 * sbh, "G"),  # FC1 (gate||up) GEMM input
            (2 * s * b * fc1, "T"),  # SwiGLU input (FC1 output, 2f wide; f for squared ReLU)
            (2 * s * b * f, "T"),  # FC2 input (SwiGLU output)
        ]
    if "a" not in parts:
        return terms
    if not rope_fusion:
        terms.append((8 * s * d, "N"))  # R: unfused RoPE saves bf16 cos/sin per call [MemRef §2b]
    if flash:
        terms += [
            (2 * s * b * hkv, "T"),  # K after RoPE
            (2 * s * b * hkv + view_penalty, "T"),  # V, a view of the fused QKV output (+P)
            (4 * a * s * b, "C"),  # fp32 logsumexp
        ]
    else:
        expanded = g < a  # eager GQA expands K/V with repeat_interleave (copies release the view)
        terms += [
            (2 * sbq, "C"),  # K expanded to a heads (or K itself when g = a)
            (2 * sbq if expanded else 2 * s * b * hkv + view_penalty, "C"),  # V (expanded copy, or the view)
            (2 * a * s * s_kv * b, "C"),  # softmax output (= PV input; no dropout)
        ]
        # Selective recompute keeps the core's inputs instead: un-expanded K and the V view.
        terms += [(2 * s * b * hkv, "S"), (2 * s * b * hkv + view_penalty, "S")]
    return terms


def _op_saved_bytes(b: int, s: float, h: int, a: int, g: int, d: int, f: int, tp: int, sequence_parallel: bool,
                    fused_qkv: bool = False) -> float:
    """Bytes torchtitan's per-op selective checkpointing keeps for one llama block.

    Its policy saves the outputs of attention and of every other linear, counted in forward order
    per block, and the block's input as the checkpoint's argument; everything else is recomputed
    [torchtitan distributed/activation_checkpoint.py: SelectiveAC._wrap_block, 'Save all compute/comm
    ops, except every second mm/linear']. torchtitan's block runs wq, wk, wv (Attention.forward), wo,
    then w1, w3, w2 (FeedForward.forward: w2(silu(w1(x)) * w3(x))), so wq, wv, w1 and w2 are kept; with
    0.3's fused wqkv (torchtitan_engine.fuses_qkv) the block runs wqkv, wo, w1, w3, w2, so wqkv (Q, K and V:
    a d + 2 g d wide), w1 and w2 are.
    With TP, w2's output is the row-parallel partial sum over the whole local sequence (h wide on
    every rank); with sequence parallelism the reduce-scatters after wo and w2 are communication ops
    the policy also keeps."""
    sb = s * b
    hq, hkv = a * d, g * d
    saved = 2 * sb * h / (tp if sequence_parallel else 1)  # the block's input
    saved += 2 * sb * hq / tp + 2 * sb * hkv * (2 if fused_qkv else 1) / tp  # wqkv's output, or wq's and wv's
    saved += 2 * sb * hq / tp + 4 * a * sb / tp  # attention output and its fp32 logsumexp
    saved += 2 * sb * f / tp + 2 * sb * h  # w1 output, w2 output (partial sums with TP)
    if tp > 1 and sequence_parallel:
        saved += 2 * (2 * sb * h / tp)  # the reduce-scatter outputs of wo and w2
    return saved


def _mla_terms(b: int, s: float, h: int, a: int, m, f: int) -> list[tuple[float, str]]:
    """Multi-latent attention layer terms (flash attention, fused RoPE) from Megatron's forward
    [Megatron-LM@d98e8a6 megatron/core/transformer/multi_latent_attention.py: MLASelfAttention.
    get_query_key_value_tensors]: the down-projections (duplicated, on the sequence-parallel shard)
    share the norm output; each latent RMSNorm keeps its input and rstd; each up-projection (column
    parallel) its sequence-parallel input; the fused RoPE writes new Q and K (a (d_qk + d_rope) wide)
    and V (a d_v), which flash attention keeps with its fp32 logsumexp and output; then the llama MLP."""
    sb, qk, rope, v = s * b, m.qk_head_dim, m.qk_rope_head_dim, m.v_head_dim
    terms = [
        (2 * sb * h, "R"),  # RMSNorm1 input
        (4 * sb, "R"),  # RMSNorm1 rstd
        (2 * sb * h, "R"),  # down-projection input (the norm output)
    ]
    if m.q_lora_rank is not None:
        terms += [(2 * sb * m.q_lora_rank, "R"), (4 * sb, "R"), (2 * sb * m.q_lora_rank, "R")]  # q norm in, rstd, q_up in
    terms += [
        (2 * sb * m.kv_lora_rank, "R"), (4 * sb, "R"), (2 * sb * m.kv_lora_rank, "R"),  # kv norm in, rstd, kv_up in
        (2 * sb * a * (qk + rope), "T"),  # Q after RoPE
        (2 * sb * a * (qk + rope), "T"),  # K after RoPE
        (2 * sb * a * v, "T"),  # V
        (4 * a * sb, "C"),  # fp32 logsumexp
        (2 * sb * a * v, "T"),  # attention output = out-proj input
        (2 * sb * h, "R"),  # RMSNorm2 input
        (4 * sb, "R"),  # RMSNorm2 rstd
        (2 * sb * h, "R"),  # FC1 (gate||up) GEMM input
        (4 * sb * f, "T"),  # SwiGLU input
        (2 * sb * f, "T"),  # FC2 input
    ]
    return terms


FP8_ATTENTION_SAVED_BYTES = {"delayed": 1.0, "tensorwise": 1.0, "mxfp8": 2 * (1 + 1 / 32)}
"""Bytes per element of Q, K and V that Transformer Engine's FP8 attention saves for its backward, by
recipe: one FP8 copy under per-tensor scaling; under MXFP8 a row- and a column-wise copy with an E8M0
scale per 32 (combine_and_quantize with used_in_backward) [TransformerEngine@d0067d0 transformer_engine/
pytorch/attention/dot_product_attention/backends.py: FusedAttnFunc.forward (fp8_tensors); utils.py:
combine_and_quantize]."""
FP8_ATTENTION_SAVES_FP8_OUTPUT = ("delayed",)
"""The recipes under which it saves the output O in FP8 too (delayed scaling); tensorwise keeps O in BF16
(NVTE_DPA_FP8CS_O_in_F16 defaults to 1), as MXFP8 does [same: FusedAttnFunc.forward]."""


def fp8_attention_relief(model: ModelSpec, sb: float, tp: int, recipe: str, up_proj_recomputed: bool = False) -> float:
    """Bytes of one layer's saved activations that FP8 attention (TrainingSpec.fp8_attention under `recipe`)
    does not keep, for sb = b s / cp tokens on one GPU, where the attention core is not recomputed: its
    BF16 Q, K, V (and, for llama-family layers without per-head norms, the fused QKV buffer a saved V view
    pins: _llama_terms' P) give way to FP8_ATTENTION_SAVED_BYTES copies, and under delayed scaling its BF16
    output to a 1 B one (the out-projection keeps its own quantised copy, as with BF16 attention). Where MLA's
    up-projections are recomputed (mla_up_proj), recompute_module_freed_bytes already dropped the BF16 Q, K,
    V, so only the FP8 copies come back (a negative relief)."""
    a, (dqk, dv) = model.num_attention_heads, model.core_head_dims
    qb = FP8_ATTENTION_SAVED_BYTES[recipe]
    if model.mla is not None:
        elems = sb * a * (2 * dqk + dv) / tp
        bf16 = 2 * elems
    elif model.family == Family.GPT:  # Q, K, V: views of one fused 6sbh QKV output
        elems = 3 * sb * model.hidden_size / tp
        bf16 = 2 * elems
    else:
        hq, hkv = a * model.head_dim, model.kv_heads * model.head_dim
        elems = sb * (hq + 2 * hkv) / tp
        pinned = 0.0 if model.qk_norm else fused_qkv_pin_bytes(sb, hq, hkv) / tp  # the per-head norms' inputs keep it pinned
        bf16 = 2 * elems + pinned
    relief = -qb * elems if up_proj_recomputed and model.mla is not None else bf16 - qb * elems
    if recipe in FP8_ATTENTION_SAVES_FP8_OUTPUT:
        relief += (2 - 1) * sb * model.attention_out_width / tp
    return relief


@memo()
def activation_bytes_per_layer(
    model: ModelSpec,
    micro_batch_size: int,
    seq_length: int,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    recompute: str | Recompute = "none",
    attention: str = "flash",
    rope_fusion: bool = True,
    fp8_inputs: bool = False,
    etp: int | None = None,
    moe_layer: bool = True,
    moe_routing: MoERouting = BALANCED,
    recompute_modules: tuple[str, ...] = ("core_attn",),
    quant_bytes: float = 1.0,
    saved_gather_bytes: float | None = None,
    moe_scores_after_combine: bool = False,
    symbol: str | None = None,
    fp8_attention: str | None = None,
    fused_qkv: bool = False,
) -> float:
    """Bytes one transformer layer keeps for backward, for one micro-batch, on one GPU.

    GPT: sbh(34 + 5as/h) eager, 34sbh + 4asb flash [Korthikanti22, Table 2; MemRef §2a].
    Llama: [MemRef §2b] (SwiGLU 6sbf, GQA K/V, the fused-QKV view penalty, fp32 lse).
    TP without SP divides all but the replicated inputs/masks; TP with SP divides every term
    [Korthikanti22, §4.2.2]. CP divides the sequence [MemRef §2c]. Selective recompute drops the
    attention core; full recompute keeps only the layer input, 2sbh (/t with SP) [Korthikanti22, Table 2].
    LayerNorm/RMSNorm statistics (O(sb), fp32 on GPU) are included.

    Args:
        model: the model.
        micro_batch_size: b.
        seq_length: s (the whole sequence; CP splits it).
        tp, cp: tensor- and context-parallel degrees.
        sequence_parallel: Megatron SP (shards the replicated terms by tp).
        recompute: 'none', 'selective', 'full' or 'op' (torchtitan's per-op checkpointing).
        attention: 'flash' (no s^2 storage) or 'eager'.
        rope_fusion: fused RoPE saves no per-layer cos/sin (Megatron's default).
        quant_bytes: bytes per element of such a saved quantised input (1 for FP8; NVFP4's
            column-wise copy, NVFP4_ELEMENT_BYTES).
        fp8_inputs: Transformer Engine FP8 linears save their quantized input (1 B per element)
            for wgrad instead of the BF16 one [TransformerEngine@d0067d0 pytorch/module/linear.py:
            _Linear forward, 'Discard row-wise data since it is not needed in backward pass']. The
            QKV, FC1 and FC2 inputs are needed by nothing else, so they shrink to 1 B; the out-proj
            input is also the attention output flash attention keeps in BF16 for its own backward,
            so FP8 adds a 1 B copy (without recompute) or replaces it (selective recompute drops the
            core's copy).
        saved_gather_bytes: None where sequence parallelism saves the QKV and FC1 GEMM inputs as their
            sequence shard and all-gathers them again in backward (Megatron [Korthikanti22 §4.2.2]);
            else bytes per element of those inputs saved whole, as all-gathered: DTensor's
            sequence parallelism redistributes the block input Shard(1) -> Replicate at the attention
            and FFN boundaries, and the linear keeps that gathered input for its weight gradient
            (torchtitan: 2, BF16; 1 where torchao's float8 TP gathers in FP8) [torchtitan 0.3
            models/common/decoder_sharding.py: set_gqa_attention_sharding, set_dense_ffn_sharding
            (in_dst_shardings Replicate); torch autograd: mm saves its input for the weight
            gradient; tests/test_activation_harness.py measures it on two ranks].
        fused_qkv: with recompute='op', torchtitan 0.3's fused wqkv (torchtitan_engine.fuses_qkv), which moves
            the linears its per-op checkpointing keeps (_op_saved_bytes).
        moe_scores_after_combine: the routed experts' saved bytes as torchtitan's MoE keeps them
            (moe_routed_bytes: scores_after_combine), not Megatron's.
        etp: expert tensor-parallel degree of an MoE layer (None = tp); see moe_routed_bytes.
        moe_layer: False for one of an MoE model's leading dense layers (its MLP is ffn_hidden_size).
        symbol: a hybrid model's layer (HYBRID_SYMBOLS): '*' keeps the attention half's terms, '-' the dense
            MLP half's, 'E' the MoE half's (its norm, shared and routed experts), 'M' mamba_saved_bytes.
        moe_routing: how the routed tokens fall on the busiest expert rank (TrainingSpec.moe_routing).
        recompute_modules: with recompute='selective', Megatron's --recompute-modules (Layout.
            recomputed_modules); each frees what recompute_module_freed_bytes says.
        fp8_attention: the FP8 recipe under which the attention core runs Transformer Engine's FP8
            attention (TrainingSpec.fp8_attention; None: BF16): it saves what fp8_attention_relief says,
            unless the core is recomputed (its checkpoint keeps the BF16 Q, K, V it was given).

    Returns:
        Bytes per layer.

    Raises:
        SpecError: a non-positive size, an unknown mode, or cp > 1 with eager attention.
    """
    b, s = micro_batch_size, seq_length
    for name, v in (("micro_batch_size", b), ("seq_length", s), ("tp", tp), ("cp", cp)):
        if not isinstance(v, int) or v < 1:
            raise SpecError(f"{name} must be a positive integer, got {v!r}", name)
    if attention not in ("flash", "eager"):
        raise SpecError(f"attention must be 'flash' or 'eager', got {attention!r}", "attention")
    try:
        rc = Recompute(recompute)
    except ValueError:
        raise SpecError(f"recompute must be none, selective, full or op, got {recompute!r}", "recompute") from None
    if cp > 1 and attention != "flash":
        raise SpecError(f"cp ({cp}) > 1 needs attention='flash' (ring attention stores no s^2 scores)", "cp")
    h, a, f = model.hidden_size, model.num_attention_heads, model.ffn_hidden_size
    s_loc = s / cp  # every term sees the local sequence [MemRef §2c]
    sp_div = tp if sequence_parallel else 1
    if rc == Recompute.FULL:
        return 2 * s_loc * b * h / sp_div  # only the layer input [Korthikanti22, Table 2]
    if rc == Recompute.OP:
        if not model.op_recompute_priced:
            raise SpecError("recompute 'op' (torchtitan's per-op checkpointing) is priced for dense llama-family "
                            f"layers only; {model.name} is not one", "recompute")
        return _op_saved_bytes(b, s_loc, h, a, model.kv_heads, model.head_dim, f, tp, sequence_parallel, fused_qkv)
    act_b = quant_bytes if fp8_inputs else 2
    if symbol == "M":
        return mamba_saved_bytes(model, s_loc * b, tp=tp, sp_div=sp_div, act_b=act_b)
    parts = {None: "am", "*": "a", "-": "m", "E": "m"}[symbol]
    flash = attention == "flash"
    moe = model.moe if moe_layer and symbol in (None, "E") else None
    if moe is not None:  # the MLP is the shared experts (its FC1 input is also the router's input)
        f = moe.shared_expert_ffn_hidden_size
    if model.family == Family.GPT:
        terms = _gpt_terms(b, s_loc, h, a, f, s, flash, model.uses_dropout)
    elif model.mla is not None:
        terms = _mla_terms(b, s_loc, h, a, model.mla, f)
    else:
        terms = _llama_terms(b, s_loc, h, a, model.kv_heads, model.head_dim, f, s, flash, rope_fusion,
                             fc1=model.fc1_width(f), parts=parts)
        if model.qk_norm and "a" in parts:  # per-head RMSNorms keep their fp32 rstd; their inputs are views of the fused
            terms.append((4 * s_loc * b * (a + model.kv_heads), "T"))  # QKV output V already pins
    core = rc == Recompute.SELECTIVE and "core_attn" in recompute_modules  # the attention core re-run
    total = 0.0
    for nbytes, kind in terms:
        if kind == "C" and core:
            continue
        if kind == "S" and not core:
            continue
        if kind == "G" and saved_gather_bytes is not None and sp_div > 1:  # saved whole, as gathered
            total += nbytes * saved_gather_bytes / 2
            continue
        div = {"R": sp_div, "G": sp_div, "T": tp, "C": tp, "S": tp, "N": 1}[kind]
        total += nbytes / div
    if fp8_inputs:
        sb, q = s_loc * b, quant_bytes
        if "a" in parts:
            # attention: the QKV (MLA: down-projection) input 2 B -> q, and MLA's up-projection inputs;
            # the out-proj input is also flash attention's BF16 output (see above)
            total -= (2 - q) * sb * h / sp_div
            if model.mla is not None:
                total -= (2 - q) * sb * ((model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank) / sp_div
            total += sb * model.attention_out_width / tp * (-(2 - q) if core else q)
        if "m" in parts:
            # MLP: FC1 input 2 B -> q; an MoE layer's norm output stays BF16 for the router, so a
            # shared-expert FC1 adds a q-byte copy (none without shared experts); FC2 input 2 B -> q
            total += sb * h / sp_div * (-(2 - q) if moe is None else (q if f else 0))
            total -= (2 - q) * sb * f / tp
    if fp8_attention and flash and "a" in parts and not core:
        total -= fp8_attention_relief(model, s_loc * b, tp, fp8_attention,
                                      rc == Recompute.SELECTIVE and "mla_up_proj" in recompute_modules)
    if moe is not None:
        total += moe_routed_bytes(model, s_loc * b / sp_div, tp if etp is None else etp, fp8_inputs, moe_routing,
                                  quant_bytes, moe_scores_after_combine)
    if rc == Recompute.SELECTIVE:
        total -= recompute_module_freed_bytes(model, b, s_loc, tp=tp, sp_div=sp_div, modules=recompute_modules,
                                              fp8_inputs=fp8_inputs, etp=tp if etp is None else etp,
                                              moe_layer=moe_layer, moe_routing=moe_routing,
                                              quant_bytes=quant_bytes, symbol=symbol)
    return total


def mamba_saved_bytes(model: ModelSpec, tokens: float, *, tp: int, sp_div: int, act_b: float = 2) -> float:
    """Bytes one Mamba-2 layer keeps for backward for `tokens` tokens (b s / cp) on one GPU, as megatron-core
    0.19.2 trains it (use_mamba_mem_eff_path, the default) [ssm/mamba_mixer.py: MambaMixer.forward,
    _ssm_training; models/hybrid/hybrid_layer_specs.py: in_proj TELayerNormColumnParallelLinear]:
    - in_proj keeps its input for the fused norm's backward (2 h, R) with the norm's fp32 rstd, and the
      norm output for the weight gradient (act_b h: BF16, or the quantised copy under FP8), a sequence
      shard each under SP [TransformerEngine pytorch/module/layernorm_linear.py: _LayerNormLinear.forward];
    - mamba_split_conv1d_scan_combined keeps (z, x, B, C, dt), the transposed copy of in_proj's output
      (2 x (2 d_in + 2 G N + H) / tp), and the scan's ungated output out_x (2 d_in / tp); it re-runs the
      convolution in backward [mamba_ssm ops/triton/ssd_combined.py: MambaSplitConv1dScanCombinedFn.forward,
      ctx.save_for_backward];
    - the group RMSNorm keeps its input (2 d_in / tp) and one fp32 rstd per group [mamba_ssm
      ops/triton/layernorm_gated.py: LayerNormFn.forward];
    - out_proj keeps its input, the norm's output (act_b d_in / tp).
    The dt, A and D parameters and the convolution weights are parameters, not activations."""
    mb, h = model.mamba, model.hidden_size
    per_shard = (2 * h + 4 + act_b * h) / sp_div
    per_tp = (2 * mb.in_proj_width + 2 * mb.inner + 2 * mb.inner + 4 * mb.num_groups + act_b * mb.inner) / tp
    return tokens * (per_shard + per_tp)


def recompute_module_freed_bytes(model: ModelSpec, b: int, s_loc: float, *, tp: int, sp_div: int,
                                 modules: tuple[str, ...], fp8_inputs: bool, etp: int, moe_layer: bool,
                                 moe_routing: MoERouting = BALANCED, quant_bytes: float = 1.0,
                                 symbol: str | None = None) -> float:
    """Bytes of one layer's saved activations that Megatron's output-discarding and module checkpoints
    free, beyond the attention core (megatron-core 0.19.2; 'layernorm', 'moe_act' and 'mla_up_proj' run
    under tensor_parallel.CheckpointWithoutOutput, which drops its output's storage once the consumer has
    run and refills it before the backward; under FP8 the consuming linear is told to save its original
    input (set_save_original_input), so no quantised copy stays either):
    - layernorm: the outputs of the norms that are modules of their own (own_norms) [transformer/
      transformer_layer.py: recompute_input_layernorm / recompute_pre_mlp_layernorm; moe/moe_layer.py:
      set_for_recompute_pre_mlp_layernorm];
    - mla_up_proj: Q and K after RoPE and V [multi_latent_attention.py: qkv_up_checkpoint];
    - moe_act: the routed experts' activation output, the grouped FC2's input [moe/experts.py:
      TEGroupedMLP, activation_checkpoint];
    - moe (a normal checkpoint of the whole MoE block): everything the block keeps but its input;
    - mlp (dense layers; a normal checkpoint whose input is the residual stream the layer keeps anyway):
      the MLP's norm statistics, FC1 input, SwiGLU input and FC2 input [transformer_layer.py: recompute_mlp].
    """
    sb, h, freed = s_loc * b, model.hidden_size, 0.0
    moe = model.moe if moe_layer and symbol in (None, "E") else None
    act_b = quant_bytes if fp8_inputs else 2  # a TE FP8 (NVFP4) linear's saved input
    if "layernorm" in modules:
        input_norm, mlp_norm = own_norms(model, moe_layer, symbol)
        if input_norm:  # MLA's down-projections' saved input
            freed += act_b * sb * h / sp_div
        if mlp_norm:  # the BF16 norm output, and under FP8 the shared experts' 1 B copy
            freed += 2 * sb * h / sp_div + (act_b * sb * h / sp_div if fp8_inputs and moe.shared_expert_ffn_hidden_size else 0.0)
    if "mla_up_proj" in modules and model.mla is not None:
        m, a = model.mla, model.num_attention_heads
        freed += 2 * sb * a * (2 * (m.qk_head_dim + m.qk_rope_head_dim) + m.v_head_dim) / tp
    if "moe" in modules and moe is not None:  # the MoE block under one checkpoint keeps only its input, the
        # norm output [megatron-core 0.19.2 transformer/moe/moe_layer.py: MoELayer.forward, moe_layer_recompute:
        # tensor_parallel.checkpoint / te_checkpoint]: the router's and experts' saved tensors go, and the shared
        # experts' (their FC1 input's quantised copy too, unless layernorm freed it above)
        freed += moe_routed_bytes(model, sb / sp_div, etp, fp8_inputs, moe_routing, quant_bytes)
        if fs := moe.shared_expert_ffn_hidden_size:
            freed += 2 * sb * model.fc1_width(fs) / tp + act_b * sb * fs / tp
            freed += act_b * sb * h / sp_div if fp8_inputs and "layernorm" not in modules else 0.0
    elif "moe_act" in modules and moe is not None:  # (inside a checkpointed block it frees nothing more)
        freed += act_b * routed_rows(model, sb / sp_div, etp, moe_routing) * moe.expert_ffn_hidden_size / etp
    if "mlp" in modules and moe is None and model.family != Family.GPT and symbol in (None, "-"):
        f = model.ffn_hidden_size
        freed += 4 * sb / sp_div + act_b * sb * h / sp_div + 2 * sb * model.fc1_width(f) / tp + act_b * sb * f / tp
    return freed


MOE_ROUTER_SAVED_BYTES = 8
"""Bytes per token and expert the router keeps: its fp32 logits and the fp32 scores of the
softmax/sigmoid (the backward of each needs them) [Megatron-LM@d98e8a6 megatron/core/transformer/
moe/router.py: TopKRouter.routing, moe_utils.topk_softmax_with_capacity]."""


def routed_rows(model: ModelSpec, tokens: float, etp: int, routing: MoERouting = BALANCED) -> float:
    """Rows the busiest GPU's grouped GEMMs see for `tokens` tokens of the layer input on each rank:
    each token goes to top_k experts and the ETP all-gather brings etp ranks' rows (see
    moe_routed_bytes), routing.share times the mean on the busiest rank. Padded to capacity, every one
    of the ep x etp source ranks sends each of the GPU's E / ep experts exactly C = ceil(tokens top_k /
    E x c) rows, E etp C in all, whatever the routing [megatron-core 0.19.2 moe/moe_utils.py:
    get_capacity; token_dispatcher.py: MoEAlltoAllTokenDispatcher.preprocess, drop_and_pad:
    num_tokens_per_local_expert = capacity x tp_size x ep_size]. With etp = 1, also the rows one rank
    sends (padded) or the busiest receives over the all-to-all."""
    e = model.moe
    if routing.pad:
        return e.num_experts * etp * math.ceil(tokens * e.top_k / e.num_experts * routing.capacity_factor)
    return tokens * e.top_k * etp * routing.share


def own_norms(model: ModelSpec, moe_layer: bool = True, symbol: str | None = None) -> tuple[bool, bool]:
    """(input norm, pre-MLP norm): whether each of a layer's norms is a module of its own in Megatron's
    Transformer Engine layer, not fused into the linear after it (TELayerNormColumnParallelLinear):
    the input norm before MLA's down-projections, and an MoE layer's pre-MLP norm, whose output feeds
    the router and the shared experts [megatron-core 0.19.2 transformer/transformer_layer.py:
    TransformerLayer.__init__, IdentityOp norms are skipped by recompute 'layernorm']. A hybrid model's
    layer (symbol) has one norm, its own module only in an E layer [models/hybrid/hybrid_layer_specs.py]."""
    if symbol is not None:
        return False, symbol == "E"
    return model.mla is not None, model.moe is not None and moe_layer


def moe_routed_bytes(model: ModelSpec, tokens: float, etp: int, fp8_inputs: bool = False,
                     routing: MoERouting = BALANCED, quant_bytes: float = 1.0, scores_after_combine: bool = False) -> float:
    """Bytes the routed experts of one MoE layer keep for backward on one GPU that holds `tokens`
    tokens of the layer input (b s / (cp tp): sequence parallelism is required with tp > 1).

    Dropless with tokens balanced across experts (NVIDIA's benchmarks force it), each token goes to
    top_k experts; the all-to-all over EP and the all-gather over ETP bring R = tokens x top_k x etp
    rows to the GPU's grouped GEMMs, each expert 1/etp of f_e wide [Megatron-LM@d98e8a6
    megatron/core/transformer/moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher]. The grouped
    FC1 keeps its input (R h, BF16 or 1 B under FP8), the SwiGLU its input (R 2 f_e / etp), FC2 its
    input (R f_e / etp) [megatron/core/transformer/moe/experts.py: TEGroupedMLP.forward, the probs
    applied inside the activation]; the router keeps MOE_ROUTER_SAVED_BYTES per token and expert.
    routing: how the rows fall on the busiest rank (TrainingSpec.moe_routing: imbalance, capacity).
    scores_after_combine (torchtitan 0.3, etp 1): the router keeps its softmax's FP32 output (the gate
    runs under FP32 autocast; its input is the norm output the layer counts), the top-k ids (int64) and
    scores (FP32); the dispatch two int64 indices a routed row; the experts their input and SwiGLU's
    three BF16 tensors as compiled; and the scores weigh the combined rows after the all-to-all back, so
    those N top_k BF16 rows stay for the scores' gradient [torchtitan 0.3 models/common/moe.py:
    TokenChoiceTopKRouter.forward; token_dispatcher.py: AllToAllTokenDispatcher.combine]. Measured on
    torchtitan's own MoE module compiled with AOTAutograd's min-cut partition, as Inductor partitions
    (tests/test_activation_harness.py).
    LatentMoE (MoESpec.latent_size, L): the experts' rows are L wide, and the two latent projections keep
    their inputs: fc1_latent_proj the norm output the layer already counts (a new copy only where FP8 or
    NVFP4 quantises it), fc2_latent_proj the combined rows, L a token [moe_layer.py: MoELayer.preprocess,
    postprocess]."""
    e = model.moe
    rows, fe = routed_rows(model, tokens, etp, routing), e.expert_ffn_hidden_size / etp
    act_b = quant_bytes if fp8_inputs else 2
    width = e.width(model.hidden_size)
    experts = act_b * rows * width + 2 * rows * model.fc1_width(e.expert_ffn_hidden_size) / etp + act_b * rows * fe
    if e.latent_size:
        experts += act_b * tokens * e.latent_size + (act_b * tokens * model.hidden_size if fp8_inputs else 0.0)
    if scores_after_combine:
        n = tokens * e.top_k  # the rows this rank sent, combined back
        return 4 * tokens * e.num_experts + (8 + 4) * n + 2 * 8 * rows + experts + 2 * n * model.hidden_size
    return MOE_ROUTER_SAVED_BYTES * tokens * e.num_experts + experts


# ---------------------------------------------------------------------------------------------
# Pipeline stages
# ---------------------------------------------------------------------------------------------


def stage_layers(model: ModelSpec, layout: Layout) -> list[int]:
    """Layers on each pipeline rank: an explicit split (pipeline_layers, summed over each rank's
    virtual stages), even, or with uneven first/last stages (Megatron's
    --decoder-first/last-pipeline-num-layers: the rest split evenly over the middle stages).
    ASSUMPTION: with interleaving, activation and p2p terms treat a rank's chunks as equal.

    The caller validates divisibility (see planner.space.check_layout); this returns floor splits.
    """
    p, L = layout.pp, model.num_layers
    if layout.pipeline_layers is not None:  # any split: each rank holds its chunks' layers
        return [sum(layout.pipeline_layers[c * p + r] for c in range(layout.vpp)) for r in range(p)]
    if p == 1:
        return [L]
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if first is None and last is None:
        return [L // p] * p
    middle_count = p - (first is not None) - (last is not None)
    rest = L - (first or 0) - (last or 0)
    mid = rest // middle_count if middle_count else 0
    layers = [mid] * p
    layers[0] = first if first is not None else mid
    layers[-1] = last if last is not None else mid
    return layers


def routed_params_per_layer(model: ModelSpec) -> int:
    """Weights of one MoE layer's routed experts, E (fc1_width + 1) w f_e (E x 3 h f_e for SwiGLU; w the
    experts' width, MoESpec.width); 0 for a dense model."""
    if model.moe is None:
        return 0
    fe = model.moe.expert_ffn_hidden_size
    return model.moe.num_experts * (model.fc1_width(fe) + fe) * model.moe.width(model.hidden_size)


def layer_params(model: ModelSpec) -> int:
    """Parameters of one layer that TP splits and the data-parallel group replicates: the whole layer
    of a dense model; an MoE layer without its routed experts (attention, norms, router, shared experts); a
    hybrid model's largest layer (symbol_layer_params)."""
    if model.hybrid:
        return max(symbol_layer_params(model, c) for c in set(model.layer_pattern))
    if model.moe is None:
        return model.params_per_layer
    return model.moe_layer_params[0] - routed_params_per_layer(model)


def symbol_layer_params(model: ModelSpec, symbol: str) -> int:
    """Parameters of one hybrid layer of `symbol` that TP splits and the data-parallel group replicates:
    ModelSpec.symbol_params less an E layer's routed experts."""
    return model.symbol_params(symbol)[0] - (routed_params_per_layer(model) if symbol == "E" else 0)


def symbols_on(model: ModelSpec, layout: Layout, stage: int) -> dict[str, int]:
    """A hybrid model's layers on pipeline rank `stage` by symbol (ModelSpec.layer_pattern), counted
    layer by layer over its virtual stages as dense_layers_on counts interleaved dense layers (the
    split is fixed: Space.free_split is off for hybrid models); {} for a transformer."""
    if not model.hybrid:
        return {}
    chunks = virtual_stage_layers(model, layout)
    return dict(Counter(model.layer_pattern[j] for j in rank_layer_numbers(chunks, layout.pp, stage)))


def moe_layers_on(model: ModelSpec, layout: Layout, stage: int, layers: int) -> int:
    """MoE layers among the `layers` of pipeline rank `stage`, its MTP depths' included."""
    if model.moe is None:
        return 0
    own = symbols_on(model, layout, stage).get("E", 0) if model.hybrid else layers - dense_layers_on(model, layout, stage)
    return own + mtp_moe_layers(model, layout, stage)


def dense_layers_on(model: ModelSpec, layout: Layout, stage: int) -> int:
    """Leading dense layers (MoESpec.first_dense_layers) on pipeline rank `stage`. With an explicit
    split they fill the virtual stages in Megatron's order (stage i on rank i % pp); otherwise all sit
    on the first rank, whose first virtual stage planner.space requires to hold them (the search's
    rows, with the split a variable, assume the same). The stage functions are affine in the rank's
    layer count: `layers` counts them, and layers - dense_layers_on are MoE layers.

    With dense layers interleaved (MoESpec.layer_step > 1) the rank's own layers are counted, layer by
    layer (ModelSpec.is_moe_layer), over its virtual stages: pipeline_layers', else the layout's split
    (stage_layers; with interleaving, equal chunks: planner.space allows no other), which the search
    therefore does not vary (Space.free_split is off for such models)."""
    if model.moe is None or model.hybrid:  # a hybrid model's layers: symbols_on
        return 0
    if model.moe.layer_step == 1 and layout.pipeline_layers is None:
        return model.moe.first_dense_layers if stage == 0 else 0
    chunks = virtual_stage_layers(model, layout)
    return sum(not model.is_moe_layer(j) for j in rank_layer_numbers(chunks, layout.pp, stage))


def virtual_stage_layers(model: ModelSpec, layout: Layout) -> list[int]:
    """Layers of each virtual stage in Megatron's order (stage i on rank i % pp): pipeline_layers, else
    the layout's split (stage_layers) without interleaving, else equal chunks (with interleaving
    planner.space allows no other for models whose layer kinds follow the split)."""
    if layout.pipeline_layers is not None:
        return list(layout.pipeline_layers)
    p, v = layout.pp, layout.vpp
    return stage_layers(model, layout) if v == 1 else [model.num_layers // (p * v)] * (p * v)


def rank_layer_numbers(chunks, pp: int, stage: int):
    """Global layer numbers pipeline rank `stage` holds, its virtual stages' layer counts `chunks`
    placed in Megatron's order (virtual stage i on rank i % pp)."""
    start = 0
    for i, n in enumerate(chunks):
        if i % pp == stage:
            yield from range(start, start + n)
        start += n


def bf16_layers_on(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> int:
    """Layers of pipeline rank `stage` whose linears stay in BF16 under the low-precision recipe
    (TrainingSpec.bf16_first_layers / bf16_last_layers): bf16_kinds_on, counted."""
    return sum(bf16_kinds_on(model, training, layout, stage).values())


def bf16_kinds_on(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> dict[str, int]:
    """The BF16 first/last layers on pipeline rank `stage` by kind (layer_kind): Megatron keeps the model's
    first and last layers by global index in BF16 [Megatron-LM@d98e8a6 megatron/core/fp8_utils.py:
    get_fp8_context, is_first_last_bf16_layer; fp4_utils.py: get_fp4_context], a hybrid stack's too
    [megatron-core 0.19.2 models/hybrid/hybrid_block.py: HybridStack.forward, get_inner_quant_context]. With
    an explicit split or a hybrid model's fixed one they fall where it puts the first and last layers (stage
    i on rank i % pp); otherwise the first rank's first virtual stage holds the first ones and the last
    rank's last virtual stage the last ones (planner.space requires it), so the counts do not depend on the
    rank's layer count, and the stage functions stay affine in it."""
    k1, k2 = training.bf16_end_layers
    if not (k1 or k2):
        return {}
    p, L = layout.pp, model.num_layers
    first, last = set(range(min(k1, L))), set(range(max(0, L - k2), L))  # global layer numbers
    if model.hybrid or layout.pipeline_layers is not None:  # a split fixed layer by layer
        held = set(rank_layer_numbers(virtual_stage_layers(model, layout), p, stage)) & (first | last)
    else:
        held = (first if stage == 0 else set()) | (last if stage == p - 1 else set())
    return dict(Counter(layer_kind(model, j) for j in sorted(held)))


def layer_kind(model: ModelSpec, i: int) -> str:
    """Layer i's kind for pricing it: a hybrid model's symbol (HYBRID_SYMBOLS), else 'E' for an MoE layer and
    '-' for a dense one (every layer of a dense model)."""
    if model.hybrid:
        return model.layer_pattern[i]
    return "E" if model.is_moe_layer(i) else "-"


def stage_params(model: ModelSpec, layout: Layout, stage: int, layers: int) -> float:
    """Non-expert parameters one GPU of pipeline `stage` holds (its TP slice); the routed experts
    are in param_shards.

    The embedding lives on the first stage and the output layer on the last; a tied embedding
    is held on both when pp > 1 (Megatron keeps a copy for the output projection), and so is the
    input embedding with multi-token prediction, whose depths on the last rank embed the next tokens
    (GPTModel builds it where pre_process or mtp_process) [megatron-core 0.19.2 models/gpt/gpt_model.py:
    GPTModel.__init__]; the MTP depths themselves are on the last rank too (mtp_stage_params).
    Whole on every TP rank: MLA's duplicated down-projections and LatentMoE's latent projections
    (tp_whole_params). ASSUMPTION: every other weight is split by tp; the replicated norms, biases and
    router are < 0.1 % of a layer.
    """
    p, dense = layout.pp, dense_layers_on(model, layout, stage)
    if model.hybrid:
        n = sum(k * symbol_layer_params(model, c) for c, k in symbols_on(model, layout, stage).items())
    else:
        n = (layers - dense) * layer_params(model) + dense * model.params_per_layer
    if stage == 0:
        n += model.embedding_params
    if stage == p - 1:
        n += model.output_params + mtp_stage_params(model, layout)
        if ends_share_embedding(model, p):
            n += model.vocab_size * model.hidden_size
    dup = tp_whole_params(model, layout, stage, layers)
    return (n - dup) / layout.tp + dup


def tp_whole_params(model: ModelSpec, layout: Layout, stage: int, layers: int) -> int:
    """Of stage_params' weights, those whole on every TP rank: MLA's duplicated down-projections per layer
    and LatentMoE's two latent projections per MoE layer (MoESpec.latent_params), the last rank's MTP depths'
    included (mtp_whole_params)."""
    own = layers * model.mla_duplicated_params
    if model.moe is not None:
        moe = moe_layers_on(model, layout, stage, layers) - mtp_moe_layers(model, layout, stage)
        own += moe * model.moe.latent_params(model.hidden_size)
    return own + (mtp_whole_params(model) if stage == layout.pp - 1 else 0)


def mtp_whole_params(model: ModelSpec) -> int:
    """Of the MTP depths' weights (mtp_stage_params), those whole on every TP rank (tp_whole_params)."""
    latent = model.moe.latent_params(model.hidden_size) if model.moe is not None and model.mtp_layer_is_moe else 0
    return model.mtp_param_depths * (model.mla_duplicated_params + latent)


def ends_share_embedding(model: ModelSpec, pp: int) -> bool:
    """Whether the first and the last of `pp` pipeline ranks each hold the V x h word embedding: tied to
    the output layer, or embedding the next tokens for MTP depths, with pp > 1 (Megatron keeps the copy
    and all-reduces its gradient between them: cost.embedding_sync_time)."""
    return pp > 1 and bool(model.tied_embeddings or model.mtp_layers)


def mtp_stage_params(model: ModelSpec, layout: Layout) -> int:
    """Parameters of the multi-token prediction depths the last rank holds that TP splits and the
    data-parallel group replicates: ModelSpec.mtp_params less an MoE layer's routed experts, which
    param_shards counts with the rank's other experts; 0 without MTP."""
    return model.mtp_params - (model.mtp_param_depths * routed_params_per_layer(model) if model.mtp_layer_is_moe else 0)


@dataclass(frozen=True)
class ParamShard:
    """Parameters one GPU holds that share one data-parallel group."""

    params: float
    """Parameters on the GPU."""
    dp: int
    """Ranks holding the same parameters: gradients are reduced and ZeRO states sharded over them."""
    axis: str
    """The group: 'dpcp' (dp x cp) or 'edp' (expert data parallel)."""


def param_shards(model: ModelSpec, layout: Layout, stage: int, layers: int) -> tuple[ParamShard, ...]:
    """The GPU's parameters by data-parallel group: the non-expert ones (split by tp, replicated over
    dp x cp) and, for an MoE model, the routed experts (split by ep x etp, replicated over the
    expert-data-parallel group tp cp dp / (ep etp)). Expert parameters (allreduce=False) get their own
    gradient buffers and distributed optimizer over that group [Megatron-LM@d98e8a6
    megatron/core/distributed/distributed_data_parallel.py: expert-parallel buffers on
    expt_dp_group; megatron/core/parallel_state.py: initialize_model_parallel]."""
    dense = ParamShard(stage_params(model, layout, stage, layers), layout.dp * layout.cp, "dpcp")
    if model.moe is None:
        return (dense,)
    experts = moe_layers_on(model, layout, stage, layers) * routed_params_per_layer(model) / (layout.ep * layout.expert_tp)
    return dense, ParamShard(experts, layout.edp, "edp")


def mtp_moe_layers(model: ModelSpec, layout: Layout, stage: int) -> int:
    """MoE layers with weights the multi-token prediction depths add to pipeline rank `stage`:
    ModelSpec.mtp_param_depths on the last rank where the depth is MoE (ModelSpec.mtp_layer_is_moe), else 0."""
    return model.mtp_param_depths if stage == layout.pp - 1 and model.mtp_layer_is_moe else 0


def in_flight_microbatches(layout: Layout, stage: int, num_microbatches: int) -> float:
    """Micro-batches of activations stage `stage` holds at its peak, in units of its whole layers.

    1F1B: stage i holds min(p - i, m) micro-batches [Korthikanti22, Eq. 5 and §4.3].
    Interleaved (v chunks): rank i holds min(2(p-i-1) + (v-1)p + 1, m v) chunk-micro-batches of
    L_i/v layers; on the first stage that is p(1 + (p-1)/(p v)) [Korthikanti22, §4.3 / Narayanan21 §2.2].
    MoE's ep_overlap runs the interleaved warm-up one chunk further [megatron-core 0.19.2
    pipeline_parallel/schedules.py: get_pp_rank_microbatches, overlap_moe_expert_parallel_comm]; at
    pp = 1 it adds one layer, not a micro-batch (stage_activation_items: ep_overlap_layer).
    """
    p, v, m = layout.pp, layout.vpp, num_microbatches
    extra = 1 if layout.ep_overlap else 0  # the combined 1F1B runs one more forward ahead (planner.cost.ep_unpaired_share)
    if v == 1:
        return float(min(p - stage, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1 + extra, m * v)
    return chunks / v


# ---------------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryItem:
    """One line of the ledger."""

    name: str
    bytes: float
    note: str = ""


@dataclass(frozen=True)
class StageMemory:
    """The items of one pipeline stage."""

    stage: int
    layers: int
    items: tuple[MemoryItem, ...]

    @property
    def total(self) -> float:
        """Bytes per GPU on this stage."""
        return sum(i.bytes for i in self.items)

    @property
    def dominant(self) -> MemoryItem:
        """The largest item."""
        return max(self.items, key=lambda i: i.bytes)

    def get(self, name: str) -> float:
        """Bytes of the named item (0 if absent)."""
        return sum(i.bytes for i in self.items if i.name == name)


@dataclass(frozen=True)
class MemoryLedger:
    """Per-stage ledgers; the peak is the worst stage."""

    stages: tuple[StageMemory, ...]
    capacity: float
    """GPU memory, bytes."""
    breakdown: dict[str, float] = field(default_factory=dict)
    host: tuple[float, ...] = ()
    """Per stage: host bytes one GPU's rank pins for its offloaded optimizer share (empty without)."""
    host_capacity: float | None = None
    """Host memory per GPU (ClusterSpec.host_memory_per_gpu); None without a host spec."""

    @property
    def host_fits(self) -> bool:
        """Every stage's offloaded states within its share of host memory (True with nothing offloaded)."""
        if not any(self.host):
            return True
        return self.host_capacity is not None and max(self.host) <= self.host_capacity

    @property
    def peak_stage(self) -> StageMemory:
        """The stage with the highest total (the first one on ties)."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def peak_bytes(self) -> float:
        """Peak bytes per GPU over all stages."""
        return self.peak_stage.total

    @property
    def fits(self) -> bool:
        """Peak (overhead included) within GPU memory."""
        return self.peak_bytes <= self.capacity

    @property
    def headroom(self) -> float:
        """Capacity minus peak, bytes (negative when it does not fit)."""
        return self.capacity - self.peak_bytes


STATIC_ITEMS = frozenset({"weights", "gradients", "optimizer", "zero3_gather", "fp8_weights", "zero_buckets",
                          "fsdp2_output_layer", "fsdp2_pipeline_grads", "bf16_grads", "offload_grad_buffer"})
"""The names stage_static_items produces: the items that depend on the ZeRO stage."""


def stage_static_items(
    model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, layers: int
) -> list[MemoryItem]:
    """The items that depend on the ZeRO stage: weights, gradients, Adam states, ZeRO-3 buffers.

    They do not depend on the micro-batch or recomputation (see stage_activation_items)."""
    # torchtitan applies FSDP2 for ZeRO-3 and for replication alike (a replicate x 1 mesh: the
    # "shard" is the whole weight) [torchtitan 0.3 models/llama3/parallelize.py: apply_fsdp_to_decoder]
    fsdp2 = uses_torchtitan(training) and layout.zero_stage in (0, 3)
    param_bytes, optimizer_bytes = weight_and_adam_bytes(training, layout.zero_stage)
    shards = param_shards(model, layout, stage, layers)
    st = sharded_static_memory(shards, grad_dtype=training.grad_dtype, zero_stage=layout.zero_stage,
                               optimizer_bytes=optimizer_bytes, param_bytes=param_bytes)
    kept = 1 - training.optimizer_offload  # the rest is pinned on the host (stage_host_bytes)
    if fsdp2 and training.optimizer_offload:  # CPUOffloadPolicy: the whole shard on the host
        items = [MemoryItem(name, 0.0, "on the host (FSDP2 CPU offload)") for name in ("weights", "gradients", "optimizer")]
    else:
        # ZeRO-3's offload keeps its gradient partition on the host too (deepspeed_engine [Offload3]);
        # ASSUMPTION: the per-parameter GPU copy partition_grads adds into is transient
        host_grads = uses_deepspeed(training) and layout.zero_stage == 3 and bool(training.optimizer_offload)
        items = [
            MemoryItem("weights", st.params, "fp32 shards, FSDP2's master, 4 B/param" if fsdp2 else "bf16, 2 B/param"),
            MemoryItem("gradients", 0.0, "the gradient partition on the host (ZeRO-3 offload)") if host_grads else
            MemoryItem("gradients", apex_engine.gradient_bytes(model, training, layout, stage, sum(sh.params for sh in shards)),
                       f"{training.grad_dtype} buffer (FP32 for the embeddings and the output layer) and its reduced "
                       f"1/{layout.dp * layout.cp} shard (DistributedFusedAdam)") if apex_engine.uses_apex(training) else
            MemoryItem("gradients", st.grads, f"{training.grad_dtype}, {2 if training.grad_dtype == 'bf16' else 4} B/param"),
            MemoryItem("optimizer", st.optimizer * kept,
                       "Adam m + v (the master is the fp32 weight shard), 8 B/param" if fsdp2
                       else f"Adam fp32 master + m + v, 12 B/param, on the GPU for {kept:.0%} of the shard"
                       if training.optimizer_offload
                       else f"the fp32 master's {'whole' if optimizer_bytes == 12 else '16-bit remainders'} + fp32 m + v, "
                       f"{optimizer_bytes:g} B/param (DistributedFusedAdam)" if apex_engine.uses_apex(training)
                       else "Adam fp32 master + m + v, 12 B/param" if training.optimizer_states == "fp32"
                       else f"Adam bf16 m + v and the master weight, {adam_bytes(training):g} B/param"),
        ]
    # FSDP2 under torchtitan's pipeline keeps every unit of the stage gathered for the whole step --
    # no reshard after forward with PP [torchtitan 0.3 distributed/fsdp.py:
    # get_fsdp_reshard_after_forward_policy], none after a backward but the last [torch 2.13
    # distributed/pipelining/stage.py: backward_maybe_with_nosync, perform_reduce_grad] -- and reduces
    # nothing before the last backward: each unit's gradient accumulates unsharded in the reduce dtype,
    # FP32 [torch fsdp/_fully_shard/_fsdp_param.py: to_accumulated_grad_if_needed; torchtitan's
    # mixed_precision_reduce is float32]
    pipelined = fsdp2 and layout.pp > 1
    out = model.vocab_size * model.hidden_size / layout.tp if fsdp2 and stage == layout.pp - 1 else 0.0
    if layout.zero_stage == 3 or fsdp2:  # FP8 where the weights are gathered in FP8 (norms are negligible)
        per = 1 if training.fp8_param_gather else PARAM_BYTES
        n = layers if pipelined else ZERO3_PREFETCH_LAYERS
        what = f"gathered {'FP8' if per == 1 else 'bf16'} weights of {n} layers"
        # a layer's unit: its TP slice and, in an MoE layer, its local experts -- Megatron-FSDP gathers
        # those in a group of their own over the expert-data-parallel ranks, within the same unit
        # [megatron-core 0.19.2 distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:
        # _get_parameter_groups, units sub-classified by is_expert_param]
        gathered = n * (layer_params(model) / layout.tp + routed_params_per_layer(model) / (layout.ep * layout.expert_tp))
        if pipelined and stage == 0:
            gathered += model.vocab_size * model.hidden_size / layout.tp
            what += " and the embedding"
        if uses_deepspeed(training):  # what DeepSpeed's reuse distance keeps gathered, and its prefetch
            gathered = zero3_gathered_params(layer_params(model) / layout.tp, layers)
            what = f"bf16 weights DeepSpeed keeps gathered into the backward ({gathered / 1e6:.0f}M parameters)"
        items.append(MemoryItem("zero3_gather", gathered * per, what))
    if out and pipelined and training.loss_chunks > 1:  # its FP32 accumulator is fsdp2_pipeline_grads' share
        items.append(MemoryItem("fsdp2_output_layer", out * 2 * PARAM_BYTES, "the output layer gathered for the "
                                "step and a loss chunk's bf16 gradient"))
    elif out and pipelined:
        items.append(MemoryItem("fsdp2_output_layer", out * PARAM_BYTES, "the output layer gathered for the step"))
    elif out and training.loss_chunks > 1:  # torchtitan_engine [Loss]: no gradient sync before the last chunk
        items.append(MemoryItem("fsdp2_output_layer", out * (2 * PARAM_BYTES + FSDP2_ACCUMULATED_GRAD_BYTES),
                                f"the output layer gathered, its gradient accumulated unsharded in FP32 over the "
                                f"{training.loss_chunks} loss chunks and a chunk's bf16 gradient"))
    elif out:
        items.append(MemoryItem("fsdp2_output_layer", 2 * out * PARAM_BYTES, "the output layer gathered (its FSDP "
                                "unit is not resharded after forward) and its unsharded bf16 gradient, at the start "
                                "of backward"))
    if pipelined and layout.zero_stage == 3:  # replicated, the gradients item is that whole FP32 gradient
        unsharded = sum(sh.params for sh in shards)
        items.append(MemoryItem("fsdp2_pipeline_grads", FSDP2_ACCUMULATED_GRAD_BYTES * unsharded,
                                "the stage's gradients accumulated unsharded in FP32 until the last backward"))
    if per_lp := lp_grad_bytes(training, layout):
        items.append(MemoryItem("bf16_grads", per_lp * sum(sh.params for sh in shards),
                                "BF16_Optimizer's BF16 gradients, zeroed (not freed) before each micro-batch's backward"))
    if staging := offload_staging_bytes(model, training, layout, stage):
        items.append(MemoryItem("offload_grad_buffer", staging, "ZeRO-Offload's 16-bit staging buffer the size of "
                                "the largest parameter (temp_grad_buffer_for_gpu_offload)"))
    if uses_deepspeed(training) and (buckets := reduce_bucket_bytes(training, layout)):
        items.append(MemoryItem("zero_buckets", buckets, f"DeepSpeed's contiguous-gradient reduce bucket(s), "
                                f"{REDUCE_BUCKET_ELEMENTS / 1e6:.0f}M elements each ({wrapper(training, layout)})"))
    if training.fp8 in TE_RECIPES and not training.fp8_param_gather:
        # with --fp8-param-gather the weights themselves are the FP8 tensors (row- and column-wise,
        # 2 B, as the BF16 weight was): no copies beside them. NVFP4: two copies of 0.5625 B
        per = QUANTIZED_COPIES * quantized_element_bytes(training)
        items.append(MemoryItem("fp8_weights", stage_linear_params(model, training, layout, stage, layers) * per,
                                f"{'NVFP4' if training.fp8 == 'nvfp4' else 'FP8'} row- and column-wise copies of the linear weights"))
    return items


def param_gather_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, layers: int) -> tuple[float, ...]:
    """Bytes of the weights one GPU of pipeline `stage` all-gathers (ZeRO >= 1), per param_shards
    entry: 2 per parameter, 1 for the linear weights under --fp8-param-gather [Megatron-LM@d98e8a6
    megatron/core/transformer/transformer_config.py: fp8_param; shared/reference/framework-mechanisms.md §4].
    Routed experts are all linear weights. MXFP8 weights are the exception: their tile scales cannot
    be mapped into the contiguous parameter buffer, so the distributed optimizer gathers them in BF16
    through a buffer it shares with the gradients and quantises after the gather, 2 B per parameter
    (MXFP8_GATHER_BYTES)."""
    shards = param_shards(model, layout, stage, layers)
    if not training.fp8_param_gather:
        return tuple(sh.params * PARAM_BYTES for sh in shards)
    if training.fp8 == "mxfp8":
        return tuple(sh.params * MXFP8_GATHER_BYTES for sh in shards)
    fp8 = stage_linear_params(model, training, layout, stage, layers) - sum(sh.params for sh in shards[1:])  # non-expert ones
    out = [(shards[0].params - fp8) * PARAM_BYTES + fp8]
    return tuple(out + [sh.params for sh in shards[1:]])


MXFP8_GATHER_BYTES = 2
"""Bytes per parameter the distributed optimizer all-gathers for MXFP8 weights under --fp8-param-gather:
_ParamAndGradBuffer allocates one buffer of the gradient dtype for the gradients and the parameter
all-gather (its first half viewed as BF16 under FP32 gradients), the optimizer stages its FP32 master
shard there as BF16, and each gathered bucket is cast into the MXFP8 weights after the gather
[megatron-core 0.19.2 distributed/param_and_grad_buffer.py: _ParamAndGradBuffer.__init__ ('For MXFP8
param: Create a shared buffer for param AG and grad RS'), _ParamAndGradBucketGroup._post_param_sync;
optimizer/distrib_optimizer.py: _copy_main_params_to_param_buffer]. No BF16 weight is kept beside the
MXFP8 one, as for the other recipes under --fp8-param-gather."""

TE_FP8_RECIPES = frozenset({"delayed", "tensorwise", "blockwise", "mxfp8"})
"""The FP8 recipes Transformer Engine runs (torchao's rowwise and tensor-wise are torchtitan's, without a weight cache)."""

TE_RECIPES = TE_FP8_RECIPES | {"nvfp4"}
"""Every low-precision recipe run by Transformer Engine's linears (weight cache, quantised saved inputs)."""

NVFP4_ELEMENT_BYTES = 0.5 + 1 / 16
"""Bytes per element of one NVFP4 copy: a 4-bit E2M1 value and an E4M3 scale per 16 values (the
per-tensor FP32 scale is negligible) [NVIDIA/TransformerEngine@d0067d0
transformer_engine/common/recipe/__init__.py: NVFP4BlockScaling]."""


def quantized_element_bytes(training: TrainingSpec) -> float:
    """Bytes per element of one quantised copy of a GEMM operand under the training's recipe: 1 for
    FP8, NVFP4_ELEMENT_BYTES for NVFP4 (scales of the FP8 block recipes, < 4 %, left out)."""
    return NVFP4_ELEMENT_BYTES if training.fp8 == "nvfp4" else 1.0

FLOAT8_TP_RECIPES = frozenset({"torchao-tensorwise"})
"""Recipes whose sequence-parallel all-gathers move FP8 (1 B per element): torchao's Float8ColwiseParallel
casts its input before the all-gather, and Float8RowwiseParallel casts the output's gradient before
the backward all-gather (NoopFwToFloat8BwDynamic); the reduce-scatters stay BF16 [torchao
float8/float8_tensor_parallel.py; torchtitan applies them with tensor-wise float8]."""

TE_TENSORWISE_RECIPES = frozenset({"delayed", "tensorwise"})
"""Transformer Engine's recipes with one scale per tensor, whose column-wise copy is the row-wise one
transposed (Hopper's Float8Tensor), so a gathered row-wise copy gives both."""


def tp_gather_element_bytes(training: TrainingSpec, backward: bool = False, userbuffers: bool = False) -> float:
    """Bytes per element of a sequence-parallel all-gather: forward, of a column-parallel linear's input
    (QKV, FC1); backward, of a row-parallel linear's output gradient (out-projection, FC2). BF16: 2.
    torchao's float8 TP (FLOAT8_TP_RECIPES): 1 both ways. Transformer Engine's recipes quantise before
    they gather, and gather the quantised copies [NVIDIA/TransformerEngine@d0067d0
    transformer_engine/pytorch/module/layernorm_linear.py: _LayerNormLinear.forward,
    gather_along_first_dim(ln_out, tp_group, quantizer=quantizer) after set_usage(rowwise=True,
    columnwise=False); module/base.py: grad_output_preprocess, gather_along_first_dim(grad_output,
    tp_group, quantizer=quantizer); distributed.py: gather_along_first_dim -> _all_gather_fp8,
    _start_all_gather_fp8_blockwise, _all_gather_mxfp8, _all_gather_nvfp4]: forward the row-wise copy;
    backward the gradient's quantizer asks for both copies (module/linear.py: _Linear.backward,
    set_usage(rowwise=True, columnwise=True), dgrad and wgrad), which tensor-wise FP8 makes by
    transposing the gathered row-wise data (TE_TENSORWISE_RECIPES: one copy) and the block-scaled
    recipes (blockwise, MXFP8, NVFP4) gather both, unless Userbuffers carries the gather
    (--tp-comm-overlap: one usage at a time, set_usage(columnwise=False) under ub_overlap_ag).
    quantized_element_bytes per copy (the block recipes' scales, < 4 %, left out). The reduce-scatters
    stay BF16 in every recipe. Transformer Engine 1.x gathered FP8 too (v1.13 layernorm_linear.py: the
    norm writes FP8 before gather_along_first_dim; base.py: grad_output_preprocess casts, then gathers)."""
    if training.fp8 in FLOAT8_TP_RECIPES:
        return 1.0
    if training.fp8 not in TE_RECIPES:
        return 2.0
    both = backward and not userbuffers and training.fp8 not in TE_TENSORWISE_RECIPES
    return (2 if both else 1) * quantized_element_bytes(training)


QUANTIZED_COPIES = 2
"""Transformer Engine quantises a GEMM operand needed in forward and backward into a row-wise and a
column-wise copy, both from the high-precision source; for the linear weights it keeps both across
the micro-batches of a step beside the BF16 weight (1 + 1 B/param under FP8)
[NVIDIA/TransformerEngine@d0067d0 transformer_engine/common/recipe/__init__.py;
shared/reference/framework-mechanisms.md §4]; block and MXFP8 scales (one per 128 or 32 values) add
< 4 % and are left out."""


def linear_params_per_layer(model: ModelSpec) -> int:
    """Weights of one dense layer's linear layers (QKV or MLA's projections, out-proj, FC1 (gate and
    up), FC2); the norms and biases are not FP8."""
    h, f = model.hidden_size, model.ffn_hidden_size
    up = model.fc1_width(f) if model.family != Family.GPT else f
    return _attention_linear(model) + h * up + f * h


def _attention_linear(model: ModelSpec) -> int:
    """Linear weights of one layer's attention: QKV and out-proj; with MLA the down- and
    up-projections and out-proj (the latent norms excluded)."""
    if model.mla is None:
        h, hkv, hq = model.hidden_size, model.kv_hidden, model.q_hidden
        return h * (hq + 2 * hkv) + hq * h
    m = model.mla
    return model.attention_params - m.kv_lora_rank - (m.q_lora_rank or 0)


def stage_linear_params(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, layers: int) -> float:
    """Linear weights one GPU of pipeline `stage` holds in the low-precision recipe (its leading
    dense layers' included; its BF16 first/last layers, bf16_layers_on, not; the last rank's MTP
    layers, which run under the recipe [megatron-core 0.19.2 transformer/multi_token_prediction.py:
    MultiTokenPredictionLayer.get_inner_quantization_context], included)."""
    mtp = model.mtp_param_depths * linear_params_per_gpu(model, layout, model.mtp_layer_is_moe) if stage == layout.pp - 1 else 0.0
    bf16 = bf16_kinds_on(model, training, layout, stage)
    if model.hybrid:
        return mtp + sum((k - bf16.get(c, 0)) * linear_params_per_gpu(model, layout, symbol=c)
                         for c, k in symbols_on(model, layout, stage).items())
    dense = dense_layers_on(model, layout, stage)
    bf16_dense = bf16.get("-", 0) if model.moe is not None else 0  # a dense model's layers are all the default kind
    low = layers - dense - (sum(bf16.values()) - bf16_dense)
    return low * linear_params_per_gpu(model, layout) + (dense - bf16_dense) * linear_params_per_gpu(model, layout, False) + mtp


def linear_params_per_gpu(model: ModelSpec, layout: Layout, moe_layer: bool = True, symbol: str | None = None) -> float:
    """FP8-capable linear weights of one layer on one GPU: split by tp, but for MLA's duplicated
    down-projections (whole on every rank); an MoE layer's routed experts split by ep x etp and its
    shared experts by tp, LatentMoE's latent projections whole (the router stays in high precision). moe_layer=False: one of an MoE
    model's leading dense layers. symbol: a hybrid model's layer, its one block's linears (a Mamba-2
    layer's in_proj and out_proj; the convolution and the scan are not GEMMs)."""
    h, tp = model.hidden_size, layout.tp
    if symbol is not None:
        if symbol == "M":
            return h * (model.mamba.in_proj_width + model.mamba.inner) / tp
        if symbol == "*":
            return _attention_linear(model) / tp
        if symbol == "-":
            return (linear_params_per_layer(model) - _attention_linear(model)) / tp
        return linear_params_per_gpu(model, layout) - _attention_linear(model) / tp
    dup = model.mla_duplicated_params - ((model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank if model.mla else 0)
    attention = (_attention_linear(model) - dup) / tp + dup
    if model.moe is None or not moe_layer:
        return attention + (linear_params_per_layer(model) - _attention_linear(model)) / tp
    e = model.moe
    fs = e.shared_expert_ffn_hidden_size
    return (attention + (model.fc1_width(fs) + fs) * h / tp + e.latent_params(h)
            + routed_params_per_layer(model) / (layout.ep * layout.expert_tp))


def saved_gather_bytes(training: TrainingSpec) -> float | None:
    """activation_bytes_per_layer's saved_gather_bytes for the training's engine: torchtitan's DTensor
    sequence parallelism keeps the gathered QKV and FC1 inputs (1 B under torchao's float8 TP, which
    gathers in FP8: FLOAT8_TP_RECIPES; else BF16), Megatron's the shard (None)."""
    if not uses_torchtitan(training):
        return None
    return tp_gather_element_bytes(training)


def stage_activation_items(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int, layers: int
) -> list[MemoryItem]:
    """The items that do not depend on the ZeRO stage: activations, logits, overhead."""
    p, b, s, t = layout.pp, layout.micro_batch_size, training.seq_length, layout.tp
    m = num_microbatches(training, layout)
    kw = dict(tp=t, cp=layout.cp, sequence_parallel=layout.sequence_parallel, attention=training.attention,
              fp8_inputs=training.fp8 in TE_RECIPES, quant_bytes=quantized_element_bytes(training),
              etp=layout.expert_tp, moe_routing=training.moe_routing,
              recompute_modules=layout.recomputed_modules, saved_gather_bytes=saved_gather_bytes(training),
              moe_scores_after_combine=uses_torchtitan(training), fused_qkv=fuses_qkv(training),
              fp8_attention=training.fp8 if training.fp8_attention else None)
    dense = dense_layers_on(model, layout, stage)
    bf16 = bf16_kinds_on(model, training, layout, stage)  # BF16 first/last layers by kind (layer_kind)
    symbols = symbols_on(model, layout, stage)  # a hybrid model's layers by kind

    def layer_bytes(rc: str, moe_layer: bool = True, symbol: str | None = None, fp8_inputs: bool | None = None) -> float:
        over = {} if fp8_inputs is None else {"fp8_inputs": fp8_inputs}
        if fp8_inputs is False:  # a BF16 end layer attends in BF16 too
            over["fp8_attention"] = None
        return activation_bytes_per_layer(model, b, s, recompute=rc, moe_layer=moe_layer, symbol=symbol, **{**kw, **over})

    def kind_bytes(rc: str, kind: str, fp8_inputs: bool | None = None) -> float:
        """One layer of layer_kind `kind`."""
        if model.hybrid:
            return layer_bytes(rc, symbol=kind, fp8_inputs=fp8_inputs)
        return layer_bytes(rc, model.moe is None or kind == "E", fp8_inputs=fp8_inputs)

    def one_layer(rc: str) -> float:
        """The most one of the rank's layers keeps with `rc`."""
        if symbols:
            return max(layer_bytes(rc, symbol=c) for c in symbols)
        return max(layer_bytes(rc), layer_bytes(rc, False) if dense else 0.0)

    def bf16_extra(rc: str) -> float:
        """What the rank's BF16 first/last layers save beyond low-precision ones of their kinds (their linears'
        inputs in BF16); 0 without such layers."""
        return sum(k * (kind_bytes(rc, c, fp8_inputs=False) - kind_bytes(rc, c)) for c, k in bf16.items())

    def kept(rc: str, first: int) -> float:
        """Bytes for one micro-batch of the rank's layers from index `first` on, with `rc`: its leading
        dense layers come first. ASSUMPTION: a hybrid rank's layers from `first` on are its layer kinds in
        the proportions of all of them (exact without a partial full recompute)."""
        if symbols:
            return (layers - first) / layers * sum(k * layer_bytes(rc, symbol=c) for c, k in symbols.items())
        d = max(0, dense - first)
        return (layers - first - d) * layer_bytes(rc) + (d * layer_bytes(rc, False) if d else 0.0)

    flight = in_flight_microbatches(layout, stage, m)
    items = []
    if layout.recompute == Recompute.FULL:  # the first n_rc layers keep only their input
        if layout.recompute_num_layers is None:
            n_rc, per_mb = layers, layers * layer_bytes("full")
        else:  # affine in the layers from n_rc on (the rank's dense layers are counted, whatever n)
            n_rc = min(layout.recompute_num_layers, layers)
            per_mb = n_rc * layer_bytes("full") + kept("none", n_rc)
        # ASSUMPTION: with a partial count the BF16 layers are among the kept ones (an over-count on
        # the first rank, whose first layers Megatron recomputes)
        per_mb += bf16_extra("full" if layout.recompute_num_layers is None else "none")
        items.append(MemoryItem("activations", flight * per_mb, f"{flight:g} micro-batches in flight"))
        if n_rc > 0:  # the layer being recomputed holds its full activations at the backward peak [MemRef §3]
            peak = max([one_layer("none")] + [kind_bytes("none", c, fp8_inputs=False) for c in bf16])
            items.append(MemoryItem("recompute_peak", peak, "one layer re-materialised in backward"))
    else:
        rc = layout.recompute.value
        items.append(MemoryItem("activations", flight * (kept(rc, 0) + bf16_extra(rc)),
                                f"{flight:g} micro-batches in flight"))
        if layout.recompute == Recompute.OP:  # backward re-materialises what the block did not keep
            items.append(MemoryItem("recompute_peak", layer_bytes("none") - layer_bytes("op"),
                                    "one block's recomputed tensors in backward"))
    if layout.ep_overlap and layout.vpp == 1 and m > 1:
        # the combined 1F1B without pipelining pairs micro-batch i+1's layer j with micro-batch i's
        # layer L-1-j and frees each backward layer after its pair: one layer more than a micro-batch
        # [megatron-core 0.19.2 models/common/model_chunk_schedule_plan.py:
        # TransformerModelChunkSchedulePlan.run: get_layer(i) with pop_layer(), then release_state()]
        one = one_layer(layout.recompute.value)
        items.append(MemoryItem("ep_overlap_layer", one, "the next micro-batch's layer beside the backward"))
    s_loc, h, V = s / layout.cp, model.hidden_size, model.vocab_size
    sp_div = t if layout.sequence_parallel else 1
    edge = 2 * s_loc * b * h / sp_div  # one micro-batch's bf16 activation at a pipeline stage's edge
    if uses_torchtitan(training) and p > 1:  # torch's pipeline stages keep tensors at their edges
        n = pipeline_edge_tensors(p, layout.vpp, stage, m, flight)
        items.append(MemoryItem("pipeline_buffers", n * edge,
                                f"{n:g} bf16 tensors at the stages' edges: receive buffers (one per micro-batch, "
                                "activation and gradient) and the in-flight micro-batches' stage outputs"))
    elif uses_deepspeed(training) and (n := held_stage_outputs(p, stage, flight, t)):  # DeepSpeed's pipe_buffers
        items.append(MemoryItem("pipeline_buffers", n * edge,
                                f"the in-flight micro-batches' stage outputs held for backward"
                                + (f" (DeepSpeed's 1/{t} partitions)" if t > 1 else "")))
    if stage == 0 and model.uses_dropout:
        # embedding-dropout mask, 1 byte per element, per micro-batch in flight [MemRef §2c]
        items.append(MemoryItem("embedding", flight * s_loc * b * h / sp_div, "embedding-dropout mask"))
    if stage == p - 1:
        # final-norm input + output-GEMM input + fp32 logits: 4sbh(1 + V/h)/t [MemRef §2c]
        loss = loss_kind(training)
        if loss == "te":  # the BF16 logits, the gradient written over them, three fp32 per
            # row (max, sum, target logit) [NVIDIA/TransformerEngine@02965d2 transformer_engine/pytorch/triton/
            # cross_entropy.py: cross_entropy_forward (m_d_X_y), cross_entropy_backward (in place, returns _input)]
            items.append(MemoryItem("logits", 4 * s_loc * b * h / sp_div + 2 * s_loc * b * V / t + 12 * s_loc * b,
                                    "final norm and output layer inputs, bf16 logits holding their gradient (TE loss)"))
        elif loss == "flash-attn":  # the BF16 logits and their BF16 gradient, three fp32 per
            # row (loss, lse, z-loss) [flash-attn flash_attn/ops/triton/cross_entropy.py: CrossEntropyLoss:
            # save_for_backward(logits, lse, labels); backward: dlogits = torch.empty_like(logits)]
            items.append(MemoryItem("logits", 4 * s_loc * b * h / sp_div + (2 + 2) * s_loc * b * V / t + 12 * s_loc * b,
                                    "output layer input, bf16 logits and their gradient (fused loss)"))
        elif loss == "torchtitan-chunks":  # torchtitan's ChunkedLossWrapper (torchtitan_engine [Loss])
            n = training.loss_chunks
            whole = (2 / sp_div + 2 + (2 if b > 1 else 0) + 4) * s_loc * b * h  # norm input, output, chunk copies, FP32 grad
            chunk = chunk_loss_peak_sbv(t) * s_loc * b * V / (t * n)
            items.append(MemoryItem("logits", whole + chunk, f"final norm input, the decoder's output (its chunks copied "
                                    f"unless the batch is 1) and its FP32 gradient, one of {n} chunks' logits and its "
                                    "compiled loss at their peak"))
        elif loss == "torchtitan-whole":  # torchtitan before 0.3: the whole sequence's eager loss [WholeLoss]
            # the final norm's input (its sequence shard) and the output layer's, which DTensor gathers whole
            inputs = 2 * s_loc * b * h / sp_div + 2 * s_loc * b * h
            peak = whole_loss_peak_sbv(t, p) * s_loc * b * V / t
            items.append(MemoryItem("logits", inputs + peak, "final norm and output layer inputs, the loss's fp32 "
                                    "log-probabilities and gradients at its backward peak"
                                    + (" (loss_parallel)" if t > 1 else "") + (", the bf16 logits" if p > 1 else "")))
        else:  # megatron-core's vocab-parallel loss, fused or not, or Megatron-DeepSpeed's (deepspeed_engine [Loss])
            peak = DEEPSPEED_LOSS_PEAK_SBV if loss == "megatron-deepspeed" else MEGATRON_LOSS_PEAK_SBV
            items.append(MemoryItem("logits", 4 * s_loc * b * h / sp_div + peak * s_loc * b * V / t,
                                    "final norm and output layer inputs, the loss at its peak"))
    if stage == p - 1 and model.mtp_layers:  # each depth holds a second set of what the logits item holds
        logits = next(it.bytes for it in items if it.name == "logits")
        items.append(mtp_item(model, layout, s_loc * b, logits, layer_bytes))
    items.append(MemoryItem("overhead", cluster.memory_overhead, "CUDA context, NCCL buffers, fragmentation"))
    return items


def mtp_item(model: ModelSpec, layout: Layout, tokens: float, logits: float, layer_bytes) -> MemoryItem:
    """What the last rank keeps for one micro-batch of its multi-token prediction depths (held, like
    the logits, for the one micro-batch whose backward comes next): per depth, the next tokens'
    embedding (the enorm input, 2 B per element) and the 2h-wide eh_proj input (4), one transformer
    layer of the last decoder layer's kind (layer_bytes), and the output layer's inputs and loss as the
    `logits` item holds them, each depth's loss kept until backward [megatron-core 0.19.2
    transformer/multi_token_prediction.py: MultiTokenPredictionLayer._concat_embeddings,
    process_mtp_loss]. Under full recompute Megatron checkpoints each depth whole, keeping its two
    inputs (_checkpointed_forward): the embedding and the decoder's output, 2 + 2 B."""
    h, sp = model.hidden_size, layout.tp if layout.sequence_parallel else 1
    moe = model.mtp_layer_is_moe
    if layout.recompute == Recompute.FULL:
        depth = (2 + 2) * tokens * h / sp
    else:
        depth = (2 + 4) * tokens * h / sp + layer_bytes(layout.recompute.value, moe)
    return MemoryItem("mtp", model.mtp_layers * (depth + logits),
                      f"{model.mtp_layers} multi-token prediction depth(s): inputs, layer, logits and loss")


def stage_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    layout: Layout,
    stage: int,
    layers: int,
) -> StageMemory:
    """The ledger of one pipeline stage (bytes per GPU): static items, then activation items."""
    items = stage_static_items(model, training, layout, stage, layers)
    items += stage_activation_items(model, cluster, training, layout, stage, layers)
    return StageMemory(stage=stage, layers=layers, items=tuple(items))


def memory_ledger(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> MemoryLedger:
    """Every pipeline stage's ledger; peak = the worst stage.

    The caller is expected to have validated the layout (planner.space.check_layout).
    """
    layers = stage_layers(model, layout)
    stages = tuple(stage_memory(model, cluster, training, layout, i, n) for i, n in enumerate(layers))
    host = tuple(stage_host_bytes(model, training, layout, i, n) for i, n in enumerate(layers)) \
        if training.optimizer_offload else ()
    return MemoryLedger(stages=stages, capacity=cluster.gpu.memory, host=host, host_capacity=cluster.host_memory_per_gpu)
