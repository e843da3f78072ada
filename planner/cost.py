"""Step time of one training iteration, term by term, as pure functions of the specs and a layout.

The step splits into two parts with disjoint inputs, each built from per-rank terms that are
functions of the rank's layer count, so the CP-SAT search can keep the layer split as variables:
    pipeline_time(layout without zero_stage)   per rank: compute, recompute, TP, CP, p2p (linear in
                                               the layers, StageCoefficients); then fill and drain
    update_time(layout without recompute)      per rank: exposed DP collectives + the Adam step;
                                               the step waits for the slowest rank

References:
    [Narayanan21] Narayanan et al., SC21, arXiv:2104.04473: §2.2 bubble (p-1)/(v m), §3 FLOPs, §5.1.
    [Korthikanti22] arXiv:2205.05198: §4.2 TP/SP communication, Eq. 7/8 model and hardware FLOPs.
    [Rajbhandari20] ZeRO, arXiv:1910.02054 §7: ZeRO-3 moves 3 Psi, 1.5x data parallelism.
    [MegatronFLOPs] Megatron-LM training.py num_floating_point_operations (GQA, SwiGLU terms).
    [MegatronCP] Megatron-LM docs context_parallel.rst (ring exchange of K/V, overlapped with attention).
    [HwRef] shared/reference/hardware-and-comm.md (GEMM efficiency by size §3, overlap §4.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import apex_engine, deepspeed_engine, torchtitan_engine
from planner._interp import interp
from planner._memo import memo
from planner.comm import alltoall_time, collective_time, node_dedup_alltoall_time, p2p_time
from planner.errors import PlannerError
from planner.deepspeed_engine import CPU_STEP_BYTES as DEEPSPEED_CPU_STEP_BYTES
from planner.deepspeed_engine import OFFLOAD_D2H_BYTES as DEEPSPEED_D2H_BYTES
from planner.deepspeed_engine import OFFLOAD3_BOUNDARY_D2H_BYTES as DEEPSPEED3_D2H_BYTES
from planner.deepspeed_engine import OFFLOAD_H2D_BYTES as DEEPSPEED_H2D_BYTES
from planner.deepspeed_engine import offload_micro_batch_link_bytes
from planner.deepspeed_engine import GRAD_WIRE_BYTES, REDUCE_BUCKET_ELEMENTS, Wrapper, uses_deepspeed, wrapper
from planner.memory import (
    PARAM_BYTES,
    QUANTIZED_COPIES,
    TE_RECIPES,
    ParamShard,
    adam_bytes,
    bf16_kinds_on,
    linear_params_per_gpu,
    loss_kind,
    moe_layers_on,
    mtp_stage_params,
    mtp_whole_params,
    optimizer_shard_params,
    param_gather_bytes,
    dense_layers_on,
    ends_share_embedding,
    own_norms,
    param_shards,
    quantized_element_bytes,
    routed_params_per_layer,
    routed_rows,
    stage_layers,
    stage_params,
    symbols_on,
    tp_gather_element_bytes,
)
from planner.specs import (ATTENTION_REFERENCE_KEYS, FP8_ATTENTION_RECIPES, ClusterSpec, Family, Kernels, Layout, LengthCurve, ModelSpec, Recompute, TrainingSpec,
                           num_microbatches)
from planner.topology import axis_stride, group_placement, placement
from planner.torchtitan_engine import CPU_ACCUMULATE_BYTES, CPU_CLIP_BYTES
from planner.torchtitan_engine import OFFLOAD_D2H_BYTES as OFFLOAD_D2H_BYTES_FSDP2
from planner.torchtitan_engine import OFFLOAD_H2D_BYTES as OFFLOAD_H2D_BYTES_FSDP2
from planner.torchtitan_engine import uses_torchtitan

__all__ = [
    "fsdp_prefetch_priced",
    "OffloadTime",
    "stage_offload_time",
    "layer_gemm_flops",
    "attention_gemm_flops",
    "mlp_gemm_flops",
    "mla_up_proj_flops",
    "model_flops_per_token",
    "gemm_efficiency",
    "fp8_attention_speed",
    "fp8_attention_cast_elements",
    "StageTime",
    "PipelineTime",
    "StageCoefficients",
    "stage_coefficients",
    "ranks_coefficients",
    "stage_time",
    "recomputed_layers",
    "pipeline_time",
    "UpdateTime",
    "stage_update_time",
    "update_time",
    "dp_time",
    "TIME_UNIT_S",
    "us_units",
    "training_flops",
    "time_to_train_s",
    "ddp_bucket_params",
    "loss_traffic_bytes",
    "loss_seconds",
    "OutputTime",
    "output_time",
    "mtp_head_time",
    "mtp_time",
]

FLASH_BWD_FACTOR = 2.5  # flash backward recomputes QK^T: 5 matmuls vs 2 forward (FlashAttention-2 §3.1)
ADAM_OTHER_BYTES = 8
# ASSUMPTION: besides reading and writing its states (2 x adam_bytes: 24 B with fp32 states), the
# Adam step reads the grad (4 B) and writes the bf16 weight (2 B), plus ~2 B of norm/clip passes:
# 32 bytes of HBM traffic per local param with fp32 states, 20 with BF16 states.


def attention_gemm_flops(model: ModelSpec, tokens: float, tp: int, sequence_parallel: bool = True) -> list[float]:
    """Forward FLOPs of each attention GEMM of one layer on one GPU, for `tokens` tokens (2 FLOPs per MAC).

    [MegatronFLOPs]: QKV h x (a d + 2 h_kv), out-proj a d x h (a d = h unless the model sets
    kv_channels). MLA [DeepSeek-V3 report §2.1.1; MLASelfAttention]: Q down h x r_q, KV down
    h x (r_kv + d_rope) -- duplicated on every TP rank, each on its own sequence-parallel shard (all
    tokens without SP) -- then Q up r_q x a (d_qk + d_rope) (h x that without r_q), KV up
    r_kv x a (d_qk + d_v) and out-proj a d_v x h, split by tp.
    """
    h = model.hidden_size
    if model.mla is None:
        hkv, hq = model.kv_hidden, model.q_hidden
        return [2 * tokens * h * (hq + 2 * hkv) / tp, 2 * tokens * hq * h / tp]
    m, a = model.mla, model.num_attention_heads
    own = tokens / tp if sequence_parallel else tokens
    qk = m.qk_head_dim + m.qk_rope_head_dim
    q = ([2 * own * h * m.q_lora_rank, 2 * tokens * m.q_lora_rank * a * qk / tp] if m.q_lora_rank is not None
         else [2 * tokens * h * a * qk / tp])
    return q + [2 * own * h * (m.kv_lora_rank + m.qk_rope_head_dim),
                2 * tokens * m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim) / tp,
                2 * tokens * a * m.v_head_dim * h / tp]


def mlp_gemm_flops(model: ModelSpec, tokens: float, tp: int) -> list[float]:
    """Forward FLOPs of a dense MLP's GEMMs on one GPU: 2 h f each for GeLU (and squared ReLU), fused
    gate||up 2 h 2f then down 2 f h for SwiGLU [MegatronFLOPs]."""
    h, f = model.hidden_size, model.ffn_hidden_size
    if model.family == Family.GPT:
        return [2 * tokens * h * f / tp, 2 * tokens * f * h / tp]
    return [2 * tokens * h * model.fc1_width(f) / tp, 2 * tokens * f * h / tp]


def mla_up_proj_flops(model: ModelSpec, tokens: float, tp: int) -> list[float]:
    """Forward FLOPs of MLA's up-projections on one GPU, what --recompute-modules mla_up_proj re-runs:
    Q up r_q x a (d_qk + d_rope) (Q's projection h x that without r_q) and KV up r_kv x a (d_qk + d_v)
    [megatron-core 0.19.2 transformer/multi_latent_attention.py: qkv_up_proj_and_rope_apply]."""
    m, a, h = model.mla, model.num_attention_heads, model.hidden_size
    qk = m.qk_head_dim + m.qk_rope_head_dim
    return [2 * tokens * (m.q_lora_rank or h) * a * qk / tp, 2 * tokens * m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim) / tp]


def op_recompute_gemm_flops(model: ModelSpec, tokens: float, tp: int, fused_qkv: bool = False) -> list[float]:
    """Forward FLOPs of the linears torchtitan's per-op checkpointing recomputes in one llama block on
    one GPU: the even ones in forward order (wq, wk, wv, wo, w1, w3, w2), i.e. wk, wo and w3; with 0.3's
    fused wqkv (wqkv, wo, w1, w3, w2: torchtitan_engine.fuses_qkv) wo and w3
    [torchtitan distributed/activation_checkpoint.py: SelectiveAC; see memory._op_saved_bytes]."""
    h, f = model.hidden_size, model.ffn_hidden_size
    wk = [] if fused_qkv else [2 * tokens * h * model.kv_hidden / tp]
    return wk + [2 * tokens * model.q_hidden * h / tp, 2 * tokens * h * f / tp]


def layer_gemm_flops(model: ModelSpec, tokens: float, tp: int) -> list[float]:
    """Forward FLOPs of each GEMM of one dense layer on one GPU: attention_gemm_flops, then mlp_gemm_flops."""
    return attention_gemm_flops(model, tokens, tp) + mlp_gemm_flops(model, tokens, tp)


MAMBA_CHUNK = 128
"""Tokens per chunk of the Mamba-2 SSD scan (megatron-core 0.19.2 ssm/mamba_mixer.py: MambaMixer.__init__,
chunk_size=128)."""


def mamba_gemm_flops(model: ModelSpec, tokens: float, tp: int) -> list[float]:
    """Forward FLOPs of a Mamba-2 layer's GEMMs on one GPU: in_proj h x (2 d_in + 2 G N + H) and out_proj
    d_in x h, column- and row-parallel over tp [megatron-core 0.19.2 ssm/mamba_mixer.py: MambaMixer]."""
    mb, h = model.mamba, model.hidden_size
    return [2 * tokens * h * mb.in_proj_width / tp, 2 * tokens * mb.inner * h / tp]


def mamba_scan_flops(model: ModelSpec, tokens: float, tp: int) -> float:
    """Forward FLOPs of the SSD chunked scan on one GPU, chunks of Q = MAMBA_CHUNK: per token and head,
    2 Q P for the chunk's masked (C B^T) X product and 4 N P for the chunk states (B^T X) and the output
    from the passed states (C h); per token and group 2 Q N for C B^T [Dao & Gu 2024, Mamba-2 §6 (the SSD
    algorithm's four steps); mamba_ssm ops/triton/ssd_combined.py: _mamba_chunk_scan_combined_fwd]. Heads
    and groups split over tp."""
    mb, q = model.mamba, MAMBA_CHUNK
    per_head = 2 * q * mb.head_dim + 4 * mb.state_dim * mb.head_dim
    return tokens * (per_head * mb.num_heads + 2 * q * mb.state_dim * mb.num_groups) / tp


def mamba_scan_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """HBM bytes the forward of one Mamba-2 layer's convolution, scan and gated norm move on one GPU, kernel
    by kernel [mamba_ssm ops/triton/ssd_combined.py: MambaSplitConv1dScanCombinedFn.forward,
    _mamba_chunk_scan_combined_fwd; megatron-core 0.19.2 MambaMixer._ssm_training], with S = H P N / Q the
    chunk states per token, W the convolution's x, B, C channels:
    causal_conv1d (read and write W, BF16: 4 W); _chunk_state_fwd (read x and B: 2 d_in + 2 G N; write the
    FP32 states: 4 S); _state_passing_fwd (read 4 S, write BF16 2 S); _bmm_chunk_fwd (read C and B: 4 G N;
    write C B^T in FP32: 4 G Q); _chunk_scan_fwd (read C B^T 4 G Q, x 2 d_in, C 2 G N, the states 2 S, z
    2 d_in; write the gated output and out_x: 4 d_in); the group RMSNorm (read and write 2 d_in each).
    In all 4 W + 14 d_in + 8 G N + 12 S + 8 G Q per token, split over tp. The dt cumsum (H per token) is
    left out."""
    mb, q = model.mamba, MAMBA_CHUNK
    gn, states = mb.num_groups * mb.state_dim, mb.num_heads * mb.head_dim * mb.state_dim / q
    return tokens * (4 * mb.conv_width + 14 * mb.inner + 8 * gn + 12 * states + 8 * mb.num_groups * q) / tp


def mamba_scan_time(model: ModelSpec, cluster: ClusterSpec, tokens: float, tp: int) -> float:
    """Forward seconds of one Mamba-2 layer's convolution, scan and norm on one GPU: the slower of its
    FLOPs (mamba_scan_flops) at the cluster's fused-attention efficiency and its HBM traffic
    (mamba_scan_bytes), the whole at the cluster's Calibration.mamba_scan_efficiency (1 unless calibrated).
    ASSUMPTION: the Triton SSD kernels' tensor-core matmuls run as efficiently as a fused attention kernel's;
    at Mamba-2's sizes (Q = 128, N = 128, P = 64) the traffic decides."""
    gpu, cal = cluster.gpu, cluster.calibration
    flops = mamba_scan_flops(model, tokens, tp) / (gpu.peak_bf16_flops * cal.attention_efficiency)
    roof = max(flops, mamba_scan_bytes(model, tokens, tp) / (gpu.hbm_bandwidth * cal.hbm_efficiency))
    return roof / cal.mamba_scan_efficiency


MAMBA_SCAN_BWD_FACTOR = 3.0
"""Backward seconds of the convolution, scan and norm per forward second: the backward re-runs the convolution
and the forward's chunk cumsum, C B^T, chunk-state and state-passing kernels (all but the chunk scan), then
runs a dozen gradient kernels over the same tensors and their gradients [mamba_ssm ops/triton/ssd_combined.py:
MambaSplitConv1dScanCombinedFn.backward (causal_conv1d_fwd, then causal_conv1d_bwd),
_mamba_chunk_scan_combined_bwd]. ASSUMPTION: those gradient kernels move twice the forward's bytes, as the
other layers' backward passes are priced at twice their forward; the re-run once more: 3."""


FLASH_KEY_TILE = 128
"""Keys per tile of a flash-attention kernel (FlashAttention-2/3 and cuDNN's fused attention use
128-wide key blocks for these head widths); a tile the mask touches at all is computed whole."""


def computed_score_share(model: ModelSpec, s: int, document_tokens: int | None = None) -> float:
    """Share of the s x s score matrix a flash kernel computes, averaged over the model's layers.

    A causal layer computes half. A windowed layer of w keys (itself included) computes, per query,
    the k = min(s, w + T - 1) keys of the tiles its window overlaps (T = FLASH_KEY_TILE), fewer at
    the start of the sequence: s k - k^2 / 2 of s^2 (1/2 again when k = s). GPT-OSS at s = 4096:
    w = 128, k = 255, 0.0603 per windowed layer, (0.5 + 0.0603) / 2 = 0.280 over its alternating
    layers. ASSUMPTION: the pattern's mean per layer (a stage holding an odd number of alternating
    layers is priced half a layer off).

    Masked per document of d tokens (TrainingSpec.document_tokens): s / d causal blocks of d^2 / 2,
    d / (2 s) of the matrix; a window within each (k = min(d, w + T - 1)): (d k - k^2 / 2) / (d s).
    The kernel's tile waste at short lengths is flash_speed_factor's (the length curve at d), as for
    a window. ASSUMPTION: every document has the token-weighted mean length (the cost of a block is
    its length squared, so that mean is the one that adds up)."""
    d = s if document_tokens is None else min(document_tokens, s)
    if not model.windowed_layers:
        return d / (2 * s)
    full = model.num_layers - model.windowed_layers
    return (full * d / (2 * s) + model.windowed_layers * _windowed_share(model, s, d)) / model.num_layers


def _window_keys(model: ModelSpec, s: int) -> int:
    """Keys per query a flash kernel computes in a windowed layer: the tiles the window overlaps."""
    return min(s, model.sliding_window + FLASH_KEY_TILE - 1)


def _windowed_share(model: ModelSpec, s: int, d: int | None = None) -> float:
    """Share of a windowed layer's s x s score matrix a flash kernel computes, within documents of
    d tokens (d = s: one; computed_score_share)."""
    d = s if d is None else d
    k = min(d, _window_keys(model, s))
    return (d * k - k * k / 2) / (d * s)


FLASH_CAUSAL_CURVE = ((512, 191.0), (1024, 260.0), (2048, 298.0), (4096, 319.0), (8192, 333.0), (16384, 335.0))
"""FlashAttention-2's causal forward speed (TFLOP/s, masked FLOPs) by sequence length, head dim 128,
H100 SXM5 [Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Fig. 'Attention forward speed,
head dim 128 (H100 80GB SXM5)', causal]. Short sequences run far below the plateau: fewer tiles
per head, and the diagonal tiles (computed whole, half masked) weigh more."""


def flash_length_factor(keys: float, curve: LengthCurve | None = None) -> tuple[float, float]:
    """(forward, backward) speed of a causal flash kernel whose queries see `keys` keys, relative to
    the calibrated forward at ATTENTION_REFERENCE_KEYS, log-interpolated and clamped at the ends:
    the cluster's measured curve of its fused kernel (Calibration.attention_length_curve), or without
    one FLASH_CAUSAL_CURVE for both passes. ASSUMPTION (FLASH_CAUSAL_CURVE): every GPU and flash
    kernel follows FlashAttention-2's H100 shape, the backward at the forward's speed; a windowed
    layer behaves like a causal one of its window's keys."""
    x = math.log(max(keys, 1.0))
    if curve is None:
        xs = [math.log(n) for n, _ in FLASH_CAUSAL_CURVE]
        ref = dict(FLASH_CAUSAL_CURVE)[ATTENTION_REFERENCE_KEYS]
        f = interp(x, xs, [v for _, v in FLASH_CAUSAL_CURVE]) / ref
        return f, f
    return _interp_pair(x, [(math.log(n), f, b) for n, f, b in curve])


def _interp_pair(x: float, points) -> tuple[float, float]:
    """(forward, backward) read off (x, forward, backward) points at x, linear between them, clamped."""
    xs = [p[0] for p in points]
    return interp(x, xs, [p[1] for p in points]), interp(x, xs, [p[2] for p in points])


def flash_speed_factor(model: ModelSpec, s: int, cp: int, document_tokens: int | None = None,
                       curve: LengthCurve | None = None) -> tuple[float, float]:
    """flash_length_factor over the model's layers, weighted by the work each computes (a harmonic
    mean, as times add), forward and backward: full causal layers see s / cp queries' worth of keys
    per CP chunk (the kernel's length), or a document's d where that is shorter, windowed layers
    min(s, w + FLASH_KEY_TILE - 1, d) (computed_score_share)."""
    d = s if document_tokens is None else min(document_tokens, s)
    full_layers = model.num_layers - model.windowed_layers
    work = [(full_layers * d / (2 * s), flash_length_factor(min(d, s / cp), curve))]
    if model.windowed_layers:
        keys = min(_window_keys(model, s), d, s / cp)
        work.append((model.windowed_layers * _windowed_share(model, s, d), flash_length_factor(keys, curve)))
    total = sum(w for w, _ in work)
    return tuple(total / sum(w / f[i] for w, f in work) for i in (0, 1))


def attention_speed(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cp: int) -> tuple[float, float]:
    """(forward, backward) FLOP/s of a flash kernel on this model's attention at the training's length
    under CP, over the FLOPs it computes (_attention_flops; the backward's five matmuls are 2.5x the
    forward's): BF16 peak x the kernel family's efficiency (fused stacks: attention_efficiency on the
    cluster's measured length curve; eager ones: attention_efficiency_unfused on FlashAttention-2's)
    x the length factors (flash_speed_factor)."""
    cal = cluster.calibration
    fused = training.kernels == "fused"
    rate = cluster.gpu.peak_bf16_flops * (cal.attention_efficiency if fused else cal.attention_efficiency_unfused)
    f, b = flash_speed_factor(model, training.seq_length, cp, training.document_tokens,
                              cal.attention_length_curve if fused else None)
    return rate * f, rate * b


def _attention_flops(model: ModelSpec, b: int, s: int, cp: int, tp: int, causal: bool,
                     document_tokens: int | None = None) -> float:
    """Forward FLOPs of QK^T and PV on one GPU: 2 b s_q s_k a (d_qk + d_v) / tp (4 b s s a d when the
    widths are equal), times the share a masked flash kernel computes (computed_score_share: half
    for a causal mask, less with a sliding window).

    With CP each GPU holds s/cp queries against all s keys [MegatronCP].
    ASSUMPTION: flash kernels skip fully masked blocks, so causal attention costs half (timing only;
    MFU uses the unmasked count, as Megatron's formula does). Without flash (eager) the whole score
    matrix is computed, window or not.
    """
    dqk, dv = model.core_head_dims
    full = 2 * b * (s / cp) * s * model.num_attention_heads * (dqk + dv) / tp
    return full * computed_score_share(model, s, document_tokens) if causal else full


def model_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Model FLOPs per trained token (forward + backward = 3x forward), no recompute.

    Generalises Korthikanti22 Eq. 7 / [MegatronFLOPs]: per layer 2 x GEMM params + 4 s h
    (unmasked attention; 2 s a (d_qk + d_v) in general), plus the logits 2 h V; everything x 3. An MoE
    layer counts its active MLP: router (h E), top_k routed and the shared experts (3 h f each)
    [MegatronFLOPs: moe terms]; the dense layers (leading or interleaved) count a dense MLP. Each
    multi-token prediction depth counts a layer of the last one's kind, its three norms and 2h x h
    projection, and the logits again, as Megatron's count does [megatron-core 0.19.2 training/training.py:
    num_floating_point_operations, mtp_num_layers].
    """
    dqk, dv = model.core_head_dims
    h = model.hidden_size
    attention = sum(attention_gemm_flops(model, 1, 1)) + 2 * seq_length * model.num_attention_heads * (dqk + dv)
    dense = sum(mlp_gemm_flops(model, 1, 1))
    depth = 2 * (3 * h + 2 * h * h)  # an MTP depth's norms and projection
    moe = 0.0
    if model.moe is not None:  # the MLP is the router, the top-k routed experts and the shared ones
        e = model.moe
        width = model.fc1_width(e.expert_ffn_hidden_size) + e.expert_ffn_hidden_size  # 3 f_e gated, 2 f_e not
        shared = model.fc1_width(e.shared_expert_ffn_hidden_size) + e.shared_expert_ffn_hidden_size
        moe = 2 * (h * (e.num_experts + shared) + e.top_k * width * e.width(h) + e.latent_params(h))
    logits = 2 * h * model.vocab_size * (1 + model.mtp_layers)
    if model.hybrid:  # each layer is one block: a Mamba-2 mixer (its GEMMs and scan), attention, an MLP or MoE;
        # an MTP depth '*E' (or '*-') is one transformer layer of that kind
        mamba = (sum(mamba_gemm_flops(model, 1, 1)) + mamba_scan_flops(model, 1, 1)) if model.mamba else 0.0
        per = {"M": mamba, "*": attention, "-": dense, "E": moe}
        mtp = model.mtp_layers * (depth + sum(per[c] for c in model.mtp_pattern))
        return 3 * (sum(per[c] for c in model.layer_pattern) + mtp + logits)
    layers = (model.num_layers + model.mtp_layers) * attention + model.mtp_layers * depth
    if model.moe is not None:
        mtp = model.mtp_layers * (moe if model.mtp_layer_is_moe else dense)
        layers += model.moe_layers * moe + model.dense_layers * dense + mtp
    else:
        layers += (model.num_layers + model.mtp_layers) * dense
    return 3 * (layers + logits)


@memo()
def _eff_curve(cluster: ClusterSpec, fp8: bool) -> tuple[list[float], list[float]]:
    """The cluster's BF16 (or FP8) GEMM curve as (log GFLOP, efficiency)."""
    cal = cluster.calibration
    points = cal.gemm_efficiency_fp8 if fp8 else cal.gemm_efficiency
    return [math.log(p[0]) for p in points], [p[1] for p in points]


def gemm_efficiency(cluster: ClusterSpec, flops: float, fp8: bool | str | None = False,
                    kernels: Kernels = "fused") -> float:
    """Fraction of dense peak one GEMM of `flops` reaches: log-interpolated on the cluster's curve
    (cuBLASLt sweeps and MAMF, [HwRef §3.1-3.2]), clamped at its ends. With fp8 the FP8 curve times
    the share of the isolated sweep's speed an FP8 GEMM keeps inside a training step of the
    `kernels` family (calibration.fp8_gemm_in_training[_unfused], fitted per GPU generation on the
    published FP8 runs)."""
    cal = cluster.calibration
    eff = interp(math.log(max(flops / 1e9, 1e-6)), *_eff_curve(cluster, bool(fp8)))
    if not fp8:
        return eff
    if kernels != "fused":
        return eff * cal.fp8_gemm_in_training_unfused
    block_scaled = fp8 == "mxfp8" and cal.mxfp8_gemm_in_training is not None
    return eff * (cal.mxfp8_gemm_in_training if block_scaled else cal.fp8_gemm_in_training)


def gemm_format(training: TrainingSpec) -> str | None:
    """The format the recipe's linear GEMMs run in: None (BF16/FP16), 'fp8', 'mxfp8' (FP8 with MXFP8's
    block scales, at the FP8 peak) or 'fp4' (NVFP4)."""
    if training.fp8 is None:
        return None
    return {"nvfp4": "fp4", "mxfp8": "mxfp8", "torchao-mxfp8": "mxfp8"}.get(training.fp8, "fp8")


def _gemm_time(cluster: ClusterSpec, flops_list: list[float], fp8: bool | str | None = False,
               kernels: Kernels = "fused") -> float:
    """GEMM seconds at the peak of `fp8`'s format: BF16 when falsy, FP4 for 'fp4' (its efficiency
    read off the FP8 curve: ASSUMPTION, no NVFP4 size sweep was published), else FP8; in training
    with `kernels` (gemm_efficiency). planner.space.check_precision has made sure the peak and
    curve exist."""
    gpu = cluster.gpu
    peak = gpu.peak_fp4_flops if fp8 == "fp4" else gpu.peak_fp8_flops if fp8 else gpu.peak_bf16_flops
    return sum(f / (peak * gemm_efficiency(cluster, f, fp8, kernels)) for f in flops_list)


def cast_bytes(training: TrainingSpec) -> float:
    """HBM bytes per element to quantise one GEMM operand under the training's recipe: read it in
    BF16 (2) and write its row-wise and column-wise copies (memory.QUANTIZED_COPIES): 2 + 1 + 1 = 4
    under FP8, 2 + 2 x 0.5625 = 3.125 under NVFP4, whose random Hadamard transform and stochastic
    rounding run inside the cast kernel (NVFP4BlockScaling's QParams) [NVIDIA/TransformerEngine@d0067d0
    transformer_engine/common/recipe/__init__.py; shared/reference/framework-mechanisms.md §4]."""
    return PARAM_BYTES + QUANTIZED_COPIES * quantized_element_bytes(training)


TORCHAO_WEIGHT_CAST_BYTES = 3
"""torchao's Float8Linear keeps no FP8 weight cache (Transformer Engine's is_first_microbatch has
no counterpart): each forward casts the BF16 weight (read 2 B, write 1 B) and each backward casts it
again along the other axis for dgrad [torchao float8/float8_linear.py: matmul_with_hp_or_float8_args]."""


def fp8_cast_elements(model: ModelSpec, tp: int, etp: int | None = None, dense: bool = False,
                      symbol: str | None = None) -> tuple[float, float]:
    """Elements per token one GPU quantises for the FP8 linear layers of one layer: (forward, backward).

    Forward: the inputs of QKV (h), out-proj (a d / tp), FC1 (h) and FC2 (f / tp); backward: the
    output gradients of QKV ((a d + 2 h_kv) / tp), out-proj (h), FC1 (f or 2f gated, / tp) and FC2
    (h). QKV and FC1 inputs are the full hidden size on every TP rank (gathered under sequence
    parallelism; the all-gather is priced in BF16, see tp_fwd). Weights are quantised once per step
    and cached across micro-batches (TE's is_first_microbatch) -- not counted. An MoE layer's MLP:
    _moe_cast_elements; MLA's projections: _attention_cast_elements. A hybrid layer (symbol) casts its
    one block's: a Mamba-2 layer's in_proj input (h) and out_proj input (d_in / tp) forward, their output
    gradients ((2 d_in + 2 G N + H) / tp and h) backward.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    if symbol == "M":
        mb = model.mamba
        return h + mb.inner / tp, mb.in_proj_width / tp + h
    af, ab = _attention_cast_elements(model, tp) if symbol in (None, "*") else (0.0, 0.0)
    if symbol == "*":
        return af, ab
    if model.moe is not None and not dense and symbol != "-":
        mf, mb = _moe_cast_elements(model, tp, etp)
        return af + mf, ab + mb
    up = model.fc1_width(f) if model.family != Family.GPT else f
    return af + h + f / tp, ab + up / tp + h


def _attention_cast_elements(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(forward, backward) elements per token of the attention's FP8 GEMM operands. MLA: forward the
    down-projection input (h on the rank's own 1/tp of the tokens), the up-projection inputs (r_q,
    r_kv, gathered) and the out-proj input (a d_v / tp); backward the output gradients of the down-
    (r_q + r_kv + d_rope, own tokens) and up-projections (a (d_qk + d_rope) / tp, a (d_qk + d_v) / tp)
    and out-proj (h)."""
    h = model.hidden_size
    if model.mla is None:
        hkv, hq = model.kv_hidden, model.q_hidden
        return h + hq / tp, (hq + 2 * hkv) / tp + h
    m, a = model.mla, model.num_attention_heads
    rq, qk = m.q_lora_rank or 0, m.qk_head_dim + m.qk_rope_head_dim
    fwd = (h if rq else 0) / tp + h / tp + rq + m.kv_lora_rank + a * m.v_head_dim / tp
    if not rq:  # Q projected from the (gathered) hidden state
        fwd += h
    bwd = (rq + m.kv_lora_rank + m.qk_rope_head_dim) / tp + a * qk / tp + a * (m.qk_head_dim + m.v_head_dim) / tp + h
    return fwd, bwd


def _moe_cast_elements(model: ModelSpec, tp: int, etp: int | None) -> tuple[float, float]:
    """The MLP part of fp8_cast_elements for an MoE layer: shared experts as a dense MLP of f_s; the
    routed experts' grouped GEMMs (routed_cast_elements). LatentMoE: each rank's own tokens (1 / tp of
    them) pass the two latent projections: inputs h and L forward, output gradients L and h backward."""
    h, e = model.hidden_size, model.moe
    fs = e.shared_expert_ffn_hidden_size
    shared_f = (h + fs / tp) if fs else 0.0
    shared_b = (model.fc1_width(fs) / tp + h) if fs else 0.0
    latent = (h + e.latent_size) / tp if e.latent_size else 0.0
    routed_f, routed_b = routed_cast_elements(model, tp, etp)
    return shared_f + latent + routed_f, shared_b + latent + routed_b


def routed_cast_elements(model: ModelSpec, tp: int, etp: int | None) -> tuple[float, float]:
    """(forward, backward) elements per token of the layout the routed experts' grouped GEMMs quantise:
    they see top_k x etp / tp rows per token (FC1 input w and FC2 input f_e / etp forward, their output
    gradients fc1_width(f_e) / etp and w backward; w = h, or LatentMoE's latent width)."""
    h, e = model.hidden_size, model.moe
    fe, etp = e.expert_ffn_hidden_size, tp if etp is None else etp
    rows, w = e.top_k * etp / tp, e.width(h)
    return rows * (w + fe / etp), rows * (model.fc1_width(fe) / etp + w)


TORCHAO_KERNEL_CAST_BYTES = 3
"""HBM bytes per element of one of torchao's own cast kernels (read BF16, write one FP8 copy; the
per-row, per-group or per-32 scales are left out, as quantized_element_bytes leaves MXFP8's). Its
autograd functions quantise each operand once per GEMM that reads it, with no weight cache: forward the
input along its rows and the weight; backward the output gradient for dgrad, the weight again along the
other axis, and the output gradient and the input along the token axis for wgrad: per input element 3 B
forward and 3 backward, per output-gradient element 6 backward, per weight 3 each way (TORCHAO_WEIGHT_
CAST_BYTES). torchtitan's float8 routed experts [torchao 0.18 prototype/moe_training/fp8_grouped_mm.py:
_Float8GroupedMM (triton_fp8_rowwise_2d_scale_and_cast, triton_fp8_colwise_3d_scale_and_cast,
triton_fp8_rowwise_3d_transpose_rhs, triton_fp8_per_group_colwise_scales_dual)], and every MXFP8 linear
and grouped expert [mxfp8_linear.py: mx_mm (MXTensor.to_mx dim0 for the input, the weight and the
output gradient, _to_mxfp8_dim1_kernel_wrapper for the weight, the gradient and the input);
mxfp8_grouped_mm.py: the same four]. These are Triton, CuTe-DSL and CUDA kernels that torch.compile
cannot fuse into the operands' producers; torchao's float8 linears (Float8Linear), which Inductor
generates and fuses, keep cast_bytes' count (torchao_kernel_cast_elements)."""


def torchao_kernel_cast_elements(model: ModelSpec, training: TrainingSpec, tp: int, etp: int | None,
                                 moe_layer: bool, forward_backward: tuple[float, float]) -> tuple[float, float]:
    """Of a layer's FP8 cast elements a token (fp8_cast_elements' pair), those torchao's own kernels cast
    (TORCHAO_KERNEL_CAST_BYTES): all of them under torchao's MXFP8, an MoE layer's routed experts' under
    its float8 (rowwise: the linears' casts are Inductor's); none under Transformer Engine's recipes."""
    if training.fp8 == "torchao-mxfp8":
        return forward_backward
    if training.fp8 in TE_RECIPES or not moe_layer:
        return 0.0, 0.0
    return routed_cast_elements(model, tp, etp)


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer and one micro-batch on one GPU."""

    fwd: float
    bwd: float
    attn_fwd: float
    tp_fwd: float
    tp_bwd: float
    cp_fwd: float
    cp_bwd: float
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    mlp_fwd: float = 0.0
    """The MoE block's share of fwd: router and expert GEMMs, token permutations (0 for dense layers)."""
    mlp_bwd: float = 0.0
    """Its share of bwd."""
    op_recompute: float = 0.0
    """What torchtitan's per-op checkpointing re-runs in backward (op_recompute_gemm_flops' linears,
    every elementwise pass, the TP collectives it does not keep); 0 where Recompute.OP is not priced."""
    module_recompute: tuple[tuple[str, float], ...] = ()
    """What each of Megatron's --recompute-modules other than core_attn (attn_fwd) re-runs in
    backward, per layer and micro-batch (memory.recompute_module_freed_bytes says what each frees):
    layernorm a read and a write of each separate norm's input, mla_up_proj the up-projection GEMMs,
    moe_act a read of the routed FC1 output and a write of the activation, moe the MoE block's forward
    (router, permutations, expert and shared GEMMs, dispatch and combine), mlp the dense MLP's GEMMs
    and its SwiGLU pass. 0 where a module does not apply to the layer."""
    host_stall: float = 0.0
    """The GPU's idle time at the MoE forward's host sync (calibration.moe_host_stall), inside ep_fwd; unlike the
    all-to-alls there, no overlap hides it (ep_overlap_exposed)."""

    def recompute_of(self, modules: tuple[str, ...]) -> float:
        """Seconds selective recompute with these modules re-runs for this layer."""
        table = dict(self.module_recompute)
        return sum(self.attn_fwd if m == "core_attn" else table.get(m, 0.0) for m in modules)


def _layer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                dense: bool = False, symbol: str | None = None) -> LayerTime:
    """One layer's times; dense: one of an MoE model's leading dense layers; symbol: a hybrid model's
    layer of that kind (HYBRID_SYMBOLS)."""
    return _layer_time_of(model, cluster, training, layout.tp, layout.cp, layout.micro_batch_size,
                          layout.sequence_parallel, layout.tp_comm_overlap, layout.ep,
                          layout.expert_tp, dense, layout.moe_dispatcher, symbol)  # tp, cp, etp, ep: the innermost axes either way


MOE_PERMUTE_BYTES = 4
"""HBM bytes per routed element for one token permutation (read and write, BF16): the dispatcher
permutes the tokens before the EP all-to-all, sorts them by local expert after it (more than one
local expert), and undoes both in the combine [Megatron-LM@d98e8a6 megatron/core/transformer/moe/
token_dispatcher.py: MoEAlltoAllTokenDispatcher, steps (2), (4), (5), (7)]; backward the same."""


@dataclass(frozen=True)
class MoETime:
    """Forward seconds of an MoE layer's MLP side on one GPU (backward: 2x GEMMs, the same comm)."""

    gemm: float
    """Router, shared and routed expert GEMMs."""
    memory: float
    """Token permutations."""
    ep: float
    """Dispatch and combine: the EP all-to-alls, and the ETP all-gather / reduce-scatter."""


def expert_gemm_times(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, cp: int, b: int,
                      ep: int, etp: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((GPU seconds, host floor) of FC1, the same of FC2): the forward's routed-expert GEMMs of one MoE layer
    and micro-batch on the busiest rank, each local expert's GEMM at the efficiency of its own size, and
    the host's floor under each grouped GEMM: local experts x calibration.grouped_gemm_call, Transformer
    Engine issuing one cuBLASLt matmul per expert (0 under torchtitan, whose one torch._grouped_mm runs them
    all). A grouped GEMM takes the larger of the two (moe_time)."""
    e = model.moe
    n = b * training.seq_length / (cp * tp)
    local = e.num_experts // ep
    per_expert = routed_rows(model, n, etp, training.moe_routing) / local
    fe, w = e.expert_ffn_hidden_size / etp, e.width(model.hidden_size)
    call = 0.0 if uses_torchtitan(training) else cluster.calibration.grouped_gemm_call
    floor = local * call
    fp8, kernels = gemm_format(training), training.kernels
    fc1, fc2 = 2 * per_expert * w * model.fc1_width(fe), 2 * per_expert * fe * w
    return ((local * _gemm_time(cluster, [fc1], fp8, kernels), floor),
            (local * _gemm_time(cluster, [fc2], fp8, kernels), floor))


def moe_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, cp: int, b: int, ep: int,
             etp: int, dispatcher: str = "alltoall") -> MoETime:
    """The MLP side of one MoE layer and micro-batch (Megatron's all-to-all dispatcher, dropless,
    tokens balanced over the experts: NVIDIA's benchmarks force it).

    Each GPU holds N = b s / (cp tp) tokens (sequence parallel). The router is an h x E GEMM on them.
    Dispatch: an all-to-all over the EP group sends N top_k rows of h (BF16) and the probabilities,
    then an all-gather over ETP, so each GPU's grouped GEMMs see R = N top_k etp rows, R / (E / ep)
    per local expert, f_e / etp wide; combine: a reduce-scatter over ETP and the all-to-all back
    [Megatron-LM@d98e8a6 megatron/core/transformer/moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher
    (1)-(7)]. Each expert GEMM runs at the efficiency of its own size on the GEMM curve, and each grouped
    GEMM takes at least the host's time to issue its experts' calls (expert_gemm_times). Shared
    experts are a TP MLP of f_s on the gathered sequence [moe/shared_experts.py: SharedExpertMLP].
    LatentMoE (MoESpec.latent_size, L): the rows from dispatch to combine and the experts' GEMMs are L
    wide, and the two latent projections (h x L, whole on every TP rank) run on the rank's own N tokens
    in the linears' format [moe/moe_layer.py: MoELayer.preprocess, postprocess]. Without
    --overlap-moe-expert-parallel-comm (off by default) the EP collectives are exposed; a calibrated
    cluster's calibration.ep_comm_speed divides their time (1 in the catalog).
    TrainingSpec.moe_routing sets the busiest rank's rows and all-to-all volume (memory.routed_rows):
    the imbalance scales them (1: balanced), a capacity factor caps them and padding to capacity fixes
    them at E etp C, the padded rows sent, permuted and computed like real ones [megatron-core 0.19.2
    token_dispatcher.py: MoEAlltoAllTokenDispatcher.preprocess, drop_and_pad: num_out_tokens = capacity
    x num_experts]. ASSUMPTION: the drop itself (a top-k over each expert's column of the router's
    probabilities) and the host sync dropping adds before the permutation are not priced.
    dispatcher 'deepep' (Megatron's flex dispatcher, DeepEP backend; etp 1): permutation is fused into
    the dispatch, probabilities travel with the tokens, and a token crosses the network once per
    remote node (comm.node_dedup_alltoall_time). Dispatcher 'allgather' (Megatron's default): every
    rank's N tokens, their routing map (1 B per expert) and FP32 probabilities are all-gathered over the
    etp x ep group, each rank permutes out its experts' rows (the same R), and combine reduce-scatters
    the outputs back in the probabilities' FP32 (backward runs each collective's transpose, the same
    volumes, as it repeats the all-to-alls) [megatron-core 0.19.2 transformer/moe/token_dispatcher.py: MoEAllGatherTokenDispatcher.
    token_dispatch (gather_from_sequence_parallel_region over tp_ep_group), token_combine
    (reduce_scatter_to_sequence_parallel_region, hidden_states.to(local_probs.dtype))]; ASSUMPTION:
    the router's probabilities are FP32 (moe_router_dtype fp32, the perf recipes'); the gathered
    tokens sit in Megatron's global buffer, one layer at a time, and are not held for backward.
    torchtitan (0.3, its standard dispatcher, etp 1): the same dropless all-to-all of the routed BF16 rows,
    without the probabilities [torchtitan 0.3 models/common/token_dispatcher.py: AllToAllTokenDispatcher.
    dispatch, combine]; ASSUMPTION: its grouped GEMMs (torch._grouped_mm) at the same efficiency, its
    reorders at the same HBM traffic, and neither engine's count exchange (an all-to-all of E counts and
    the host sync on it before the data's all-to-all) priced.
    """
    e, h, s = model.moe, model.hidden_size, training.seq_length
    fp8 = gemm_format(training)
    tokens, n = b * s / cp, b * s / (cp * tp)
    local = e.num_experts // ep
    routing = training.moe_routing
    rows = routed_rows(model, n, etp, routing)  # the busiest rank's
    fs = e.shared_expert_ffn_hidden_size
    w = e.width(h)  # the routed rows' width: h, or LatentMoE's latent from dispatch to combine
    gemm = _gemm_time(cluster, [2 * n * h * e.num_experts])  # router, BF16
    gemm += sum(max(pair) for pair in expert_gemm_times(model, cluster, training, tp, cp, b, ep, etp))
    if e.latent_size:  # fc1_latent_proj before dispatch, fc2_latent_proj after combine, on the rank's own tokens
        gemm += _gemm_time(cluster, [2 * n * h * e.latent_size, 2 * n * e.latent_size * h], fp8, training.kernels)
    if fs:  # their sequence-parallel gather / scatter is the dense MLP's pair (_layer_time_of)
        gemm += _gemm_time(cluster, [2 * tokens * h * model.fc1_width(fs) / tp, 2 * tokens * fs * h / tp], fp8, training.kernels)
    gpu, cal = cluster.gpu, cluster.calibration
    deep = dispatcher == "deepep"
    if dispatcher == "allgather":  # the gathered tokens permuted once into the local experts' rows, undone in combine
        moved = 2 * rows * w
        memory = MOE_PERMUTE_BYTES * moved / (gpu.hbm_bandwidth * cal.hbm_efficiency)
        group = placement(cluster, (ep * etp, 1))
        gathered = n * ep * etp  # tokens on the group's ranks together
        ag = collective_time(cluster, group, "allgather", gathered * (2 * w + 4 * e.num_experts + e.num_experts))
        rs = collective_time(cluster, group, "reducescatter", gathered * 4 * w)
        return MoETime(gemm, memory, (ag + rs) / cal.ep_comm_speed)
    # elements: permute (fused into DeepEP's dispatch) and the sort by local expert, each undone in combine
    sent = routed_rows(model, n, 1, routing) if routing.pad else n * e.top_k  # rows this rank permutes out
    moved = 2 * ((0.0 if deep else sent * w) + (rows * w if local > 1 else 0.0))
    memory = MOE_PERMUTE_BYTES * moved / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    ep_t = 0.0
    if ep > 1:
        group = placement(cluster, (ep, etp))
        routed = routed_rows(model, n, 1, routing)  # the busiest rank receives this many rows
        if deep:
            ep_t = 2 * node_dedup_alltoall_time(cluster, group, n * routing.share, 2 * w, e.top_k,
                                                e.num_experts, e.router_groups, e.router_group_topk)
        else:
            # Megatron sends the FP32 probabilities beside the tokens; torchtitan keeps them on the source
            # rank and weighs the outputs there after combine (AllToAllTokenDispatcher.combine)
            probs = 0.0 if uses_torchtitan(training) else alltoall_time(cluster, group, 4 * routed)
            ep_t = 2 * (alltoall_time(cluster, group, 2 * routed * w) + probs)
    if etp > 1:
        group = placement(cluster, (etp, 1))
        ep_t += (collective_time(cluster, group, "allgather", 2 * rows * w)
                 + collective_time(cluster, group, "reducescatter", 2 * rows * w))
    return MoETime(gemm, memory, ep_t / cal.ep_comm_speed)


def fp8_attention_speed(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) speed of the attention core under TrainingSpec.fp8_attention over its BF16
    kernel: Calibration.fp8_attention_speed at the model's query-key head dim, for the recipe's scaling
    (delayed and tensorwise: per-tensor FP8; mxfp8: MXFP8); (1, 1) without FP8 attention.

    Transformer Engine quantises Q, K and V before cuDNN's FP8 kernel and the output gradient before its
    backward [TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    backends.py: FusedAttnFunc.forward (combine_and_quantize), backward] (priced as casts by the caller).
    What it saves for the backward is memory.fp8_attention_relief's.

    Raises:
        PlannerError: the cluster has no measured speed for that scaling, or the model has learnable
            softmax sinks on a GPU before Blackwell, where Transformer Engine has no FP8 kernel for them
            (utils.py: get_attention_backend disables FusedAttention for them in FP8 below sm100 or cuDNN
            9.21, and every other backend)."""
    if not training.fp8_attention or training.fp8 not in FP8_ATTENTION_RECIPES:
        return 1.0, 1.0
    if model.attention_sinks and cluster.gpu.arch < 10:
        raise PlannerError(f"training.fp8_attention: Transformer Engine runs FP8 attention with learnable softmax sinks "
                           f"on Blackwell only (compute capability 10.x, cuDNN 9.21); {cluster.gpu.name} is "
                           f"{cluster.gpu.arch}.x")
    kind = "mxfp8" if training.fp8 == "mxfp8" else "per_tensor"
    points = (cluster.calibration.fp8_attention_speed or {}).get(kind)
    if not points:
        raise PlannerError(f"training.fp8_attention: cluster '{cluster.name}' has no measured {kind} FP8 attention "
                           "speed (calibration.fp8_attention_speed); add it to price FP8 attention")
    return _interp_pair(float(model.core_head_dims[0]), [(float(d), f, b) for d, f, b in points])


def fp8_attention_cast_elements(model: ModelSpec, tp: int) -> tuple[float, float]:
    """Elements per token one GPU quantises for FP8 attention (cost.fp8_attention_speed), at the recipe's
    cast bytes (cost.cast_bytes): (forward: Q, K and V, the rank's heads, K/V heads replicated where tp
    exceeds them; MLA's K and V per query head; backward: the output gradient)."""
    dqk, dv = model.core_head_dims
    a = model.num_attention_heads
    if model.mla is not None:
        kv = a * (dqk + dv) / tp
    else:
        kv = model.kv_heads * (dqk + dv) / min(tp, model.kv_heads)
    return a * dqk / tp + kv, a * dv / tp


@memo()
def _layer_time_of(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, cp: int, b: int,
                   sequence_parallel: bool, tp_comm_overlap: bool = False, ep: int = 1, etp: int = 1,
                   dense: bool = False, dispatcher: str = "alltoall", symbol: str | None = None) -> LayerTime:
    """One layer and micro-batch on one GPU. A hybrid model's layer (symbol) is one block: 'M' a Mamba-2
    mixer (mamba_gemm_flops, mamba_scan_time), '*' attention, '-' a dense MLP, 'E' an MoE block, each
    with its one norm and residual add: ASSUMPTION, half a transformer layer's elementwise passes."""
    s = training.seq_length
    cal, gpu = cluster.calibration, cluster.gpu
    tokens = b * s / cp
    fp8 = gemm_format(training)
    has_attn, has_mlp = symbol in (None, "*"), symbol in (None, "-", "E")
    speed_f = speed_b = bwd_slowdown = 1.0
    attn_cast_f = attn_cast_b = 0.0  # FP8 attention's quantisation of Q, K, V (forward) and dO (backward)
    moe = (moe_time(model, cluster, training, tp, cp, b, ep, etp, dispatcher)
           if model.moe is not None and not dense and symbol in (None, "E") else None)
    flops = attention_gemm_flops(model, tokens, tp, sequence_parallel) if has_attn else []
    if moe is None and has_mlp:  # else the MLP is the MoE block
        flops += mlp_gemm_flops(model, tokens, tp)
    if symbol == "M":
        flops += mamba_gemm_flops(model, tokens, tp)
    gemm_each = [_gemm_time(cluster, [f], fp8, training.kernels) for f in flops]  # dense GQA: QKV, proj, FC1, FC2
    gemm = sum(gemm_each)
    flash = training.attention == "flash"
    attn = 0.0
    if has_attn:
        attn_flops = _attention_flops(model, b, s, cp, tp, causal=flash, document_tokens=training.document_tokens)
        if flash:  # the backward's five matmuls at their own measured speed (flash_length_factor)
            rate_f, rate_b = attention_speed(model, cluster, training, cp)
            bwd_slowdown = rate_f / rate_b
        attn = attn_flops / (rate_f if flash else gpu.peak_bf16_flops * gemm_efficiency(cluster, attn_flops))
        if fp8 and training.fp8_attention:  # TE's FP8 fused attention (not in the BF16 end layers, fp8 None there)
            speed_f, speed_b = fp8_attention_speed(model, cluster, training)
            attn_cast_f, attn_cast_b = (cast_bytes(training) * tokens * n / (gpu.hbm_bandwidth * cal.hbm_efficiency)
                                        for n in fp8_attention_cast_elements(model, tp))
        if not flash:  # eager: the s^2 softmax/dropout passes are memory-bound (read + write, bf16)
            attn += 3 * 2 * 2 * b * model.num_attention_heads / tp * (s / cp) * s / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    # Norms, residual adds, activation functions, dropout: memory-bound passes over s*b*h elements;
    # replicated across TP ranks unless sequence parallel shards them. (ASSUMPTION: calibrated count.)
    passes = cal.elementwise_passes if training.kernels == "fused" else cal.elementwise_passes_unfused
    elem = passes * (0.5 if symbol else 1.0) * 2 * tokens * model.hidden_size / (tp if sequence_parallel else 1)
    elem_t = elem / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    scan = mamba_scan_time(model, cluster, tokens, tp) if symbol == "M" else 0.0  # convolution, SSD scan, norm
    cast_fwd = cast_bwd = 0.0
    if fp8:  # quantising the FP8 GEMM operands: memory-bound passes
        hbm = gpu.hbm_bandwidth * cal.hbm_efficiency
        cf, cb = fp8_cast_elements(model, tp, etp, dense, symbol)
        kf, kb = torchao_kernel_cast_elements(model, training, tp, etp, moe is not None, (cf, cb))
        per, own = cast_bytes(training), TORCHAO_KERNEL_CAST_BYTES  # Inductor's or TE's casts; torchao's kernels
        cast_fwd = (per * (cf - kf) + own * kf) * tokens / hbm
        cast_bwd = (per * (cb - kb) + own * (kf + 2 * kb)) * tokens / hbm
        if training.fp8 not in TE_RECIPES:  # torchao: the weights (local experts too) are cast in every forward and backward
            linears = linear_params_per_gpu(model, Layout(tp=tp, ep=ep, etp=etp), moe_layer=moe is not None, symbol=symbol)
            w = TORCHAO_WEIGHT_CAST_BYTES * linears / hbm
            cast_fwd, cast_bwd = cast_fwd + w, cast_bwd + w
    if moe is not None:
        gemm += moe.gemm
        elem_t += moe.memory
    attn_bwd = (FLASH_BWD_FACTOR * bwd_slowdown if flash else 2.0) * attn / speed_b
    attn /= speed_f
    cast_fwd += attn_cast_f  # Q, K, V
    cast_bwd += attn_cast_b  # the output gradient
    fwd = gemm + attn + elem_t + cast_fwd + scan
    bwd = 2 * gemm + attn_bwd + 2 * elem_t + cast_bwd + MAMBA_SCAN_BWD_FACTOR * scan
    # TP: 2 all-reduces forward and 2 backward of b*s*h activations; with SP each becomes an
    # all-gather + reduce-scatter pair of the same volume [Korthikanti22 §4.2.2]. MLA (SP) gathers
    # its up-projections' inputs instead (r_q or h, r_kv) and the RoPE key (d_rope) [MLASelfAttention.
    # get_query_key_value_tensors]; an MoE layer's MLP pair is its shared experts' (MoE requires SP).
    tp_fwd = tp_bwd = 0.0
    if tp > 1:
        group = placement(cluster, (tp, 1))
        nbytes = 2 * tokens * model.hidden_size
        if sequence_parallel:  # the gathers in the recipe's format (memory.tp_gather_element_bytes), the scatters BF16
            ag, ag_b = (collective_time(cluster, group, "allgather", tokens * model.hidden_size
                                        * tp_gather_element_bytes(training, backward, tp_comm_overlap))
                        for backward in (False, True))
            rs = collective_time(cluster, group, "reducescatter", nbytes)
            attn_pairs = pairs = [ag + rs, ag_b + rs]  # forward, backward
            if model.mla is not None:  # Megatron's own BF16 gathers, both ways
                m = model.mla
                attn_pairs = 2 * [rs + sum(collective_time(cluster, group, "allgather", 2 * tokens * w)
                                           for w in (m.q_lora_rank or model.hidden_size, m.kv_lora_rank, m.qk_rope_head_dim))]
        else:
            attn_pairs = pairs = 2 * [collective_time(cluster, group, "allreduce", nbytes)]
        mlp_pairs = pairs
        if moe is not None and not model.moe.shared_expert_ffn_hidden_size:
            mlp_pairs = [0.0, 0.0]  # an MoE layer's MLP pair is its shared experts'
        if symbol is not None:  # one block: attention's pair, a Mamba-2 mixer's (in_proj gathers, out_proj
            # reduce-scatters, as a non-MLA attention block's do), or the MLP's
            attn_pairs = attn_pairs if symbol in ("*", "M") else [0.0, 0.0]
            mlp_pairs = mlp_pairs if has_mlp else [0.0, 0.0]
        tp_fwd, tp_bwd = ((a + p) * cal.tp_comm_exposed for a, p in zip(attn_pairs, mlp_pairs))
        ag_fwd = tp_fwd * (ag / (ag + rs) if sequence_parallel else 1.0)  # the forward's gathers (per-op recompute)
        if tp_comm_overlap and uses_torchtitan(training):  # torchao's gathers: one format both ways
            tp_fwd, tp_bwd, ag_fwd = _async_tp_exposed(gemm_each, ag, rs, tp)
        elif tp_comm_overlap:  # Userbuffers gathers one copy each way (ag_b == ag)
            tp_fwd, tp_bwd = _tp_overlap_exposed(gpu, gemm_each, ag, rs)
    # CP ring: cp-1 steps each sending this rank's K and V block, overlapped with the attention of
    # the resident block; backward moves K/V and dK/dV [MegatronCP], [HwRef §4.7].
    cp_fwd = cp_bwd = 0.0
    if cp > 1 and has_attn:  # hybrid models: cp 1 (planner.space)
        group = placement(cluster, (cp, tp))
        if model.mla is None:  # K and V of the rank's KV heads (replicated when tp exceeds them)
            kv_bytes = 2 * 2 * b * (s / cp) * model.kv_hidden / min(tp, model.kv_heads)
        else:  # MLA's up-projected K (d_qk + d_rope) and V (d_v) of the rank's heads
            kv_bytes = 2 * b * (s / cp) * model.num_attention_heads * sum(model.core_head_dims) / tp
        step = p2p_time(cluster, group.tier, kv_bytes)
        attn_step = attn / cp
        cp_fwd = (cp - 1) * max(0.0, step - attn_step)
        cp_bwd = (cp - 1) * max(0.0, 2 * step - attn_bwd / cp)
    ep_t = moe.ep if moe is not None else 0.0
    # the dispatcher's host sync in every MoE forward: the GPU idles (calibration.moe_host_stall, fitted on the
    # published MoE runs), counted with the dispatch it precedes, so a recomputed forward stalls again
    stall = cal.moe_host_stall if moe is not None else 0.0
    mlp_f, mlp_b = (moe.gemm + moe.memory, 2 * (moe.gemm + moe.memory)) if moe is not None else (0.0, 0.0)
    op_rc = 0.0
    if model.op_recompute_priced and (not tp_comm_overlap or uses_torchtitan(training)) and symbol is None:
        # per-op checkpointing re-runs the linears it did not keep, every elementwise op (and the FP8
        # casts of those linears), and the collectives it does not keep: the sequence-parallel
        # all-gathers (its reduce-scatters are kept), or the all-reduces without SP
        op_gemm = _gemm_time(cluster, op_recompute_gemm_flops(model, tokens, tp, torchtitan_engine.fuses_qkv(training)),
                             fp8, training.kernels)
        op_tp = ag_fwd if tp > 1 else 0.0
        op_rc = op_gemm + elem_t + cast_fwd * op_gemm / gemm + op_tp
    # Megatron's --recompute-modules beyond the attention core (LayerTime.module_recompute)
    hbm = gpu.hbm_bandwidth * cal.hbm_efficiency
    sp_div = tp if sequence_parallel else 1
    norms = sum(own_norms(model, moe_layer=not dense, symbol=symbol))
    modules = [("layernorm", norms * 2 * 2 * tokens * model.hidden_size / sp_div / hbm)]
    if model.mla is not None:
        modules.append(("mla_up_proj", _gemm_time(cluster, mla_up_proj_flops(model, tokens, tp), fp8, training.kernels)))
    if moe is not None:
        rows = routed_rows(model, tokens / tp, etp, training.moe_routing)
        fe = model.moe.expert_ffn_hidden_size
        modules.append(("moe_act", 2 * rows * (model.fc1_width(fe) + fe) / etp / hbm))
        # the whole block re-run: router, permutations, expert and shared GEMMs, and its dispatch and combine
        modules.append(("moe", moe.gemm + moe.memory + moe.ep + stall))
    elif model.family != Family.GPT and has_mlp:
        f = model.ffn_hidden_size
        modules.append(("mlp", _gemm_time(cluster, mlp_gemm_flops(model, tokens, tp), fp8, training.kernels)
                        + 2 * (model.fc1_width(f) + f) * tokens / tp / hbm))
    return LayerTime(fwd, bwd, attn, tp_fwd, tp_bwd, cp_fwd, cp_bwd, ep_t + stall, ep_t, mlp_f, mlp_b, op_rc, tuple(modules),
                     host_stall=stall)


def ep_overlap_exposed(lt: LayerTime) -> float:
    """Exposed EP seconds of one layer when Megatron's combined 1F1B runs micro-batch i+1's forward
    beside micro-batch i's backward (--overlap-moe-expert-parallel-comm). Its per-layer order
    [megatron-core 0.19.2 models/common/model_chunk_schedule_plan.py: TransformerLayerSchedulePlan.run]:

        comm stream: combine_bwd      | dispatch_fwd, dispatch_bwd | combine_fwd
        comp stream: pre_dispatch_fwd | mlp_bwd, mlp_fwd           | pre_dispatch_bwd

    with each stream in order and each kernel waiting for its input, takes
    max(a_b, P_f) + max(a_f, M_b) + max(a_b, M_f) + max(a_f, P_b), where a is one all-to-all
    (half of the direction's dispatch + combine), M the MoE block's compute and P the rest of the
    layer (attention, norms, its TP / CP collectives). What exceeds the compute alone is exposed, and the host's
    stall at the forward's sync (calibration.moe_host_stall, LayerTime.host_stall) whole: the host waits there for
    every queued kernel, both micro-batches', before it issues the next, so nothing runs beside it. The published
    GPT-OSS-120B runs on 64 GB200 (BF16, EP 64) with the overlap (Megatron-Bridge 26.04, 15,938 tokens/s/GPU) and
    without it (26.02, 15,784) differ by 1 %; hidden, the stall let the search claim 28 % over NVIDIA's recipe there
    by turning the overlap on (benchmarks/recipes.py --moe)."""
    a_f, a_b = (lt.ep_fwd - lt.host_stall) / 2, lt.ep_bwd / 2
    pre_f = lt.fwd - lt.mlp_fwd + lt.tp_fwd + lt.cp_fwd
    pre_b = lt.bwd - lt.mlp_bwd + lt.tp_bwd + lt.cp_bwd
    return (lt.host_stall + max(0.0, a_b - pre_f) + max(0.0, a_f - lt.mlp_bwd) + max(0.0, a_b - lt.mlp_fwd)
            + max(0.0, a_f - pre_b))


def ep_unpaired_share(layout: Layout, num_micro: int) -> float:
    """Share of micro-batches whose forward or backward runs alone under the combined 1F1B: the
    first forward and the last backward (pp = 1), or the interleaved warm-up forwards and cool-down
    backwards, 2(p - 1) + (v - 1) p + 1 model chunks on the first rank (Megatron schedules one more
    with the overlap) [megatron-core 0.19.2 pipeline_parallel/schedules.py: get_pp_rank_microbatches;
    combined_1f1b.py: combined_1f1b_schedule_for_no_pipelining]. ASSUMPTION: the first rank's count
    for every rank."""
    p, v = layout.pp, layout.vpp
    chunks = 2 * (p - 1) + (v - 1) * p + 1
    return min(1.0, chunks / v / num_micro)


UB_SMS = 16
"""SMs a Transformer Engine userbuffers kernel reserves for pipelined and bulk overlaps (add_ub's
num_sm default; ring exchange uses 1) [TransformerEngine pytorch/module/base.py: initialize_ub]."""
UB_PIPELINE_SPLITS = 4
"""Chunks a pipelined reduce-scatter overlap splits its GEMM into (the last chunk's RS is exposed)."""


def _tp_overlap_exposed(gpu, gemms: list[float], ag: float, rs: float) -> tuple[float, float]:
    """Forward and backward TP seconds per layer under --tp-comm-overlap (Transformer Engine).

    TE pairs each sequence-parallel collective with a GEMM [initialize_ub's method map]: forward,
    the all-gathers run beside the QKV and FC1 GEMMs (ring exchange: max(0, AG - GEMM)) and the
    reduce-scatters beside proj and FC2 (pipelined in 4 chunks: at least RS/4 shows); backward,
    the all-gathers beside the proj and FC2 dgrad GEMMs (ring exchange) and the QKV / FC1 dgrad
    reduce-scatters beside their wgrad GEMMs (bulk). dgrad and wgrad GEMMs have the forward
    GEMM's FLOPs. Pipelined and bulk overlaps take UB_SMS of the GPU's SMs from the GEMM they run
    beside (the QKV / FC1 dgrad GEMMs too, which the bulk all-gather of their input shares).
    """
    qkv, proj, fc1, fc2 = gemms
    share = UB_SMS / gpu.sm_count if gpu.sm_count else 0.0  # GEMM slowdown while 16 SMs communicate
    fwd = (max(0.0, ag - qkv) + max(0.0, ag - fc1)
           + max(rs / UB_PIPELINE_SPLITS, rs - proj) + max(rs / UB_PIPELINE_SPLITS, rs - fc2)
           + share * (proj + fc2))
    bwd = (max(0.0, ag - proj) + max(0.0, ag - fc2) + max(0.0, rs - qkv) + max(0.0, rs - fc1)
           + share * 2 * (qkv + fc1))  # wgrad GEMMs beside the RS, dgrad GEMMs beside the input AG
    return fwd, bwd


ASYNC_TP_HIDDEN = 0.45
"""Share of the pipelined time async TP hides (_async_tp_exposed), fitted on the two torchtitan pairs
published with and without it (H100, float8): Llama-3-70B on 256 GPUs, TP 8, measured +5.7 %
(829 -> 876 tokens/s/GPU, torchtitan benchmarks/llama3_h100_202412_torchtitan.md) fits 0.41;
Llama-3.1-405B on 128 GPUs, TP 8, measured +4.5 % (177 -> 185, torchtitan docs/performance.md of
January 2025) fits 0.50. Each pair's fit predicts the other's gain within 1.3 points (+7.0 % for
70B, +3.7 % for 405B); fully hidden (1.0) the model claims +15.1 % and +9.5 %. What the rest is
(chunked GEMMs, barriers, copies sharing HBM with the GEMMs) is not itemised."""


def _async_tp_exposed(gemms: list[float], ag: float, rs: float, tp: int) -> tuple[float, float, float]:
    """Forward and backward TP seconds per layer under torchtitan's async TP, and the forward
    all-gathers' part of the forward (Inductor's micro-pipelined TP, torch._inductor.config.
    _micro_pipeline_tp, running torch.distributed._symmetric_memory's fused ops; torch 2.13).

    An all-gather feeds its GEMM shard by shard (_fused_all_gather_matmul_impl through
    _pipelined_multi_all_gather_and_consume): the local shard's GEMM runs first, then each remote
    shard is copied (copy engines, one copy at a time) and consumed while the next is copied. A
    reduce-scatter's GEMM is produced chunk by chunk, one per destination, each pulled by its
    owner while the next is computed (_fused_matmul_reduce_scatter_impl through
    _pipelined_produce_and_all2all), the local chunk last. Either way tp - 1 transfers of C / (tp - 1)
    run beside tp GEMM chunks of G / tp, one chunk with nothing beside it: at least
    max(0, C - G (tp - 1) / tp) shows. The pattern pass matches the forward's pairs (gather beside
    QKV and FC1, scatter beside proj and FC2) and the backward's (the output gradient gathered
    beside the proj and FC2 dgrad GEMMs, the input gradient scattered beside the QKV and FC1 dgrad
    GEMMs, each with its forward GEMM's FLOPs). Of the time the transfers could hide under their
    GEMM chunks, ASYNC_TP_HIDDEN is hidden; never more than the collectives unpaired."""
    qkv, proj, fc1, fc2 = gemms
    share = (tp - 1) / tp

    def shows(comm: float, gemm: float) -> float:
        return comm - ASYNC_TP_HIDDEN * min(comm, gemm * share)

    ag_fwd = shows(ag, qkv) + shows(ag, fc1)
    fwd = ag_fwd + shows(rs, proj) + shows(rs, fc2)
    bwd = shows(ag, proj) + shows(ag, fc2) + shows(rs, qkv) + shows(rs, fc1)
    return fwd, bwd, ag_fwd


TIME_UNIT_S = 1e-6
"""The search's integer time unit (microseconds): stage coefficients are rounded up to it once, here,
and both the CP-SAT model and evaluate() build the objective from the rounded numbers."""


def us_units(seconds: float) -> int:
    """Seconds as whole microseconds, rounded up (the one rounding of every time coefficient)."""
    return math.ceil(seconds / TIME_UNIT_S - 1e-9)


@dataclass(frozen=True)
class StageTime:
    """Seconds per micro-batch (forward + backward) on one pipeline stage."""

    stage: int
    layers: int
    compute: float
    recompute: float
    tp_comm: float
    cp_comm: float
    p2p: float
    ep_comm: float = 0.0
    """MoE dispatch and combine (EP all-to-all, ETP gather / reduce-scatter)."""
    grad_accum: float = 0.0
    """Gradient accumulation outside the backward kernels (accumulation_bytes x the rank's parameters)."""

    @property
    def total(self) -> float:
        """All terms of the stage."""
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.p2p + self.ep_comm + self.grad_accum


@dataclass(frozen=True)
class StageCoefficients:
    """One pipeline rank's time per micro-batch as a function of its layer count n, in integer microseconds:

        units(n) = per_layer * n + per_recomputed * recomputed(n) + fixed + max(0, p2p - p2p_hidden * n)

    (fixed: the logits GEMM on the last rank and the leading dense layers on the first; p2p: its
    sends; p2p_hidden: the send time one layer's forward hides when interleaved p2p overlaps). The CP-SAT model reads these integers with n as a
    variable; evaluate() reads the same ones with n fixed."""

    per_layer: int
    per_recomputed: int
    fixed: int
    p2p: int
    p2p_hidden: int

    def units(self, layers: int, recomputed: int) -> int:
        """Integer microseconds of one micro-batch with `layers` layers, `recomputed` of them recomputed."""
        return (self.per_layer * layers + self.per_recomputed * recomputed + self.fixed
                + max(0, self.p2p - self.p2p_hidden * layers))


def recomputed_layers(layout: Layout, layers: int) -> int:
    """Layers of a rank that pay the recompute term: all with selective (the attention core), per-op
    or full recompute, min(recompute_num_layers, layers) with a partial full recompute."""
    if layout.recompute == Recompute.NONE:
        return 0
    if layout.recompute == Recompute.FULL and layout.recompute_num_layers is not None:
        return min(layout.recompute_num_layers, layers)
    return layers


@dataclass(frozen=True)
class PipelineTime:
    """The pipeline part of a step, from the per-rank micro-batch times T_i.

    1F1B: m micro-batches through the slowest rank plus the fill and drain through the others,
    (m - 1) T_max + sum T_i; interleaved with v chunks the fill and drain shrink v-fold:
    m T_max + (sum T_i - T_max) / v. Even stages give Narayanan21's (m + (p - 1)/v) T [§2.2.2]."""

    stages: tuple[StageTime, ...]
    num_microbatches: int
    vpp: int
    stage_units: tuple[int, ...] = ()
    """Each rank's micro-batch time in integer microseconds (StageCoefficients.units)."""

    @property
    def slowest(self) -> StageTime:
        """The stage that sets the pace."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def bubble(self) -> float:
        """Fill and drain: (sum T_i - T_max) / v."""
        return (sum(s.total for s in self.stages) - self.slowest.total) / self.vpp

    @property
    def total(self) -> float:
        """m * T_max + bubble."""
        return self.num_microbatches * self.slowest.total + self.bubble

    @property
    def units(self) -> int:
        """The total in integer microseconds from the rounded stage times: ceil(((v m - 1) T_max + sum T_i) / v)."""
        v, top = self.vpp, max(self.stage_units)
        return -((-(v * self.num_microbatches - 1) * top - sum(self.stage_units)) // v)


@dataclass(frozen=True)
class _Pieces:
    per_layer: float
    per_recomputed: float
    fixed: float
    p2p: float
    p2p_hidden: float
    compute_per_layer: float
    tp_per_layer: float
    cp_per_layer: float
    ep_per_layer: float
    acc_per_layer: float
    offsets: tuple[float, float, float, float, float, float]
    """The fixed part by term (compute, recompute, TP, CP, EP, gradient accumulation): the logits, the
    leading dense layers' difference from MoE layers on the first rank, the embedding's and output
    layer's gradients."""


def _pieces(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int) -> _Pieces:
    """The float terms of one rank's micro-batch time (StageCoefficients before rounding)."""
    return _pieces_of(model, cluster, training, layout, (stage,))[0]


def _kind_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, kind: str) -> LayerTime:
    """One layer of memory.layer_kind `kind`: a hybrid model's symbol, an MoE model's 'E' or '-' layer, a dense
    model's layer."""
    if model.hybrid:
        return _layer_time(model, cluster, training, layout, symbol=kind)
    return _layer_time(model, cluster, training, layout, dense=model.moe is not None and kind == "-")


def _pieces_of(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
               stages: tuple[int, ...]) -> list[_Pieces]:
    """_pieces of each of `stages`, the terms every rank shares computed once. A hybrid model's ranks are
    priced from their layers by kind (symbols_on): its MoE layer (else its first kind) is the per-layer
    term, the others' differences from it are offsets."""
    base_symbol = ("E" if "E" in model.layer_pattern else model.layer_pattern[0]) if model.hybrid else None
    lt = _layer_time(model, cluster, training, layout, symbol=base_symbol)
    b, s, tp, cp, p, v = layout.micro_batch_size, training.seq_length, layout.tp, layout.cp, layout.pp, layout.vpp
    tokens = b * s / cp
    send = 0.0
    if p > 1:  # one activation send forward and one gradient send backward per chunk [Narayanan21 §4.1]
        act = 2 * tokens * model.hidden_size / (tp if layout.sequence_parallel else 1)
        send = p2p_time(cluster, group_placement(cluster, layout, "pp").tier, act)
    # 1F1B: every send is exposed (Megatron cannot overlap p2p without interleaving). Interleaved
    # with overlap_p2p (Megatron's default): each send runs beside the next chunk's forward
    # [megatron-core 0.19.2 pipeline_parallel/schedules.py, overlap_p2p_comm], exposing the excess:
    # 2v max(0, send - (n/v) fwd) = max(0, 2v send - 2 n fwd).
    hidden = 2 * lt.fwd if layout.p2p_overlapped else 0.0
    unpaired = ep_unpaired_share(layout, num_microbatches(training, layout)) if layout.ep_overlap else 1.0
    base = _layer_terms(lt, layout, unpaired)
    compute, rc, tpc, cpc, epc = base
    out = []
    for stage in stages:
        logits = output_time(model, cluster, training, layout).total if stage == p - 1 else 0.0
        offsets = [logits, 0.0, 0.0, 0.0, 0.0]  # compute, recompute, TP, CP, EP not proportional to the layers
        if stage == p - 1 and model.mtp_layers:
            offsets = [a + b for a, b in zip(offsets, _mtp_terms(model, cluster, training, layout, lt, unpaired))]

        def instead(n: int, lt_other: LayerTime, lt_from: LayerTime | None = None) -> None:
            """n of the rank's layers run as lt_other instead of the base layer (or lt_from), recomputed first:
            their difference goes to the offsets."""
            was = base if lt_from is None else _layer_terms(lt_from, layout, unpaired)
            extra = [a - b for a, b in zip(_layer_terms(lt_other, layout, unpaired), was)]
            for j, w in enumerate((n, recomputed_layers(layout, n), n, n, n)):
                offsets[j] += w * extra[j]
        d = dense_layers_on(model, layout, stage)
        if d:  # the leading dense layers replace as many MoE layers
            instead(d, _kind_time(model, cluster, training, layout, "-"))
        for c, n in symbols_on(model, layout, stage).items():  # a hybrid model's other kinds of layer
            if c != base_symbol:
                instead(n, _kind_time(model, cluster, training, layout, c))
        for c, k in bf16_kinds_on(model, training, layout, stage).items():  # BF16 first/last layers, by kind
            bf16 = training.model_copy(update={"fp8": None, "fp8_param_gather": False, "fp8_attention": False})
            instead(k, _kind_time(model, cluster, bf16, layout, c), _kind_time(model, cluster, training, layout, c))
        acc, acc_fixed = _accumulation_terms(model, cluster, training, layout, stage, d)
        offsets.append(acc_fixed)
        out.append(_Pieces(compute + tpc + cpc + epc + acc, rc, sum(offsets), 2 * v * send, hidden, compute, tpc, cpc,
                           epc, acc, tuple(offsets)))
    return out


MEGATRON_LOSS_TRAFFIC_BYTES = (2 + 4) + 8 + 8 + (4 + 4 + 2)
"""HBM bytes per local logit (s b V / tp) Megatron's loss reads and writes in one micro-batch, as the
emitted --cross-entropy-loss-fusion runs it (NVIDIA's own Llama-3 FP8 example turns it on):
fused_vocab_parallel_cross_entropy, the unfused function's steps in four torch.compile'd pieces
[megatron-core 0.19.2 fusions/fused_cross_entropy.py: calculate_logits_max, calculate_predicted_logits,
calculate_cross_entropy_loss, calculate_gradients; jit.py: jit_fuser = torch.compile]. Forward: the FP32
copy of the BF16 logits with its row maximum (read 2, write 4), the subtraction, exp and row sum (read
and write 4), the division into the softmax (read and write 4); backward: the gradient from the saved
softmax, written back into it and cast to BF16 (read 4, write 4 and 2). ASSUMPTION: one kernel a piece
(Inductor fuses each piece's pointwise ops with its row reduction); unfused, the same steps move 52
(MEGATRON_UNFUSED_LOSS_TRAFFIC_BYTES)."""
MEGATRON_UNFUSED_LOSS_TRAFFIC_BYTES = (2 + 4) + 4 + 8 + 8 + 4 + 8 + 8 + (4 + 2)
"""The same steps without --cross-entropy-loss-fusion (TrainingSpec.cross_entropy 'unfused', Megatron-LM's
default), each a pass of its own [megatron-core 0.19.2 tensor_parallel/cross_entropy.py:
VocabParallelCrossEntropy]: the FP32 cast (read 2, write 4), the maximum (4), its in-place subtraction
(8), exp in place (8), the sum (4), the division (8); backward the product with the output gradient (8)
and autograd's cast to BF16 (read 4, write 2). 52."""
FUSED_LOSS_TRAFFIC_BYTES = 2 + 2 + 2
"""The same for flash-attn's fused cross-entropy (TrainingSpec.cross_entropy 'fused', llm-foundry's):
its forward kernel reads the BF16 logits once (the log-sum-exp kept per row), its backward reads them
again and writes the BF16 gradient [flash-attn flash_attn/ops/triton/cross_entropy.py:
cross_entropy_fwd_kernel, cross_entropy_bwd_kernel]."""
TE_LOSS_TRAFFIC_BYTES = 2 + 2 + 2
"""The same for Transformer Engine's parallel cross-entropy (TrainingSpec.cross_entropy 'te'): its forward
kernel reads the BF16 logits once for the row's maximum and sum (online softmax), the loss kernel
touches one logit a row, and the backward kernel reads them again and writes the gradient over them
[NVIDIA/TransformerEngine@02965d2 transformer_engine/pytorch/triton/cross_entropy.py:
online_softmax_kernel, cross_entropy_forward_kernel, cross_entropy_backward_kernel]."""


def loss_traffic_bytes(training: TrainingSpec, tp: int) -> float:
    """HBM bytes per local logit the loss moves in one micro-batch's forward and backward, for the loss the
    last rank runs (memory.loss_kind, which the ledger's logits item reads too)."""
    kind = loss_kind(training)
    if kind == "torchtitan-chunks":
        return torchtitan_engine.chunk_loss_traffic_bytes(tp)
    if kind == "torchtitan-whole":
        return torchtitan_engine.whole_loss_traffic_bytes(tp)
    return {"te": TE_LOSS_TRAFFIC_BYTES, "flash-attn": FUSED_LOSS_TRAFFIC_BYTES,
            "megatron-deepspeed": deepspeed_engine.LOSS_TRAFFIC_BYTES,
            "megatron-unfused": MEGATRON_UNFUSED_LOSS_TRAFFIC_BYTES, "megatron-fused": MEGATRON_LOSS_TRAFFIC_BYTES}[kind]


def loss_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> float:
    """Seconds of the loss's memory-bound passes over one micro-batch's logits on the last pipeline rank:
    loss_traffic_bytes over its b s / cp tokens and V / tp vocabulary columns, at the HBM bandwidth the
    elementwise passes get. Full recomputation does not re-run it (the loss is outside the layers)."""
    return _loss_seconds(model, cluster, training, layout.micro_batch_size, layout.cp, layout.tp)


def _loss_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b: int, cp: int, tp: int) -> float:
    logits = b * training.seq_length / cp * model.vocab_size / tp
    return loss_traffic_bytes(training, tp) * logits / (cluster.gpu.hbm_bandwidth * cluster.calibration.hbm_efficiency)


@dataclass(frozen=True)
class OutputTime:
    """Seconds per micro-batch the last pipeline rank spends on the output layer and the loss, beside its layers."""

    gemm: float
    """The logits GEMM forward and twice backward (in loss_chunks GEMMs of a chunk's tokens), and each
    later chunk's add of its output-layer gradient into the FP32 one (torchtitan_engine [Loss], [NoSync])."""
    loss: float
    """The loss's memory-bound passes over the logits (loss_seconds)."""

    @property
    def total(self) -> float:
        """Both."""
        return self.gemm + self.loss


def output_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> OutputTime:
    """The last rank's output layer and loss for one micro-batch."""
    return _output_time(model, cluster, training, layout.micro_batch_size, layout.cp, layout.tp)


@memo()
def _output_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b: int, cp: int, tp: int) -> OutputTime:
    """output_time of a micro-batch of b sequences under cp and tp (what it reads of the layout)."""
    n = training.loss_chunks
    tokens = b * training.seq_length / cp
    gemm = 3 * n * _gemm_time(cluster, [2 * tokens / n * model.hidden_size * model.vocab_size / tp])
    if n > 1:
        out_params = model.vocab_size * model.hidden_size / tp
        gemm += ((n - 1) * torchtitan_engine.ACCUMULATE_BYTES * out_params
                 / (cluster.gpu.hbm_bandwidth * cluster.calibration.hbm_efficiency))
    return OutputTime(gemm, _loss_seconds(model, cluster, training, b, cp, tp))


def _mtp_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, lt: LayerTime,
               unpaired: float) -> tuple[float, ...]:
    """The last rank's multi-token prediction depths per micro-batch as (compute, recompute, TP, CP, EP)
    seconds: each a layer of the last decoder layer's kind (lt, or a dense layer's for an MoE model
    ending dense), recomputed whenever full recompute is on (MultiTokenPredictionLayer.forward
    checkpoints it whole, whatever recompute_num_layers says), and mtp_head_time beside it. A hybrid
    model's depth ('*E' or '*-', ModelSpec.mtp_pattern) is one transformer layer of that kind (lt is its
    rank's E layer there)."""
    if model.hybrid:
        kind = _layer_time(model, cluster, training, layout, dense=not model.mtp_layer_is_moe)
    else:
        kind = lt if model.mtp_layer_is_moe or model.moe is None else _layer_time(model, cluster, training, layout, dense=True)
    terms = [model.mtp_layers * x for x in _layer_terms(kind, layout, unpaired)]
    terms[0] += mtp_head_time(model, cluster, training, layout)
    return tuple(terms)


def mtp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> float:
    """Seconds per micro-batch the last rank spends on its multi-token prediction depths, all terms
    (what stage_coefficients adds to its fixed part); 0 without MTP."""
    if not model.mtp_layers:
        return 0.0
    unpaired = ep_unpaired_share(layout, num_microbatches(training, layout)) if layout.ep_overlap else 1.0
    return sum(_mtp_terms(model, cluster, training, layout, _layer_time(model, cluster, training, layout), unpaired))


def mtp_head_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> float:
    """Seconds per micro-batch the last rank's multi-token prediction depths spend beside their
    transformer layers: per depth the 2h -> h projection (eh_proj, forward and twice backward over the
    b s / cp tokens, split by tp) and the output layer and loss again (output_time)
    [megatron-core 0.19.2 transformer/multi_token_prediction.py: MultiTokenPredictionLayer._concat_embeddings,
    process_mtp_loss]; its norms and the next tokens' embedding lookup are left out (memory-bound, < 1 %
    of the layer). 0 without MTP."""
    if not model.mtp_layers:
        return 0.0
    return _mtp_head_time(model, cluster, training, layout.micro_batch_size, layout.cp, layout.tp)


@memo()
def _mtp_head_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b: int, cp: int, tp: int) -> float:
    tokens, h = b * training.seq_length / cp, model.hidden_size
    proj = 3 * _gemm_time(cluster, [2 * tokens * 2 * h * h / tp])
    return model.mtp_layers * (proj + _output_time(model, cluster, training, b, cp, tp).total)


def accumulates_apart(training: TrainingSpec) -> bool:
    """Whether accumulation_bytes can be non-zero for any layout of this training: on DeepSpeed's
    and torchtitan's engines; Megatron's accumulation is in its weight-gradient GEMMs."""
    return uses_deepspeed(training) or uses_torchtitan(training)


def accumulation_bytes(training: TrainingSpec, layout: Layout) -> float:
    """HBM bytes per local parameter and micro-batch that the plan's engine spends accumulating
    gradients outside the backward kernels: DeepSpeed's wrappers (deepspeed_engine.accumulation_bytes),
    FSDP2 under torchtitan's pipeline (torchtitan_engine.accumulation_bytes); Megatron fuses the
    accumulation into the weight-gradient GEMM, which adds into the FP32 main_grad in its epilogue
    (gradient_accumulation_fusion, on unless --no-gradient-accumulation-fusion: Megatron-LM
    megatron/training/arguments.py; TE's fuse_wgrad_accumulation), 0."""
    if not accumulates_apart(training):
        return 0.0
    return deepspeed_engine.accumulation_bytes(training, layout) + torchtitan_engine.accumulation_bytes(training, layout)


def _accumulation_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                        dense: int) -> tuple[float, float]:
    """Gradient accumulation of one micro-batch on rank `stage` as (seconds per layer, fixed seconds):
    accumulation_bytes per local parameter, memory-bound; the rank's parameters are affine in its
    layer count (param_shards at dense and dense + 1 layers give the slope and the embedding's or
    output layer's part)."""
    per_param = accumulation_bytes(training, layout)
    if not per_param:
        return 0.0, 0.0
    held = [sum(sh.params for sh in param_shards(model, layout, stage, n)) for n in (dense, dense + 1)]
    hbm = cluster.gpu.hbm_bandwidth * cluster.calibration.hbm_efficiency
    slope = (held[1] - held[0]) * per_param / hbm
    return slope, held[0] * per_param / hbm - dense * slope


def _layer_terms(lt: LayerTime, layout: Layout, unpaired: float = 1.0) -> tuple[float, float, float, float, float]:
    """One layer's (compute, recompute, TP, CP, EP) seconds per micro-batch; with ep_overlap the EP
    term is ep_overlap_exposed on paired micro-batches and whole on the `unpaired` share."""
    if layout.recompute == Recompute.SELECTIVE:  # the attention core forward again [Korthikanti22 §5],
        rc = lt.recompute_of(layout.recomputed_modules)  # or the modules Megatron is told to re-run
    elif layout.recompute == Recompute.FULL:
        rc = lt.fwd + lt.tp_fwd + lt.ep_fwd  # a whole extra forward, TP and MoE dispatch included
    elif layout.recompute == Recompute.OP:
        rc = lt.op_recompute
    else:
        rc = 0.0
    ep = lt.ep_fwd + lt.ep_bwd
    if layout.ep_overlap:
        paired = ep_overlap_exposed(lt)
        ep = paired + (ep - paired) * unpaired
    return lt.fwd + lt.bwd, rc, lt.tp_fwd + lt.tp_bwd, lt.cp_fwd + lt.cp_bwd, ep


def _coefficients(q: _Pieces) -> StageCoefficients:
    return StageCoefficients(us_units(q.per_layer), us_units(q.per_recomputed), us_units(q.fixed), us_units(q.p2p),
                             us_units(q.p2p_hidden))


def _time(layout: Layout, q: _Pieces, stage: int, layers: int) -> StageTime:
    o = q.offsets
    return StageTime(stage, layers, layers * q.compute_per_layer + o[0],
                     recomputed_layers(layout, layers) * q.per_recomputed + o[1], layers * q.tp_per_layer + o[2],
                     layers * q.cp_per_layer + o[3], max(0.0, q.p2p - q.p2p_hidden * layers), layers * q.ep_per_layer + o[4],
                     layers * q.acc_per_layer + o[5])


def stage_coefficients(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                       stage: int) -> StageCoefficients:
    """Integer-microsecond coefficients of pipeline rank `stage` (reads no layer split: n is the variable)."""
    return _coefficients(_pieces(model, cluster, training, layout, stage))


def ranks_coefficients(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                       stages: tuple[int, ...]) -> dict[int, StageCoefficients]:
    """stage_coefficients of each of `stages`, the terms the ranks share computed once."""
    return {r: _coefficients(q) for r, q in zip(stages, _pieces_of(model, cluster, training, layout, stages))}


def stage_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
               layers: int) -> StageTime:
    """Seconds per micro-batch of pipeline rank `stage` holding `layers` layers, term by term."""
    return _time(layout, _pieces(model, cluster, training, layout, stage), stage, layers)


def pipeline_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> PipelineTime:
    """Compute, recompute, TP, CP and p2p time per stage, and the pipeline built from them.

    Reads zero_stage only through the gradient accumulation (accumulation_bytes);
    its other costs are in dp_time and optimizer_time.
    """
    layers = stage_layers(model, layout)
    p = layout.pp
    # a rank's pieces depend on whether it is the first (the embedding's gradients) or the last (the
    # logits, the output layer's gradients) and on its dense layers (a hybrid model's layer kinds) only
    kinds = [(i == 0, i == p - 1, dense_layers_on(model, layout, i),
              tuple(sorted(bf16_kinds_on(model, training, layout, i).items())),
              tuple(sorted(symbols_on(model, layout, i).items()))) for i in range(p)]
    first = {k: i for i, k in reversed(list(enumerate(kinds)))}
    by_kind = dict(zip(first, _pieces_of(model, cluster, training, layout, tuple(first.values()))))
    pieces = [by_kind[k] for k in kinds]
    stages = tuple(_time(layout, q, i, n) for i, (q, n) in enumerate(zip(pieces, layers)))
    units = tuple(_coefficients(q).units(n, recomputed_layers(layout, n)) for q, n in zip(pieces, layers))
    return PipelineTime(stages, num_microbatches(training, layout), layout.vpp, units)


DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_RANK = 1_000_000
# Megatron's default gradient bucket: max(40M, 1M x dp_cp) parameters; one bucket (the whole
# buffer) when --overlap-grad-reduce is off [Megatron-LM megatron/core/distributed/
# distributed_data_parallel.py: DistributedDataParallel.__init__ (bucket_size); training.py].


def ddp_bucket_params(dp_cp: int) -> int:
    """Parameters per gradient bucket Megatron uses for a data-parallel (x CP) group of dp_cp ranks."""
    return max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_RANK * dp_cp)


def _bucket_params(training: TrainingSpec, dp_cp: int) -> int:
    """Parameters per gradient (and parameter) bucket: DeepSpeed's reduce_bucket_size as emitted
    (deepspeed_engine.REDUCE_BUCKET_ELEMENTS), NeMo's bucket_cap_mb for DistributedFusedAdam
    (apex_engine.bucket_params), else Megatron's ddp_bucket_params."""
    if apex_engine.uses_apex(training):
        return apex_engine.bucket_params(training)
    return REDUCE_BUCKET_ELEMENTS if uses_deepspeed(training) else ddp_bucket_params(dp_cp)


def _bucket_times(cluster: ClusterSpec, group, op: str, params: float, bytes_per: float, bucket: float,
                  window: float | None) -> tuple[float, float]:
    """(last bucket, all buckets) seconds of the collectives over `params` parameters: one collective
    on the whole buffer without an overlap window, else n = ceil(params / bucket) of them, each with
    its own latency."""
    if window is None:
        t = collective_time(cluster, group, op, params * bytes_per)
        return t, t
    n = max(1, math.ceil(params / bucket))
    t_last = collective_time(cluster, group, op, (params - (n - 1) * bucket) * bytes_per)
    return t_last, (n - 1) * collective_time(cluster, group, op, bucket * bytes_per) + t_last


def _exposed(parts: list[tuple[float, float]], window: float | None) -> float:
    """Exposed seconds of bucketed collectives (one (last, all) pair per gradient buffer) launched as
    compute frees them while `window` seconds of compute run beside them. Buckets fill from the last
    layers, so the remainder buckets (the first layers) are ready last and always exposed:
    max(t(remainders), t(all buckets) - window); without a window everything is exposed."""
    total = sum(t for _, t in parts)
    if window is None:
        return total
    return max(sum(t for t, _ in parts), total - window)


def _shard_group(cluster: ClusterSpec, layout: Layout, shard: ParamShard):
    """Placement of a parameter shard's data-parallel group: dp x cp, or the expert-data-parallel
    group (stride ep x etp in Megatron's expert order etp-ep-edp-pp)."""
    if shard.axis == "dpcp":
        return group_placement(cluster, layout, "dpcp")
    return placement(cluster, (shard.dp, layout.ep * layout.expert_tp))


@dataclass(frozen=True)
class ShardUnits:
    """The units in which FSDP-style sharding (ZeRO-2/3 outside DeepSpeed) gathers and reduces one
    GPU's non-expert parameters (TP slices), one collective per unit and pass, in forward order:
    the embedding (first rank), one per transformer layer, the output layer with the final norm
    (last rank). PyTorch FSDP and FSDP2 make one collective per wrapped module and torchtitan wraps
    the embedding, every block and [norm, output] [torchtitan 0.3.0 distributed/fsdp.py:
    apply_fsdp_to_decoder; torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py:
    FSDPParamGroup.unshard, post_backward]; Megatron-FSDP buckets each TransformerLayer and groups
    the other parameters apart [Megatron-LM@d98e8a6 megatron/core/distributed/fsdp/
    mcore_fsdp_adapter.py: fsdp_unit_modules; megatron_fsdp/param_and_grad_buffer.py:
    _get_parameter_groups]. DeepSpeed's ZeRO-3 fetches each submodule's parameters (its trace,
    coalesced per step) [DeepSpeed runtime/zero/partitioned_param_coordinator.py: fetch_sub_module]:
    ASSUMPTION, priced per layer too (a lower bound on its collectives)."""

    embedding: float
    layer: float
    layers: int
    output: float
    tied: bool = False
    """The embedding and the output layer are one weight on this rank (tied, no pipeline): torchtitan
    wraps [tok_embeddings, norm, output] as one unit, kept gathered with the output layer's."""

    @property
    def output_unit(self) -> float:
        """Parameters of the unit the output layer is in (the embedding too where tied)."""
        return self.output + (self.embedding if self.tied else 0.0)

    def times(self, cluster: ClusterSpec, group, op: str, bytes_per: float) -> tuple[float, float, float]:
        """(the unit ready last in backward, all units, the output layer's unit) seconds of one pass of
        `op` over the units at `bytes_per` bytes a parameter. Where tied, the embedding, the norm and
        the output are one unit and one collective: the first gathered and the last reduced."""
        def one(p: float) -> float:
            return collective_time(cluster, group, op, p * bytes_per) if p > 0 else 0.0
        layer = one(self.layer)
        if self.tied:
            unit = one(self.output_unit)
            return unit, unit + self.layers * layer, unit
        emb, out = one(self.embedding), one(self.output)
        return (emb if self.embedding > 0 else layer), emb + self.layers * layer + out, out


def shard_units(model: ModelSpec, layout: Layout, stage: int, layers: int) -> ShardUnits:
    """ShardUnits of pipeline rank `stage` holding `layers` layers; they add up to stage_params."""
    p, tp = layout.pp, layout.tp
    emb = model.embedding_params / tp if stage == 0 else 0.0
    out = 0.0
    if stage == p - 1:  # the output layer's unit holds the MTP depths and their embedding copy too
        copy = model.vocab_size * model.hidden_size if ends_share_embedding(model, p) else 0
        dup = mtp_whole_params(model)
        out = (model.output_params + copy + mtp_stage_params(model, layout) - dup) / tp + dup
    rest = stage_params(model, layout, stage, layers) - emb - out
    return ShardUnits(emb, rest / max(1, layers), layers, out, model.tied_embeddings and p == 1)


def expert_shard_units(model: ModelSpec, layout: Layout, stage: int, layers: int) -> ShardUnits:
    """ShardUnits of the routed experts on pipeline rank `stage`: one collective per MoE layer and
    pass over that layer's local experts (E / ep of them, 1 / etp of each), Megatron-FSDP's expert
    group of the layer's unit [megatron-core 0.19.2 distributed/fsdp/src/megatron_fsdp/
    param_and_grad_buffer.py: _get_parameter_groups]; they add up to param_shards' expert shard."""
    return ShardUnits(0.0, routed_params_per_layer(model) / (layout.ep * layout.expert_tp),
                      moe_layers_on(model, layout, stage, layers), 0.0)


def fsdp_prefetch_priced(training: TrainingSpec, layout: Layout) -> bool:
    """Whether the layout's data-parallel collectives are FSDP's, hidden by its prefetch share
    (calibration.dp_overlap) rather than by a whole backward: ZeRO-3, and ZeRO-2 outside DeepSpeed
    (Megatron-FSDP's optim_grads); _stage_dp_time prices them so."""
    return layout.zero_stage == 3 or (layout.zero_stage == 2 and not uses_deepspeed(training))


def stage_dp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                  layers: int) -> float:
    """Exposed gradient and weight communication of one step on pipeline rank `stage` holding `layers`
    layers (seconds): its data-parallel collectives (_stage_dp_time) and, on the first and last rank,
    the embedding's gradient sync between them (embedding_sync_time)."""
    return (_stage_dp_time(model, cluster, training, layout, stage, layers)
            + embedding_sync_time(model, cluster, training, layout, stage))


def embedding_sync_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                        stage: int) -> float:
    """Megatron's all-reduce of the word embedding's gradient between the first and last pipeline rank,
    where both hold a copy (tied embeddings, or MTP depths embedding the next tokens) and pp > 1: after
    the data-parallel gradient sync, blocking, V h / tp gradient elements in the grad buffer's dtype over
    the two-rank embedding group [megatron-core 0.19.2 distributed/finalize_model_grads.py:
    _allreduce_word_embedding_grads, _get_shared_word_embedding_weight (share_embeddings_and_output_weights
    or mtp_num_layers), called by finalize_model_grads after finish_grad_sync]. 0 elsewhere, and on the
    engines that are not Megatron's."""
    p = layout.pp
    if stage not in (0, p - 1) or not ends_share_embedding(model, p):
        return 0.0
    if uses_deepspeed(training) or uses_torchtitan(training):
        return 0.0
    group = placement(cluster, (2, axis_stride(layout, "pp") * (p - 1)))
    grad_b = 2 if training.grad_dtype == "bf16" else 4
    return collective_time(cluster, group, "allreduce", model.vocab_size * model.hidden_size / layout.tp * grad_b)


def _stage_dp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                   layers: int) -> float:
    """Exposed data-parallel communication of one step on pipeline rank `stage` holding `layers`
    layers (seconds); reads no recompute field. Every rank reduces its own gradients over its dp x cp
    group at the same time, so the step waits for the slowest (see update_time).

    ZeRO 0: all-reduce; ZeRO 1: reduce-scatter on the last micro-batch, then an all-gather of the
    bf16 weights after the step [Megatron-LM param_and_grad_buffer.py: start_grad_sync on
    is_last_microbatch]; ZeRO 2 (gradients sharded, so no full-size accumulation buffer):
    a reduce-scatter in every micro-batch's backward [DeepSpeed stage_1_and_2.py: gradients are
    reduced into their partitions in each backward; Megatron-FSDP optim_grads likewise], then the
    all-gather; ZeRO 3: per micro-batch two weight all-gathers (forward, backward) and a gradient
    reduce-scatter, 3 Psi [Rajbhandari20 §7]; FSDP2 under torchtitan's pipeline, one of each per step
    (the units stay gathered and the gradients unsharded until the last backward: memory's
    fsdp2_pipeline_grads).
    Overlap (ZeRO 0-2), from the layout's flags: overlap_grad_reduce sends gradient buckets
    (ddp_bucket_params) while the same micro-batch's backward runs on the stage; overlap_param_gather
    gathers the weights bucket by bucket during the next step's first forward [Megatron-LM
    distributed_data_parallel.py, param_and_grad_buffer.py: register_grad_ready, forward pre-hooks].
    Without a flag the collective runs whole and exposed. FSDP's (ZeRO 3, and ZeRO 2 outside DeepSpeed:
    Megatron-FSDP's optim_grads) prefetch: a fraction calibration.dp_overlap of each micro-batch's compute
    hides its collectives (ZeRO 2 where its flags are on).
    """
    shards = param_shards(model, layout, stage, layers)
    pairs = [(sh, g) for sh, g in zip(shards, param_gather_bytes(model, training, layout, stage, layers))  # 2 B/param, FP8 at 1
             if sh.dp > 1 and sh.params > 0]
    fsdp2_offload = uses_torchtitan(training) and bool(training.optimizer_offload)  # ZeRO-3, pp 1 (planner.space)
    if not pairs and not fsdp2_offload:
        return 0.0
    deepspeed = uses_deepspeed(training)
    # DeepSpeed reduces in the model dtype whatever it accumulates in (deepspeed_engine.GRAD_WIRE_BYTES)
    grad_b = GRAD_WIRE_BYTES if deepspeed or training.grad_dtype == "bf16" else 4
    groups = [_shard_group(cluster, layout, sh) for sh, _ in pairs]
    lt = _layer_time(model, cluster, training, layout)  # compute of one micro-batch on that stage, no recompute
    m = num_microbatches(training, layout)
    units = shard_units(model, layout, stage, layers)
    experts = expert_shard_units(model, layout, stage, layers)

    def units_of(sh: ParamShard) -> ShardUnits:
        return units if sh.axis == "dpcp" else experts
    if layout.zero_stage == 3:
        window = cluster.calibration.dp_overlap * layers * (lt.fwd + lt.bwd)
        if not pairs:  # FSDP2's CPU offload over one shard: no collective, but the copies (FSDP2 still wraps it)
            return _fsdp2_offload_dp_time(cluster, shards[0], units, m, 0.0, window)
        if not deepspeed and not uses_torchtitan(training):  # Megatron-FSDP: each shard's units over its own
            # group (the routed experts' over the expert-data-parallel one), gathered in forward and again
            # in backward, reduce-scattered in backward, per micro-batch
            t = 0.0
            for (sh, gather), group in zip(pairs, groups):
                u = units_of(sh)
                t += 2 * u.times(cluster, group, "allgather", gather / sh.params)[1]
                t += u.times(cluster, group, "reducescatter", grad_b)[1]
            return m * max(0.0, t - window)
        (sh, gather), group = pairs[0], groups[0]
        if deepspeed:  # stage 3 reduces in reduce_bucket_size buckets [stage3.py: __reduce_and_partition_ipg_grads]
            rs, rs_out = _bucket_times(cluster, group, "reducescatter", sh.params, grad_b, REDUCE_BUCKET_ELEMENTS,
                                       window)[1], 0.0
            _, ag, out = units.times(cluster, group, "allgather", gather / sh.params)
        else:  # torchtitan's FSDP2: a block's routed experts are gathered and reduced over efsdp, apart from
            # its other parameters (apply_fsdp_to_decoder's shard_placement_fn: a mesh per parameter)
            ag = rs = out = rs_out = 0.0
            for (shard, g), grp in zip(pairs, groups):
                _, r, r_out = units_of(shard).times(cluster, grp, "reducescatter", grad_b)
                _, a, o = units_of(shard).times(cluster, grp, "allgather", g / shard.params)
                ag, rs, out, rs_out = ag + a, rs + r, out + o, rs_out + r_out
        chunked = uses_torchtitan(training) and training.loss_chunks > 1
        if uses_torchtitan(training) and layout.pp > 1:
            # FSDP2 under torchtitan's pipeline gathers once, prefetched beside the first forward, and
            # reduce-scatters once, after the last backward, exposed [torch distributed/pipelining/
            # stage.py: perform_reduce_grad, the schedule's REDUCE_GRAD after every micro-batch]
            t = max(0.0, ag - cluster.calibration.dp_overlap * layers * lt.fwd) + rs
            if chunked and out:  # torchtitan_engine [Loss]: the loss reshards [norm, output] and syncs its
                # gradient at every micro-batch's last chunk; each backward regathers it first (exposed),
                # the reduce-scatters run beside that backward
                t += m * out + (m - 1) * max(0.0, rs_out - cluster.calibration.dp_overlap * layers * lt.bwd)
            return t
        # the backward gathers again, but torchtitan does not reshard [norm, output] after the forward
        # (reshard_after_forward=False for that unit: apply_fsdp_to_decoder), nor, with tied embeddings,
        # the one unit [tok_embeddings, norm, output] that replaces both -- unless the chunked loss
        # resharded it (torchtitan_engine [Loss])
        again = ag - out if uses_torchtitan(training) and not chunked else ag
        if fsdp2_offload:
            return _fsdp2_offload_dp_time(cluster, sh, units, m, ag + again + rs, window)
        copies = 0.0
        if deepspeed and training.optimizer_offload:  # its gradient partition to the host and back, on the
            # reduce stream after each bucket (deepspeed_engine [Offload3]: partition_grads)
            copies = offload_micro_batch_link_bytes(training) * sh.params / sh.dp / cluster.host.link_bandwidth
        return m * max(0.0, ag + again + rs + copies - window)
    fsdp = fsdp_prefetch_priced(training, layout)  # ZeRO-2 here: Megatron-FSDP's optim_grads, per-unit buckets
    # what hides them: the whole backward / forward beside Megatron's DDP buckets; FSDP's prefetch, as for
    # ZeRO-3, hides calibration.dp_overlap of it (the published FSDP runs fit none: llm-foundry's SHARD_GRAD_OP
    # steps grow with the GPU count by what their collectives take, README)
    share = cluster.calibration.dp_overlap if fsdp else 1.0
    bwd = share * layers * lt.bwd if layout.overlap_grad_reduce else None
    fwd = share * layers * lt.fwd if layout.overlap_param_gather else None

    def buckets(op: str, sh, grp, bytes_per: float, window: float | None) -> tuple[float, float]:
        if fsdp:  # Megatron-FSDP's per-unit groups, the experts' apart
            return units_of(sh).times(cluster, grp, op, bytes_per)[:2]
        return _bucket_times(cluster, grp, op, sh.params, bytes_per, _bucket_params(training, sh.dp), window)
    # DeepSpeed's BF16_Optimizer (and FP16_Optimizer) all-reduce the whole gradient after the last
    # backward; its ZeRO optimizer reduces bucket by bucket, reduce_bucket_size elements each
    allreduce = layout.zero_stage == 0 or (deepspeed and wrapper(training, layout) == Wrapper.BF16)
    op = "allreduce" if allreduce else "reducescatter"
    grads = _exposed([buckets(op, sh, grp, grad_b, bwd) for (sh, _), grp in zip(pairs, groups)], bwd)
    if layout.zero_stage == 0:
        return grads
    if layout.zero_stage == 2:
        grads *= m
    return grads + _exposed([buckets("allgather", sh, grp, g / sh.params, fwd)
                             for (sh, g), grp in zip(pairs, groups)], fwd)


def _fsdp2_offload_dp_time(cluster: ClusterSpec, sh, units: ShardUnits, m: int, collectives: float,
                           window: float) -> float:
    """stage_dp_time of FSDP2 under CPU offload (torchtitan_engine [Offload]), pp = 1: every unshard
    first copies its FP32 shards to the GPU (forward, and backward but for the output layer's unit), every
    micro-batch copies its reduced FP32 shard to the host, all on the streams of the collectives they
    feed, hidden with them by calibration.dp_overlap of the compute (window). The micro-batches after
    the first copy theirs blocking and add them on the CPU into the host gradient: ASSUMPTION, both
    exposed (the host thread waits, then runs the add, before it launches more backward)."""
    link, share = cluster.host.link_bandwidth, host_stream_share(cluster)
    shard = sh.params / sh.dp
    h2d = OFFLOAD_H2D_BYTES_FSDP2 * (2 * shard - units.output_unit / sh.dp) / link
    d2h = OFFLOAD_D2H_BYTES_FSDP2 * shard / link
    first = max(0.0, collectives + h2d + d2h - window)
    later = max(0.0, collectives + h2d - window) + d2h + CPU_ACCUMULATE_BYTES * shard / share
    return first + (m - 1) * later


OFFLOAD_LINK_BYTES = 4
"""Host-link bytes per offloaded element, each way: the FP32 main gradient into its pinned FP32 copy
(device to host), and the updated FP32 copy back into the BF16 parameter, which a non-blocking copy_
moves as FP32 and converts on the GPU (host to device) [Megatron-LM@d98e8a6 megatron/core/optimizer/
cpu_offloading/hybrid_optimizer.py: _set_sub_optimizer_grads, param_copy_back_gpu_hook; torch
aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda, "If non_blocking is true - type conversions are
performed on the GPU"]."""
CPU_ADAM_BYTES = 28
"""Host-memory bytes torch's fused CPU AdamW (Megatron's CPUAdam, fused=True) moves per FP32
element: it reads the parameter, the gradient, exp_avg and exp_avg_sq and writes the parameter,
exp_avg and exp_avg_sq (4 B each)."""
HOST_STREAM_EFFICIENCY = 0.6
"""Share of the host's peak memory bandwidth the CPU Adam steps of a node's ranks sustain together.
ASSUMPTION: no published measurement of torch's CPU AdamW under Megatron; STREAM-like kernels reach
0.7-0.8 of peak on two-socket servers, less across NUMA nodes, which pinned buffers do not respect."""


@dataclass(frozen=True)
class OffloadTime:
    """The offloaded share of one rank's optimizer step, seconds: Megatron's HybridDeviceOptimizer
    with --overlap-cpu-optimizer-d2h-h2d (overlapped), DeepSpeed's ZeRO-Offload (in series), or
    FSDP2's CPU offload (the host's clipping and AdamW only: its copies run every micro-batch and are
    priced with its collectives, stage_dp_time)."""

    gpu: float
    """Transformer Engine's FusedAdam over the share kept on the GPU."""
    d2h: float
    """The offloaded gradients to the host."""
    cpu: float
    """torch's AdamW on the host, the node's ranks sharing its memory bandwidth."""
    h2d: float
    """The updated parameters back."""
    overlapped: bool = True
    """Megatron's per-parameter pipelining (True) or DeepSpeed's copy, step and copy back one after the
    other (False)."""

    @property
    def chains(self) -> dict[str, float]:
        """The parts that add up within themselves, by what they are: Megatron's three chains, or
        DeepSpeed's three steps."""
        back = "the GPU's own step and the copy back" if self.overlapped else "the copy back"
        return {"the gradients' copy to the host": self.d2h, "the CPU Adam step": self.cpu, back: self.gpu + self.h2d}

    @property
    def total(self) -> float:
        """With Megatron's overlap each parameter is its own CPU optimizer: its gradient copy, its CPU
        step and its copy back pipeline with the other parameters', the GPU step runs beside them, and
        every copy back waits for the GPU step (the copy stream waits on the compute stream)
        [hybrid_optimizer.py: step, _register_param_copy_back_gpu_hook, build_cpu_optimizer_list]: the
        longest of the three chains (fills ignored). DeepSpeed waits for the gradients' copies, steps
        the partition on the host, then copies it back (deepspeed_engine [Offload]: step): their sum.
        ASSUMPTION: ZeRO-2's copies, issued as each bucket reduces in the last backward, are priced
        exposed like ZeRO-1's, which follow the backward."""
        return max(self.chains.values()) if self.overlapped else sum(self.chains.values())


def host_stream_share(cluster: ClusterSpec) -> float:
    """Host-memory bandwidth one rank's CPU work gets (bytes/s): the node's at HOST_STREAM_EFFICIENCY,
    split over its GPUs' ranks. ASSUMPTION: the node's other ranks offload as much at the same time."""
    return cluster.host.memory_bandwidth * HOST_STREAM_EFFICIENCY / cluster.gpus_per_node


def stage_offload_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                       layers: int) -> OffloadTime:
    """The optimizer step of pipeline rank `stage` under TrainingSpec.optimizer_offload (> 0).
    ASSUMPTION: the node's other ranks offload as much at the same time (they hold the same stage or
    its neighbours), so each gets 1 / gpus_per_node of the host's memory bandwidth."""
    host = cluster.host
    if host is None:
        raise PlannerError(f"cluster.host: {cluster.name} has no host spec; optimizer_offload needs its CPU memory "
                           "and host links")
    psi, f = optimizer_shard_params(model, layout, stage, layers), training.optimizer_offload
    share = host_stream_share(cluster)
    if uses_torchtitan(training):  # FSDP2: the shard lives on the host; its copies are stage_dp_time's
        return OffloadTime(0.0, 0.0, (CPU_CLIP_BYTES + CPU_ADAM_BYTES) * psi / share, 0.0, overlapped=False)
    if uses_deepspeed(training):  # the whole partition (TrainingSpec: f = 1), DeepSpeedCPUAdam on the host;
        # ZeRO-3 copies its FP32 gradient at the boundary (its micro-batches' copies: stage_dp_time)
        d2h = DEEPSPEED3_D2H_BYTES if layout.zero_stage == 3 else DEEPSPEED_D2H_BYTES
        return OffloadTime(0.0, d2h * psi / host.link_bandwidth, DEEPSPEED_CPU_STEP_BYTES * psi / share,
                           DEEPSPEED_H2D_BYTES * psi / host.link_bandwidth, overlapped=False)
    hbm = cluster.gpu.hbm_bandwidth * cluster.calibration.hbm_efficiency
    gpu = (1 - f) * psi * (2 * adam_bytes(training) + ADAM_OTHER_BYTES) / hbm
    link = OFFLOAD_LINK_BYTES * f * psi / host.link_bandwidth
    return OffloadTime(gpu, link, CPU_ADAM_BYTES * f * psi / share, link)


def stage_optimizer_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                         layers: int) -> float:
    """The Adam step on pipeline rank `stage`: memory-bound over the parameters it updates
    (sharded over dp x cp from ZeRO-1 on); with optimizer offload, stage_offload_time."""
    if training.optimizer_offload:
        return stage_offload_time(model, cluster, training, layout, stage, layers).total
    psi = optimizer_shard_params(model, layout, stage, layers)
    gpu = cluster.gpu
    states = apex_engine.state_bytes(training) if apex_engine.uses_apex(training) else adam_bytes(training)
    touched = 2 * states + ADAM_OTHER_BYTES
    return psi * touched / (gpu.hbm_bandwidth * cluster.calibration.hbm_efficiency)


@dataclass(frozen=True)
class UpdateTime:
    """The part of a step after the pipeline drains, on one rank: exposed DP communication and the
    optimizer step (seconds)."""

    stage: int
    dp_exposed: float
    optimizer: float

    @property
    def total(self) -> float:
        """Both terms."""
        return self.dp_exposed + self.optimizer

    @property
    def units(self) -> int:
        """The total in integer microseconds (rounded up once)."""
        return us_units(self.total)


def stage_update_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, stage: int,
                      layers: int) -> UpdateTime:
    """DP communication and optimizer step of pipeline rank `stage` holding `layers` layers."""
    return UpdateTime(stage, stage_dp_time(model, cluster, training, layout, stage, layers),
                      stage_optimizer_time(model, cluster, training, layout, stage, layers))


def update_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> UpdateTime:
    """The slowest rank's DP communication + optimizer step: the ranks run them at the same time,
    and the next step starts when all are done (ties: the first rank)."""
    ranks = [stage_update_time(model, cluster, training, layout, i, n) for i, n in enumerate(stage_layers(model, layout))]
    return max(ranks, key=lambda u: u.units)


def dp_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> float:
    """Exposed DP communication (seconds) on the rank whose update finishes last (update_time)."""
    return update_time(model, cluster, training, layout).dp_exposed


def training_flops(num_params: float, tokens: float) -> float:
    """6 N D: forward (2) + backward (4) FLOPs per parameter per token [Narayanan21 §5.1, 'Kaplan rule']."""
    return 6.0 * num_params * tokens


def time_to_train_s(total_flops: float, num_gpus: int, peak_flops: float, mfu: float) -> float:
    """Seconds to execute `total_flops` on `num_gpus` GPUs at `mfu` of `peak_flops` each."""
    return total_flops / (num_gpus * peak_flops * mfu)
