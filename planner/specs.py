"""Frozen pydantic specs: the model, the GPU and cluster, the workload, and a parallel layout."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from planner.errors import SpecError
from planner.units import parse_quantity

__all__ = [
    "Family",
    "Recompute",
    "ModelSpec",
    "GpuSpec",
    "LinkTier",
    "ScaleOut",
    "HostSpec",
    "PredictionError",
    "MoERouting",
    "BALANCED",
    "MoESpec",
    "MLASpec",
    "MambaSpec",
    "HYBRID_SYMBOLS",
    "Calibration",
    "ClusterSpec",
    "TrainingSpec",
    "ATTENTION_REFERENCE_KEYS",
    "FP8_ATTENTION_RECIPES",
    "Layout",
    "Kernels",
    "Fp8Recipe",
    "Fp8Scaling",
    "FP8_SCALING",
    "num_microbatches",
    "format_validation_error",
    "MAX_GPUS",
]


def _qty(kind: str):
    return BeforeValidator(lambda v: parse_quantity(v, kind) if isinstance(v, str) else v)


# Bounds on every size a user can give. They keep the solver's integers (microseconds, MiB) far
# from int64 and every float finite, and they sit well above anything trained today.
MAX_GPUS = 2**21
"""World size, and any parallel degree (2,097,152 GPUs)."""
MAX_LAYERS = 4096
MAX_WIDTH = 2**20
"""hidden_size, ffn_hidden_size, kv_channels (1,048,576)."""
MAX_HEADS = 2**16
MAX_VOCAB = 2**24
MAX_SEQ = 2**24
"""seq_length and max_position_embeddings (16,777,216 tokens)."""
MAX_BATCH = 2**24
"""global and micro-batch size, sequences."""
MAX_TOKENS_PER_STEP = 2**36
"""global_batch_size * seq_length (6.9e10 tokens; real runs use ~1.6e7)."""


def _count(hi: int, lo: int = 1):
    """A strict integer in [lo, hi]: booleans, strings and floats are refused."""
    low = {"gt": 0} if lo == 1 else {"ge": lo}  # "greater than 0" reads as the rule it is
    return Annotated[int, Field(strict=True, le=hi, **low)]


def _real(**bounds):
    """A strict, finite real number (an int is accepted; booleans and strings are not)."""
    return Annotated[float, Field(strict=True, allow_inf_nan=False, **bounds)]


def _quantity(kind: str, **bounds):
    """A _real that may also be given as a string with its unit ("80 GB"), parsed to SI first."""
    return Annotated[_real(**bounds), _qty(kind)]


Bytes = _quantity("bytes", gt=0, le=1e15)
BytesPerS = _quantity("bytes/s", gt=0, le=1e15)
FlopPerS = _quantity("flop/s", gt=0, le=1e18)
Seconds = _quantity("s", ge=0, le=1.0)
PosInt = _count(MAX_GPUS)
Bool = Annotated[bool, Field(strict=True)]
Name = Annotated[str, Field(strict=True, min_length=1, max_length=256)]
Fraction = _real(gt=0, le=1)
Share = _real(ge=0, le=1)


def _curve_rule(points: list, what: str, value_rule: str) -> None:
    """Measured curves: sizes strictly increasing, values non-decreasing with size."""
    if not points:
        raise ValueError(f"{what}: needs at least one (size, value) point")
    for (x1, y1), (x2, y2) in zip(points, points[1:]):
        if x2 <= x1:
            raise ValueError(f"{what}: sizes must increase strictly ({x1:g} then {x2:g})")
        if y2 < y1:
            raise ValueError(f"{what}: {value_rule} must not fall as size grows ({y1:g} then {y2:g})")


def _increasing_rule(xs: list, what: str) -> None:
    """Points read by interpolation: their first column strictly increasing (interp needs it ascending)."""
    if not xs or any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{what}, got {xs}")


def _field_and_rule(err: ValidationError) -> tuple[str, str]:
    """The first offending field (dotted path) and the rule it broke."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, SpecError) and inner.field:  # raised by a nested spec's own check
        return (f"{loc}.{inner.field}" if loc else inner.field), inner.rule or msg
    if first["type"] == "extra_forbidden":
        msg = "unknown key (not a field of this spec)"
    elif first["type"] == "missing":
        msg = "required field is missing"
    m = re.match(r"^(\w+): (.*)$", msg)
    if m and first["type"] == "value_error":  # cross-field rules name their field as "field: rule"
        loc = f"{loc}.{m.group(1)}" if loc else m.group(1)
        msg = m.group(2)
    return loc or "(root)", msg


def format_validation_error(err: ValidationError, what: str) -> str:
    """One line naming the first offending field and the rule it broke."""
    field, rule = _field_and_rule(err)
    return f"{what}: field '{field}': {rule}"


@cache
def _cached_names(cls: type) -> tuple[str, ...]:
    """The cached properties of a spec class (its own and inherited)."""
    return tuple(dict.fromkeys(k for c in cls.__mro__ for k, v in vars(c).items() if isinstance(v, cached_property)))


Kernels = Literal["fused", "unfused"]
"""A stack's kernel family: Megatron/Transformer Engine's fused kernels or eager PyTorch's."""

Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4", "rowwise", "torchao-tensorwise",
                    "torchao-mxfp8"]
"""The low-precision recipes TrainingSpec.fp8 names."""

Fp8Scaling = Literal["per-tensor", "row-wise", "block"]
"""How a recipe scales its operands: one scale a tensor, one a row (of the input and of the weight, and again
along the other axis for the backward GEMMs), or one a block of 16-128 elements."""

FP8_SCALING: dict[Fp8Recipe, Fp8Scaling] = {
    "delayed": "per-tensor", "tensorwise": "per-tensor", "torchao-tensorwise": "per-tensor",
    "rowwise": "row-wise",
    "blockwise": "block", "mxfp8": "block", "torchao-mxfp8": "block", "nvfp4": "block",
}
"""Each recipe's scaling: Transformer Engine's DelayedScaling and Float8CurrentScaling and torchao's
tensorwise keep one scale a tensor; torchao's rowwise one a row, its GEMMs PyTorch's row-wise scaled_mm;
Transformer Engine's Float8BlockScaling (1 x 128 and 128 x 128), MXFP8 (1 x 32) and NVFP4 (1 x 16) one a
block [TransformerEngine transformer_engine/common/recipe/__init__.py; torchao float8/config.py:
Float8LinearConfig.from_recipe_name]. The published FP8/BF16 pairs are read per scaling (uncertainty.
FP8_SPEEDUPS): one layout's row-wise and tensor-wise gains differ more than the model prices them."""


class _Spec(BaseModel):
    """Base: frozen, unknown keys rejected, field docstrings become descriptions."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            field, rule = _field_and_rule(err)
            raise SpecError(f"{type(self).__name__}: field '{field}': {rule}", field, rule) from None

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """A copy with `update` applied, whose derived values (cached properties) are computed from its
        own fields: pydantic copies the instance __dict__, where functools.cached_property keeps them,
        so without this a copy of a spec whose parameter counts were read keeps the old counts."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            for name in _cached_names(type(copy)):
                copy.__dict__.pop(name, None)
        return copy

    @classmethod
    def load(cls, data: Any, where: str | None = None):
        """Validate a mapping (e.g. parsed YAML); errors become SpecError naming the field."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
        try:
            return cls(**data)
        except SpecError as err:
            raise SpecError(f"{where}: field '{err.field}': {err.rule}", err.field, err.rule) from None


class Family(StrEnum):
    """Decoder-only transformer family, which fixes norms, MLP and biases."""

    GPT = "gpt"
    """LayerNorm, GeLU MLP (2 GEMMs), learned positions, biases, dropout."""
    LLAMA = "llama"
    """RMSNorm, RoPE, grouped-query attention, SwiGLU MLP (3 GEMMs), no biases, no dropout."""


class Recompute(StrEnum):
    """Activation recomputation granularity (Korthikanti et al. 2022)."""

    NONE = "none"
    """Store every activation."""
    SELECTIVE = "selective"
    """Recompute only the attention core (QK^T, softmax, dropout, PV)."""
    FULL = "full"
    """Store only each layer's input and recompute the whole layer in backward."""
    OP = "op"
    """torchtitan's per-op selective checkpointing (activation_checkpoint mode 'selective'): keep each
    block's input, attention's output and every other linear's output; recompute the rest (the other
    linears, norms, RoPE, activations) in backward [torchtitan distributed/activation_checkpoint.py:
    SelectiveAC]. Dense llama-family layers only."""


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act")
"""Megatron's --recompute-modules the planner prices (megatron-core 0.19.2 TransformerConfig.
recompute_modules, with recompute_granularity 'selective'; default ['core_attn']): core_attn the
attention core; layernorm the norms Megatron keeps as their own modules (the input norm before MLA's
down-projections, the pre-MLP norm of an MoE layer; the others are fused into their linear); mla_up_proj
MLA's up-projections and RoPE; mlp a dense layer's MLP; moe an MoE layer's whole MoE block (router,
dispatch, shared and routed experts, combine) under one checkpoint; moe_act the routed experts'
activation. 'shared_experts' (a checkpoint of the shared experts alone) is not priced."""


def _module_set(v: Any) -> Any:
    """recompute_modules as a sorted tuple without repeats (the order Megatron reads them in does not matter)."""
    if isinstance(v, str):
        v = [x for x in re.split(r"[,\s]+", v) if x]
    if isinstance(v, (list, tuple, set, frozenset)):
        return tuple(sorted(set(v), key=str))
    return v


class MoESpec(_Spec):
    """Mixture-of-Experts MLP (Megatron-Core semantics, llama family: SwiGLU experts)."""

    num_experts: _count(1 << 16, lo=2)
    """Routed experts per MoE layer (Megatron --num-experts; HF num_local_experts / n_routed_experts)."""
    top_k: _count(1 << 10)
    """Routed experts each token uses (--moe-router-topk; HF num_experts_per_tok)."""
    expert_ffn_hidden_size: _count(MAX_WIDTH)
    """Inner width of one routed expert (--moe-ffn-hidden-size; HF moe_intermediate_size)."""
    shared_expert_ffn_hidden_size: _count(MAX_WIDTH, lo=0) = 0
    """Inner width of all shared experts together (--moe-shared-expert-intermediate-size); 0 = none."""
    first_dense_layers: _count(MAX_LAYERS, lo=0) = 0
    """Leading layers with a dense MLP of ffn_hidden_size (DeepSeek-V3: 3; HF first_k_dense_replace)."""
    layer_step: _count(MAX_LAYERS) = 1
    """After the leading dense layers, every layer_step-th layer is MoE and the others dense: layers
    k + layer_step - 1, k + 2 layer_step - 1, ... (Llama-4 Maverick: 2, dense and MoE alternating;
    HF interleave_moe_layer_step, Qwen2-MoE's decoder_sparse_step; Megatron --moe-layer-freq as a
    0/1 list). ModelSpec.is_moe_layer."""
    shared_expert_gate: Bool = False
    """A sigmoid gate on the shared experts' output, one 1 x h weight per MoE layer (Qwen2-MoE's
    shared_expert_gate; Megatron's --moe-shared-expert-gate) [Megatron-LM@d98e8a6 megatron/core/
    transformer/moe/shared_experts.py: SharedExpertMLP.gate_weight, forward]. Counted in the
    parameters; its 2 h FLOPs per token, beside the router's 2 h E, are not priced."""
    router_groups: _count(1 << 16) | None = None
    """Group-limited routing: the experts in this many equal groups, each token's top_k drawn from
    router_group_topk of them (DeepSeek-V3: 8 and 4, HF n_group / topk_group; Megatron
    --moe-router-num-groups / --moe-router-group-topk) [megatron-core 0.19.2 transformer/moe/moe_utils.py:
    group_limited_topk]. Where DeepEP carries the tokens across nodes it caps the nodes one token
    reaches (comm.remote_nodes). None: every expert open to every token."""
    router_group_topk: _count(1 << 16) | None = None
    """Groups each token's experts come from (with router_groups)."""
    latent_size: _count(MAX_WIDTH) | None = None
    """LatentMoE (Nemotron-3 Super: 1024; Megatron --moe-latent-size, HF moe_latent_size): the routed
    experts work on a latent width. The router and shared experts see the block's input h; fc1_latent_proj
    (h -> latent) runs before dispatch, the tokens travel and the experts compute latent-wide (FC1 latent ->
    f_e, FC2 f_e -> latent), and fc2_latent_proj (latent -> h) runs after combine. Both projections are
    TELinear in 'duplicated' mode: whole on every TP rank, outside the expert grid, their gradients
    all-reduced over TP with sequence parallelism [megatron-core 0.19.2 transformer/moe/moe_layer.py:
    MoELayer.__init__, preprocess, postprocess; transformer/moe/experts.py: TEGroupedMLP.__init__;
    extensions/transformer_engine.py: TELinear.__init__]. None: the experts are h wide."""

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: top_k ({self.top_k}) cannot exceed num_experts ({self.num_experts})")
        if (self.router_groups is None) != (self.router_group_topk is None):
            raise ValueError("router_groups: group-limited routing needs router_groups and router_group_topk together")
        if self.router_groups is not None:
            if self.num_experts % self.router_groups:
                raise ValueError(f"router_groups: {self.router_groups} groups must divide num_experts ({self.num_experts})")
            if not self.router_group_topk <= min(self.router_groups, self.top_k):
                raise ValueError(f"router_group_topk: {self.router_group_topk} must be at most router_groups "
                                 f"({self.router_groups}) and top_k ({self.top_k})")
        if self.shared_expert_gate and not self.shared_expert_ffn_hidden_size:
            raise ValueError("shared_expert_gate: gates the shared experts; set shared_expert_ffn_hidden_size")
        return self

    def width(self, hidden_size: int) -> int:
        """The width routed tokens have from dispatch to combine, and the experts' input and output width:
        latent_size with LatentMoE, else the model's hidden size."""
        return self.latent_size or hidden_size

    def latent_params(self, hidden_size: int) -> int:
        """Parameters of the two latent projections (h x latent each, no bias); 0 without LatentMoE."""
        return 2 * hidden_size * self.latent_size if self.latent_size else 0


class MLASpec(_Spec):
    """Multi-latent attention (DeepSeek-V2/V3, Kimi-K2): low-rank Q and KV with a decoupled RoPE part."""

    q_lora_rank: _count(MAX_WIDTH) | None = None
    """Rank of the Q down-projection; None = Q projected directly from h."""
    kv_lora_rank: _count(MAX_WIDTH)
    """Rank of the joint KV down-projection."""
    qk_head_dim: _count(MAX_WIDTH)
    """Per-head Q/K width without position (HF qk_nope_head_dim)."""
    qk_rope_head_dim: _count(MAX_WIDTH)
    """Per-head Q/K width carrying RoPE (K's is shared by all heads)."""
    v_head_dim: _count(MAX_WIDTH)
    """Per-head V width."""


MAMBA_CONV_KERNEL = 4
"""Width of the Mamba-2 mixer's causal depthwise convolution (megatron-core 0.19.2 ssm/mamba_mixer.py:
MambaMixer.__init__, d_conv=4; not a command-line option)."""

HYBRID_SYMBOLS = {"M": "Mamba-2 mixer", "*": "attention", "-": "dense MLP", "E": "MoE"}
"""The layer symbols of Megatron's --hybrid-layer-pattern the planner prices, one layer each (megatron-core
0.19.2 models/hybrid/hybrid_layer_allocation.py: Symbols). Each is a layer of its own with one norm:
fused into the first linear for M, * and - (TELayerNormColumnParallelLinear), a TENorm before E's router
[models/hybrid/hybrid_layer_specs.py: hybrid_stack_spec]."""


class MambaSpec(_Spec):
    """The Mamba-2 mixer of a hybrid model's 'M' layers [megatron-core 0.19.2 ssm/mamba_mixer.py: MambaMixer;
    Dao & Gu 2024, Mamba-2 §7]: in_proj h -> (z, x, B, C, dt) of 2 d_in + 2 G N + H, a causal depthwise
    convolution over (x, B, C), the chunked SSD scan, a gated group RMSNorm over d_in, out_proj d_in -> h;
    d_in = H P."""

    num_heads: _count(MAX_HEADS)
    """SSM heads H (Megatron --mamba-num-heads; HF mamba_num_heads)."""
    head_dim: _count(MAX_WIDTH)
    """Channels per head P (--mamba-head-dim; HF mamba_head_dim)."""
    state_dim: _count(MAX_WIDTH)
    """State size N (--mamba-state-dim; HF ssm_state_size)."""
    num_groups: _count(MAX_HEADS)
    """Groups G sharing one B and C (--mamba-num-groups; HF n_groups)."""

    @model_validator(mode="after")
    def _check(self) -> MambaSpec:
        if self.num_heads % self.num_groups:
            raise ValueError(f"num_groups: num_groups ({self.num_groups}) must divide num_heads ({self.num_heads})")
        return self

    @property
    def inner(self) -> int:
        """d_in = H P, the width of x, z and the scan's output."""
        return self.num_heads * self.head_dim

    @property
    def in_proj_width(self) -> int:
        """in_proj's output: z and x (d_in each), B and C (G N each), dt (H)."""
        return 2 * self.inner + 2 * self.num_groups * self.state_dim + self.num_heads

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.inner + 2 * self.num_groups * self.state_dim

    def mixer_params(self, h: int) -> int:
        """Parameters of one mixer on a width-h model: in_proj and out_proj (no biases), the convolution's
        weight and bias, dt_bias, A_log and D (one per head) and the gated norm's d_in weight
        [MambaMixer.__init__]; the layer's input norm is fused into in_proj and counted by the caller."""
        return (h * (self.in_proj_width + self.inner) + self.conv_width * (MAMBA_CONV_KERNEL + 1)
                + 3 * self.num_heads + self.inner)


class ModelSpec(_Spec):
    """A decoder-only transformer: dense, or with Mixture-of-Experts MLPs, multi-latent attention and
    multi-token prediction depths. The parameter count is derived, never stored."""

    name: Name
    """Catalog id or a free name."""
    family: Family
    """Layer family: 'gpt' or 'llama'."""
    num_layers: _count(MAX_LAYERS)
    """Number of transformer layers L."""
    hidden_size: _count(MAX_WIDTH)
    """Model width h."""
    num_attention_heads: _count(MAX_HEADS)
    """Query heads a."""
    num_kv_heads: _count(MAX_HEADS) | None = None
    """Key/value heads g for grouped-query attention; None means g = a (multi-head)."""
    kv_channels: _count(MAX_WIDTH) | None = None
    """Per-head width d (Hugging Face `head_dim`, Megatron `--kv-channels`); None means h / a.
    Llama family only: queries are then a*d wide, which need not equal h (Mistral-NeMo: 32 x 128 vs 5120)."""
    ffn_hidden_size: _count(MAX_WIDTH)
    """MLP inner width f (per branch for SwiGLU)."""
    vocab_size: _count(MAX_VOCAB)
    """Vocabulary size V (as trained, before any padding)."""
    position_embedding: Literal["learned", "rope", "none"] | None = None
    """'learned' (a position table, GPT default), 'rope' (rotary, no parameters; Llama default) or 'none'
    (no positional signal beside the Mamba layers' order: Nemotron-H; Megatron --position-embedding-type none)."""
    max_position_embeddings: _count(MAX_SEQ) | None = None
    """Learned position table size; needed only with learned positions."""
    tied_embeddings: Bool = False
    """Input embedding and output layer share one matrix."""
    qkv_bias: Bool = False
    """Llama family only: Q/K/V projections carry a bias (Qwen2)."""
    qk_norm: Bool = False
    """Llama family only: RMSNorm over each head's Q and K before RoPE (Qwen3; Megatron --qk-layernorm)."""
    sliding_window: _count(MAX_SEQ) | None = None
    """Llama family only: keys a query sees in a windowed layer, itself included (HF sliding_window;
    Megatron --window-size w-1,0). None: every layer attends to its whole causal context."""
    attention_chunk: _count(MAX_SEQ) | None = None
    """Chunked attention (Llama 4: 8,192; HF attention_chunk_size): its RoPE layers attend within
    chunks of this many tokens, every fourth (NoPE) layer to the whole context. Planned only where
    one chunk spans the sequence (seq_length <= attention_chunk), where every layer is causal over
    it: no launch target runs chunked attention (megatron-core 0.19.2 has none in training), so a
    longer sequence would train another model, and is refused (planner.space.chunk_problem)."""
    full_attention_every: _count(MAX_LAYERS) | None = None
    """With sliding_window: layers n, 2n, ... (1-based) attend to the whole context and the others are
    windowed (Megatron --window-attn-skip-freq n; GPT-OSS: 2); None: every layer is windowed."""
    attention_sinks: Bool = False
    """Llama family only: a learnable logit per head in each softmax's denominator (GPT-OSS sinks;
    Megatron --softmax-type learnable, core_attention.softmax_offset): a parameters per layer."""
    linear_bias: Bool = False
    """Llama family only: every linear layer has a bias: Q/K/V, the out-projection, each MLP or expert
    projection and the router (GPT-OSS; Megatron's add_bias_linear, on unless --disable-bias-linear)."""
    activation: Literal["swiglu", "clamped-quick-geglu", "squared-relu"] = "swiglu"
    """Llama family only: the MLP's activation. 'clamped-quick-geglu' is GPT-OSS's
    (x * sigmoid(1.702 x)) * (y + 1), inputs clamped to 7 (Megatron --quick-geglu --glu-linear-offset 1
    --activation-func-clamp-value 7): same three projections and the same cost as SwiGLU. 'squared-relu'
    is relu(x)^2 without a gate (Nemotron-H; Megatron --squared-relu): two projections, FC1 f wide
    [megatron-core 0.19.2 activations.py: squared_relu]."""
    dropout: Bool | None = None
    """Hidden, attention and embedding dropout during training (Megatron's defaults, 0.1): None = the
    family's (on for 'gpt', off for 'llama'); False for GPT layers trained without it (MPT: its
    resid/attn/emb_pdrop default to 0 [llm-foundry llmfoundry/models/mpt/configuration_mpt.py],
    and PyTorch's dropout at p = 0 returns its input and keeps no mask)."""
    mtp_layers: _count(MAX_LAYERS, lo=0) = 0
    """Multi-token prediction depths trained beside the model (DeepSeek-V3: 1; HF
    num_nextn_predict_layers; Megatron --mtp-num-layers), each on the last pipeline rank after the
    decoder: the next token's embedding and the decoder's output, each RMSNorm'd, concatenated and
    projected 2h -> h, one transformer layer of the last decoder layer's kind, its own final norm,
    then the shared output layer and a loss [megatron-core 0.19.2 transformer/multi_token_prediction.py:
    MultiTokenPredictionLayer, process_mtp_loss; models/gpt/gpt_layer_specs.py:
    get_gpt_mtp_block_spec_for_backend, layer_specs[-1]]. Its parameters (mtp_params) are outside
    num_params, as published totals count them (DeepSeek-V3: 671B main model, 14B MTP module). A hybrid
    model's depth is the pattern '*E' (attention, then an MoE block; '*-' without experts), which is one
    transformer layer of that kind: Megatron's '--hybrid-layer-pattern main/*E/*E' [megatron-core 0.19.2
    models/hybrid/hybrid_layer_allocation.py: parse_hybrid_pattern; Nemotron-3 Super's HF
    mtp_hybrid_override_pattern '*E']."""
    mtp_shared: Bool = False
    """The MTP depths run one shared set of weights, mtp_layers times (Megatron --mtp-use-repeated-layer;
    Nemotron-3 Super trains 2 depths of its one '*E' block) [megatron-core 0.19.2
    transformer/multi_token_prediction.py: MultiTokenPredictionBlock._build_layers]: its parameters,
    gradients and optimizer state count once, its time and activations once per depth."""
    moe: MoESpec | None = None
    """Mixture-of-Experts MLPs (llama family); None = dense."""
    mla: MLASpec | None = None
    """Multi-latent attention (llama family); None = (grouped-query) multi-head attention."""
    layer_pattern: Annotated[str, Field(min_length=1, max_length=MAX_LAYERS)] | None = None
    """A hybrid model's layers, one symbol each (HYBRID_SYMBOLS: M Mamba-2, * attention, - dense MLP, E MoE),
    in order; Megatron's --hybrid-layer-pattern (Nemotron-H: 'M-M-M-...', Nemotron-3 Nano 'MEMEM*E...').
    Its length is num_layers. None: every layer is attention + MLP (a transformer)."""
    mamba: MambaSpec | None = None
    """The Mamba-2 mixer of the pattern's M layers (with layer_pattern)."""
    sources: list[dict[str, Any]] = Field(default_factory=list, repr=False)
    """Where the numbers come from (catalog files)."""
    provenance: dict[str, str] = Field(default_factory=dict, repr=False)
    """Field name -> source id and locator."""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        h, a = self.hidden_size, self.num_attention_heads
        if self.kv_channels is not None and self.family == Family.GPT:
            raise ValueError("kv_channels: an explicit per-head width is supported for the 'llama' family only")
        if self.kv_channels is None and h % a:
            raise ValueError(f"hidden_size: num_attention_heads ({a}) must divide hidden_size ({h})")
        if a % self.kv_heads:
            raise ValueError(f"num_kv_heads: num_kv_heads ({self.kv_heads}) must divide num_attention_heads ({a})")
        if self.positions == "learned" and self.max_position_embeddings is None:
            raise ValueError("max_position_embeddings: learned position embeddings need max_position_embeddings")
        if self.family == Family.GPT and self.num_kv_heads not in (None, a):
            raise ValueError("num_kv_heads: the 'gpt' family is multi-head: num_kv_heads must equal num_attention_heads")
        if self.family == Family.GPT and self.qkv_bias:
            raise ValueError("qkv_bias: qkv_bias is for the 'llama' family (GPT already has all biases)")
        if self.qk_norm and (self.family == Family.GPT or self.mla is not None):
            raise ValueError("qk_norm: per-head Q/K norms are for the 'llama' family without MLA (MLA has latent norms)")
        for name in ("moe", "mla", "sliding_window", "attention_sinks", "linear_bias", "mtp_layers"):
            if getattr(self, name) and self.family == Family.GPT:
                raise ValueError(f"{name}: supported for the 'llama' family (SwiGLU, RMSNorm) only")
        if self.dropout and self.family == Family.LLAMA:
            raise ValueError("dropout: llama-family layers are priced without dropout (set it on 'gpt' models only)")
        if self.activation != "swiglu" and self.family == Family.GPT:
            raise ValueError("activation: the 'gpt' family's MLP is GeLU; gated activations are for 'llama'")
        if self.attention_chunk is not None and self.sliding_window is not None:
            raise ValueError("attention_chunk: chunked and sliding-window attention together are not modelled")
        if self.full_attention_every is not None and self.sliding_window is None:
            raise ValueError("full_attention_every: needs sliding_window (which layers are windowed, and by how much)")
        if self.sliding_window is not None and self.mla is not None:
            raise ValueError("sliding_window: windowed multi-latent attention is not modelled")
        if self.linear_bias and self.qkv_bias:
            raise ValueError("qkv_bias: linear_bias already puts a bias on Q/K/V; set one of them")
        if self.layer_pattern is not None:
            self._check_pattern()
        if self.mtp_shared and not self.mtp_layers:
            raise ValueError("mtp_shared: shares the weights of MTP depths; set mtp_layers")
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(f"moe: first_dense_layers ({self.moe.first_dense_layers}) exceeds num_layers ({self.num_layers})")
        if self.moe is not None and (self.num_layers - self.moe.first_dense_layers) % self.moe.layer_step:
            raise ValueError(f"moe: layer_step ({self.moe.layer_step}) must divide the layers after the leading dense "
                             f"ones ({self.num_layers} - {self.moe.first_dense_layers}), so the pattern ends on an MoE layer")
        return self

    def _check_pattern(self) -> None:
        pat = self.layer_pattern
        if bad := sorted(set(pat) - set(HYBRID_SYMBOLS)):
            raise ValueError(f"layer_pattern: symbols {''.join(bad)!r} are not priced (one of "
                             f"{', '.join(f'{k} {v}' for k, v in HYBRID_SYMBOLS.items())}; pipe and MTP separators: "
                             "the layout places stages)")
        if len(pat) != self.num_layers:
            raise ValueError(f"layer_pattern: {len(pat)} symbols, but num_layers is {self.num_layers}")
        if ("M" in pat) != (self.mamba is not None):
            raise ValueError("mamba: set it exactly when layer_pattern has M (Mamba-2) layers")
        if ("E" in pat) != (self.moe is not None):
            raise ValueError("moe: set it exactly when layer_pattern has E (MoE) layers")
        if self.family != Family.LLAMA:
            raise ValueError("layer_pattern: hybrid models are priced for the 'llama' family (RMSNorm, no biases)")
        if self.moe is not None and (self.moe.first_dense_layers or self.moe.layer_step > 1):
            raise ValueError("moe: with layer_pattern the pattern places the MoE layers; leave first_dense_layers "
                             "and layer_step at their defaults")
        for name in ("mla", "sliding_window", "attention_chunk", "linear_bias", "attention_sinks"):
            if getattr(self, name):
                raise ValueError(f"{name}: not priced in a hybrid (layer_pattern) model")

    @property
    def hybrid(self) -> bool:
        """Whether the layers follow a layer_pattern (Mamba-2 / attention / MLP / MoE layers of their own)."""
        return self.layer_pattern is not None

    def layer_symbol(self, i: int) -> str | None:
        """Layer i's (0-based) HYBRID_SYMBOLS symbol in a hybrid model; None in a transformer."""
        return self.layer_pattern[i] if self.layer_pattern is not None else None

    @property
    def kinds_follow_split(self) -> bool:
        """Whether a pipeline rank's layer kinds depend on which layers it holds: dense layers between MoE
        ones (MoESpec.layer_step > 1) or a hybrid pattern (planner.memory.dense_layers_on, symbols_on)."""
        return self.hybrid or (self.moe is not None and self.moe.layer_step > 1)

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (FC1 computes gate and up, 2 f wide): every activation but squared-relu."""
        return self.activation != "squared-relu"

    def fc1_width(self, ffn: int) -> int:
        """FC1's output width for an MLP (or expert) of inner width ffn: 2 ffn gated, ffn otherwise."""
        return 2 * ffn if self.gated else ffn

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i (0-based) has an MoE MLP (MoESpec.first_dense_layers, layer_step; a hybrid
        model's E layers)."""
        if self.moe is None:
            return False
        if self.layer_pattern is not None:
            return self.layer_pattern[i] == "E"
        k, step = self.moe.first_dense_layers, self.moe.layer_step
        return i >= k and (i - k + 1) % step == 0

    @cached_property
    def moe_layers(self) -> int:
        """Layers with an MoE MLP (0 for a dense model)."""
        if self.moe is None:
            return 0
        if self.layer_pattern is not None:
            return self.layer_pattern.count("E")
        return (self.num_layers - self.moe.first_dense_layers) // self.moe.layer_step

    @cached_property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: all of a dense model's, an MoE model's leading and interleaved ones."""
        return self.num_layers - self.moe_layers

    @cached_property
    def attention_params(self) -> int:
        """Parameters of one layer's attention block, norms excluded (llama family).

        MLA [DeepSeek-V3 report §2.1; HF DeepseekV3Attention]: Q = W_uq(norm(W_dq x)) over a heads of
        (qk_head_dim + qk_rope_head_dim), or W_q x without q_lora_rank; [c_kv, k_rope] = W_dkv x
        (kv_lora_rank + qk_rope_head_dim wide), K_nope and V = W_ukv(norm(c_kv)); out-proj from a*v_head_dim.
        """
        h, a = self.hidden_size, self.num_attention_heads
        if self.mla is not None:
            m = self.mla
            qk = m.qk_head_dim + m.qk_rope_head_dim
            q = h * a * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim)
            return q + kv + a * m.v_head_dim * h
        hq, hkv = self.q_hidden, self.kv_hidden
        return (h * hq + 2 * h * hkv + hq * h + ((hq + 2 * hkv) if self.qkv_bias or self.linear_bias else 0)
                + (h if self.linear_bias else 0) + (a if self.attention_sinks else 0)
                + (2 * self.head_dim if self.qk_norm else 0))

    @property
    def op_recompute_priced(self) -> bool:
        """Whether Recompute.OP is priced for this model: dense llama-family layers without MLA, the
        blocks whose linears torchtitan runs in the order memory._op_saved_bytes counts."""
        return self.family == Family.LLAMA and self.mla is None and self.moe is None

    @property
    def uses_dropout(self) -> bool:
        """Whether training runs dropout (and keeps its masks): `dropout`, or the family's default."""
        return self.dropout if self.dropout is not None else self.family == Family.GPT

    def mlp_params(self, ffn: int, width: int | None = None) -> int:
        """One MLP (or expert) of inner width ffn on `width`-wide tokens (the hidden size unless given:
        a LatentMoE expert's is the latent): FC1 (gate and up, 2 w f; w f ungated) and FC2 (w f), plus
        their biases (fc1_width + w) with linear_bias."""
        h, fc1 = width or self.hidden_size, self.fc1_width(ffn)
        return (fc1 + ffn) * h + ((fc1 + h) if self.linear_bias else 0)

    @cached_property
    def megatron_only(self) -> tuple[str, ...]:
        """This model's features that only the Megatron launch config builds (Megatron-DeepSpeed's configs
        as emitted would build another model; torchtitan's builds the experts and Q/K norms of the Qwen3 MoE
        models it registers, planner.torchtitan_engine.unbuilt_features), named with their fields."""
        return tuple(name for name, on in (
            ("experts (moe)", self.moe is not None), ("multi-latent attention (mla)", self.mla is not None),
            ("Q/K norms (qk_norm)", self.qk_norm), ("sliding-window attention (sliding_window)", self.sliding_window is not None),
            ("attention sinks (attention_sinks)", self.attention_sinks), ("linear biases (linear_bias)", self.linear_bias),
            (f"the {self.activation} activation (activation)", self.activation != "swiglu"),
            ("multi-token prediction (mtp_layers)", self.mtp_layers > 0),
            ("Mamba-2 hybrid layers (layer_pattern)", self.layer_pattern is not None)) if on)

    @cached_property
    def windowed_layers(self) -> int:
        """Layers whose attention is windowed: all with sliding_window alone, the layers whose 1-based
        index full_attention_every does not divide with it [megatron-core 0.19.2 transformer/utils.py:
        is_layer_window_attention, layer_number % window_attn_skip_freq != 0]; 0 without a window."""
        if self.sliding_window is None:
            return 0
        n = self.full_attention_every
        return self.num_layers - (self.num_layers // n if n else 0)

    @cached_property
    def moe_layer_params(self) -> tuple[int, int]:
        """(total, active) parameters of one MoE layer: attention, two RMSNorms, the router (h x E, + E
        with linear_bias), the routed gated experts (E, or top_k of them active, of mlp_params(f_e))
        and the shared experts."""
        if self.moe is None:
            raise ValueError("moe_layer_params: a dense model has no MoE layers")
        total, active = self._moe_block_params
        base = self.attention_params + self.hidden_size
        return base + total, base + active

    @cached_property
    def _moe_block_params(self) -> tuple[int, int]:
        """(total, active) parameters of an MoE block: its pre-MLP norm, the router, the shared and the
        routed experts (a hybrid model's E layer)."""
        h, e = self.hidden_size, self.moe
        router = h * e.num_experts + (e.num_experts if self.linear_bias else 0)
        shared = self.mlp_params(e.shared_expert_ffn_hidden_size) if e.shared_expert_ffn_hidden_size else 0
        shared += h if e.shared_expert_gate else 0
        base = h + router + shared + e.latent_params(h)
        expert = self.expert_params
        return base + e.num_experts * expert, base + e.top_k * expert

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one routed expert: mlp_params(f_e) at the experts' width (MoESpec.width)."""
        return self.mlp_params(self.moe.expert_ffn_hidden_size, self.moe.width(self.hidden_size))

    def symbol_params(self, symbol: str) -> tuple[int, int]:
        """(total, active) parameters of one hybrid layer of HYBRID_SYMBOLS `symbol`, its norm included."""
        h = self.hidden_size
        if symbol == "E":
            return self._moe_block_params
        n = h + {"M": lambda: self.mamba.mixer_params(h), "*": lambda: self.attention_params,
                 "-": lambda: self.mlp_params(self.ffn_hidden_size)}[symbol]()
        return n, n

    @cached_property
    def mtp_layer_is_moe(self) -> bool:
        """Whether an MTP depth's transformer layer is an MoE layer: it is built from the last decoder
        layer's spec (get_gpt_mtp_block_spec_for_backend: spec.layer_specs[-1]); a hybrid model's depth
        is '*E' where it has experts, '*-' where not (mtp_layers)."""
        return self.moe is not None if self.hybrid else self.is_moe_layer(self.num_layers - 1)

    @property
    def mtp_pattern(self) -> str:
        """A hybrid model's MTP depth in Megatron's pattern symbols: '*E' with experts, else '*-'."""
        return "*E" if self.moe is not None else "*-"

    @property
    def mtp_param_depths(self) -> int:
        """MTP depths with weights of their own: 1 where they share one (mtp_shared), else mtp_layers."""
        return min(1, self.mtp_layers) if self.mtp_shared else self.mtp_layers

    @cached_property
    def mtp_depth_params(self) -> int:
        """Parameters of one MTP depth: its transformer layer (moe_layer_params or params_per_layer), the
        2h x h projection (eh_proj, no bias) and three RMSNorms (enorm, hnorm, final_layernorm); the
        embedding and output layer are the model's [multi_token_prediction.py: MultiTokenPredictionLayer.__init__]."""
        h = self.hidden_size
        layer = self.moe_layer_params[0] if self.mtp_layer_is_moe else self.params_per_layer
        return layer + 2 * h * h + 3 * h

    @cached_property
    def mtp_params(self) -> int:
        """Parameters of the multi-token prediction module (mtp_param_depths depths; 0 without)."""
        return self.mtp_param_depths * self.mtp_depth_params

    @cached_property
    def active_params(self) -> int:
        """Parameters one token uses (all of them for a dense model)."""
        if self.layer_pattern is not None:
            return (sum(self.symbol_params(c)[1] for c in self.layer_pattern)
                    + self.embedding_params + self.output_params)
        if self.moe is None:
            return self.num_params
        return (self.dense_layers * self.params_per_layer + self.moe_layers * self.moe_layer_params[1]
                + self.embedding_params + self.output_params)

    @cached_property
    def active_params_without_embedding(self) -> int:
        """active_params less the input embedding, a table lookup rather than a matmul: the count OpenAI
        publishes for GPT-OSS (its model card's 5.13B / 3.61B active count the unembedding only); Mistral,
        Qwen and DeepSeek count both, as active_params does."""
        return self.active_params - self.embedding_params

    @cached_property
    def positions(self) -> str:
        """Position scheme in effect: the explicit one, else 'learned' for GPT and 'rope' for Llama."""
        return self.position_embedding or ("learned" if self.family == Family.GPT else "rope")

    @cached_property
    def kv_heads(self) -> int:
        """Key/value heads g (equals a for multi-head attention)."""
        return self.num_kv_heads or self.num_attention_heads

    @cached_property
    def head_dim(self) -> int:
        """d: kv_channels when given, else h / a."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @cached_property
    def q_hidden(self) -> int:
        """a * d, the width of Q and of the attention output (h unless kv_channels says otherwise)."""
        return self.num_attention_heads * self.head_dim

    @cached_property
    def kv_hidden(self) -> int:
        """h_kv = g * d, the width of K (and of V)."""
        return self.kv_heads * self.head_dim

    @cached_property
    def core_head_dims(self) -> tuple[int, int]:
        """(d_qk, d_v): per-head widths of the attention core's Q/K and V (d, d; with MLA the Q/K
        width includes the RoPE part, qk_head_dim + qk_rope_head_dim, and V is v_head_dim)."""
        if self.mla is not None:
            return self.mla.qk_head_dim + self.mla.qk_rope_head_dim, self.mla.v_head_dim
        return self.head_dim, self.head_dim

    @cached_property
    def attention_out_width(self) -> int:
        """a * d_v: the attention output, the out-projection's input."""
        return self.num_attention_heads * self.core_head_dims[1]

    @cached_property
    def mla_duplicated_params(self) -> int:
        """MLA parameters every TP rank holds whole: the Q and KV down-projections (Megatron builds
        them as duplicated TELinear [Megatron-LM@d98e8a6 megatron/core/transformer/
        multi_latent_attention.py: MLASelfAttention.__init__, parallel_mode='duplicated']) and the
        two latent RMSNorms; 0 without MLA."""
        if self.mla is None:
            return 0
        m, h = self.mla, self.hidden_size
        q = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank is not None else 0
        return q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank

    @cached_property
    def params_per_layer(self) -> int:
        """Parameters of one transformer layer."""
        h, f, hkv = self.hidden_size, self.ffn_hidden_size, self.kv_hidden
        if self.family == Family.GPT:
            # Reference: [Narayanan21, App. (parameter count)] 12lh^2 + 13lh for f = 4h; general f:
            attn = (h * 3 * h + 3 * h) + (h * h + h)  # fused QKV weight+bias, out-proj weight+bias
            mlp = (h * f + f) + (f * h + h)  # FC1, FC2 with biases
            norms = 2 * 2 * h  # two LayerNorms, gamma and beta
            return attn + mlp + norms
        attn = self.attention_params  # Q, K, V, out-proj (+ Qwen2 Q/K/V biases; MLA's projections)
        mlp = self.mlp_params(f)  # gate, up, down (SwiGLU) (+ biases)
        norms = 2 * h  # two RMSNorm scales
        return attn + mlp + norms

    @cached_property
    def embedding_params(self) -> int:
        """Input side: token embedding (+ learned positions for GPT)."""
        pos = self.max_position_embeddings * self.hidden_size if self.positions == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @cached_property
    def output_params(self) -> int:
        """Output side: final norm, and the output projection unless tied."""
        norm = 2 * self.hidden_size if self.family == Family.GPT else self.hidden_size
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return norm + head

    @cached_property
    def num_params(self) -> int:
        """Total parameter count Psi (derived from the shape). params_per_layer is a dense layer's;
        with MoE the MoE layers (moe_layers) count moe_layer_params instead; a hybrid model's layers count
        symbol_params."""
        if self.layer_pattern is not None:
            layers = sum(self.symbol_params(c)[0] for c in self.layer_pattern)
        elif self.moe is not None:
            layers = self.dense_layers * self.params_per_layer + self.moe_layers * self.moe_layer_params[0]
        else:
            layers = self.num_layers * self.params_per_layer
        return layers + self.embedding_params + self.output_params


class GpuSpec(_Spec):
    """One accelerator."""

    name: Name
    """Marketing name, e.g. 'H100-SXM5-80GB'."""
    memory: Bytes
    """HBM capacity in bytes (strings such as '80 GB' are parsed)."""
    peak_bf16_flops: FlopPerS
    """Dense BF16 tensor-core peak, FLOP/s (not the 2:4-sparse figure)."""
    peak_fp8_flops: FlopPerS | None = None
    """Dense FP8 peak, FLOP/s, where the GPU has FP8."""
    peak_fp4_flops: FlopPerS | None = None
    """Dense FP4 (NVFP4) peak, FLOP/s, where the GPU has FP4 tensor cores (Blackwell)."""
    hbm_bandwidth: BytesPerS
    """Peak HBM bandwidth, bytes/s."""
    arch: _count(12, lo=7)
    sm_count: _count(1024) | None = None
    """Streaming multiprocessors (compute units on AMD): prices kernels that reserve some of them,
    e.g. Transformer Engine's communication kernels under --tp-comm-overlap."""
    """Compute-capability major version (8 Ampere, 9 Hopper, 10 Blackwell)."""


class LinkTier(_Spec):
    """The scale-up (NVLink / xGMI) fabric inside one NVLink domain."""

    allreduce_busbw: BytesPerS
    """Saturated all-reduce bus bandwidth (NVLS where the switch reduces), bytes/s."""
    ring_busbw: BytesPerS
    """Saturated all-gather / reduce-scatter / ring bus bandwidth, bytes/s."""
    busbw_curve: list[tuple[Bytes, BytesPerS]]
    """Measured all-reduce (message bytes, bus bandwidth) points; their shape scales every op's busbw."""
    latency: Seconds
    """Small-message latency alpha of one collective, seconds."""
    p2p_bandwidth: BytesPerS
    """Unidirectional point-to-point bandwidth between two GPUs, bytes/s."""

    @model_validator(mode="after")
    def _check(self) -> LinkTier:
        _curve_rule(self.busbw_curve, "busbw_curve", "bus bandwidth")
        return self


class ScaleOut(_Spec):
    """The scale-out network (InfiniBand / RoCE), rail-optimised: NICs spread over the GPUs."""

    nics_per_node: _count(1024)
    """Network interfaces per node."""
    nic_busbw: BytesPerS
    """Effective collective bandwidth one NIC delivers (e.g. ~47 GB/s for 400G NDR), bytes/s."""
    latency: Seconds
    """Small-message latency alpha of one inter-node collective, seconds."""


class HostSpec(_Spec):
    """The host side of a node, for what the optimizer offloads to it (TrainingSpec.optimizer_offload)."""

    memory: Bytes
    """Host (CPU) memory per node, bytes."""
    memory_bandwidth: BytesPerS
    """Peak host memory bandwidth per node (channels x transfer rate x 8 B), bytes/s."""
    link_bandwidth: BytesPerS
    """One GPU's host link, one direction, pinned-memory copies (PCIe or NVLink-C2C), bytes/s."""
    cores: _count(100_000)
    """CPU cores per node (the emitted launch gives each rank its share as OMP_NUM_THREADS)."""
    reserve: Bytes = 64 * 2**30
    """Host memory per node kept for the OS, the data loaders and the processes themselves
    (ASSUMED 64 GiB unless the cluster says otherwise); the rest may hold offloaded states."""

    @model_validator(mode="after")
    def _check(self) -> HostSpec:
        if self.reserve >= self.memory:
            raise ValueError(f"reserve: the reserve ({self.reserve / 2**30:.0f} GiB) must be smaller than memory "
                             f"({self.memory / 2**30:.0f} GiB)")
        return self


ATTENTION_REFERENCE_KEYS = 8192
"""The kernel length at which a cluster's attention efficiencies are stated (S26's FlashAttention-2 sweep,
cuDNN's at seq 8192): the 1 of Calibration.attention_length_curve and of planner.cost.FLASH_CAUSAL_CURVE."""
LengthCurve = list[tuple[_real(ge=1, le=2**24), _real(gt=0, le=4), _real(gt=0, le=4)]]
"""(keys per query, forward speed, backward speed) points of an attention kernel (Calibration.attention_length_curve)."""


class Calibration(_Spec):
    """Physical efficiency parameters, fitted once per GPU generation (never per run)."""

    gemm_efficiency: list[tuple[_real(gt=0, le=1e9), Fraction]]
    """(GFLOP of one GEMM, fraction of dense peak in (0, 1]) points; log-interpolated, clamped at the ends."""
    attention_efficiency: Fraction
    """Fraction of dense peak a flash-attention kernel reaches on causal-halved FLOPs (measured FA2 forward)."""
    attention_efficiency_unfused: Fraction
    """The same for the attention kernels of eager-PyTorch trainers: llm-foundry's Triton FlashAttention, cited
    at about half the GPU's FlashAttention-2 forward, not fitted (clusters/dgx-h100.yaml provenance); torchtitan's
    SDPA is priced at it too (ASSUMPTION, README)."""
    elementwise_passes: _real(ge=0, le=1000)
    """Memory-bound traffic per layer per token in units of 2*h bytes, with fused kernels (Megatron/TE)."""
    elementwise_passes_unfused: _real(ge=0, le=1000)
    """The same with eager PyTorch kernels (unfused norms, activations, dropout; FSDP-style trainers)."""
    tp_comm_exposed: Share
    """Fraction of tensor-parallel communication left on the critical path."""
    dp_overlap: Share
    """FSDP only (ZeRO-3, and ZeRO-2 outside DeepSpeed: Megatron-FSDP's optim_grads, torch FSDP's SHARD_GRAD_OP):
    fraction of a micro-batch's compute that hides its parameter gathers and gradient reduce-scatters (prefetch;
    at ZeRO-2 where the Layout's overlap flags are on). Megatron's DDP buckets (ZeRO 0-1) and DeepSpeed's ZeRO-1/2
    follow the flags instead, the whole backward hiding them."""
    hbm_efficiency: Fraction
    """Achieved fraction of peak HBM bandwidth for streaming kernels (STREAM triad)."""
    gemm_efficiency_fp8: list[tuple[_real(gt=0, le=1e9), Fraction]] | None = None
    """As gemm_efficiency for FP8 GEMMs, as a fraction of gpu.peak_fp8_flops (None: not measured,
    FP8 is refused on this cluster)."""
    fp8_gemm_in_training: Fraction = 1.0
    """What an FP8 GEMM reaches inside a training step of a fused-kernel stack (Transformer Engine's
    recipes), as a fraction of gemm_efficiency_fp8 (an isolated cuBLASLt sweep): fitted per GPU
    generation on the published FP8 runs, 1.0 where none are published."""
    mxfp8_gemm_in_training: Fraction | None = None
    """The same for the MXFP8 recipe's block-scaled kernels (Transformer Engine's MXFP8 quantisation and
    cuBLAS's block-scaled GEMMs), where they are fitted apart from the per-tensor ones; None:
    fp8_gemm_in_training."""
    fp8_gemm_in_training_unfused: Fraction = 1.0
    """The same for the eager-kernel stacks (torchao's float8 under torchtitan)."""
    mamba_scan_efficiency: Fraction = 1.0
    """Share of its HBM roofline a Mamba-2 layer's convolution, SSD scan and norm kernels reach
    (planner.cost.mamba_scan_time). ASSUMED 1.0 in the catalog (the roofline, an upper bound): the published
    Nemotron-3 Nano rows would fit about 0.29, but they are one source group, so it is left for
    `planner calibrate` to fit from one's own hybrid runs."""
    ep_comm_speed: _real(gt=0, le=4) = 1.0
    """Speed of an MoE layer's dispatch and combine (the EP all-to-alls, DeepEP's or the all-gather
    dispatcher's collectives, the ETP gather / scatter) relative to planner.comm's pricing of them on the
    tiers they cross (1: as priced). 1 in the catalog; `planner calibrate` fits it from one's own MoE runs."""
    fp8_attention_speed: dict[Literal["per_tensor", "mxfp8"],
                              list[tuple[_count(1024), _real(gt=0, le=4), _real(gt=0, le=4)]]] | None = None
    """Speed of Transformer Engine's FP8 fused attention (cuDNN's FP8 SDPA) over its BF16 kernel on this
    GPU, by scaling ('per_tensor': the delayed and tensorwise recipes; 'mxfp8'), as (query-key head
    dim, forward, backward) points, linear in the head dim between them and clamped at the ends: the
    ratio of the same causal kernel's TFLOP/s in cuDNN's own benchmark. Prices TrainingSpec.fp8_attention
    (planner.cost.fp8_attention_speed); None (or a missing scaling): not measured, FP8 attention is refused."""
    attention_length_curve: LengthCurve | None = None
    """The fused attention kernel's speed by the keys each query sees (the kernel's length: the sequence,
    a CP chunk, a document, or a window's tiles, planner.cost.flash_speed_factor), as (keys, forward,
    backward) points relative to attention_efficiency, which is its forward at 8,192 keys (that point
    must read 1); the backward's is its five-matmul TFLOP/s over that same forward speed. Log-interpolated
    in the keys, clamped at the ends; only the fused stacks (Transformer Engine's kernels) read it. Measured
    per GPU for the kernel Transformer Engine runs there; None: FlashAttention-2's H100 forward curve
    (planner.cost.FLASH_CAUSAL_CURVE) for both passes."""
    grouped_gemm_call: Seconds = 0.0
    """Host seconds per expert GEMM of a Transformer Engine grouped linear (an MoE layer's FC1 or FC2 over its
    local experts): TE issues one cuBLASLt matmul per expert, each with its own descriptors and heuristic query,
    from the host in turn [TransformerEngine common/gemm/cublaslt_gemm.cu: nvte_multi_tensor_gemm ->
    multi_stream_cublas_gemm -> cublas_gemm, v2.8 ... v2.18; a single grouped kernel only on Hopper with
    NVTE_USE_CUTLASS_GROUPED_GEMM for BF16], after the dispatcher's host sync has drained the GPU's queue, so a
    grouped GEMM takes at least local experts x this (planner.cost.moe_time). Runs that capture the experts in
    a CUDA graph do not pay it; the planner's launches do not capture them."""
    moe_host_stall: Seconds = 0.0
    """Seconds the GPU idles in every MoE layer's forward (and its recomputed forward) while the host waits
    for the dispatcher's device-to-host copy of the token counts, then launches the rest of the layer:
    without CUDA graphs Megatron's dispatchers synchronise there [megatron-core 0.19.2 transformer/moe/
    token_dispatcher.py: MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize at cuda_sync_point, set
    'before_ep_alltoall' by preprocess when ep or tp > 1], as torchtitan 0.3's does for its splits
    (AllToAllTokenDispatcher.dispatch). The catalog's is fitted with grouped_gemm_call on the published MoE
    runs of all three source groups, one value for every GPU (benchmarks/fidelity.py: moe_fit; 1.5 ms); held
    out, each group's refit on the other two prices it better than none did (README, Mixture-of-Experts).
    `planner calibrate` fits one's own from one's MoE runs. ASSUMPTION: torchtitan's stall is Megatron's."""
    moe_fitted_on: tuple[Name, ...] = ()
    """The MoE models (ModelSpec.name) whose logs `planner calibrate` fitted this calibration to; () for
    the catalog's. Fitted on one MoE model, the host's floor and stall follow its expert GEMMs, so
    planner.evaluate warns where another MoE model is priced with them."""

    @model_validator(mode="after")
    def _check(self) -> Calibration:
        _curve_rule(self.gemm_efficiency, "gemm_efficiency", "efficiency")
        if self.gemm_efficiency_fp8 is not None:
            _curve_rule(self.gemm_efficiency_fp8, "gemm_efficiency_fp8", "efficiency")
        if self.attention_length_curve is not None:
            _increasing_rule([k for k, _, _ in self.attention_length_curve],
                             "attention_length_curve: the points need strictly increasing keys")
            if not any(k == ATTENTION_REFERENCE_KEYS and f == 1 for k, f, _ in self.attention_length_curve):
                raise ValueError(f"attention_length_curve: the curve is relative to attention_efficiency, its forward "
                                 f"at {ATTENTION_REFERENCE_KEYS} keys, so it needs the point ({ATTENTION_REFERENCE_KEYS}, "
                                 "1, backward)")
        for kind, points in (self.fp8_attention_speed or {}).items():
            _increasing_rule([d for d, _, _ in points], f"fp8_attention_speed: the {kind} points need strictly "
                             "increasing head dims")
        return self


class PredictionError(_Spec):
    """How far predictions on this cluster are from measurements: the centre and spread of
    ln(measured / predicted), for step time and for peak memory (planner.uncertainty reads it)."""

    step_time_bias: _real(ge=-1, le=1) = 0.0
    """Median ln(measured / predicted step time)."""
    step_time_sigma: _real(gt=0, le=2)
    """Spread of that log ratio (a normal's sigma; the 80 % interval is bias ± 1.28 sigma)."""
    ranking_sigma: _real(gt=0, le=2) = 0.05
    """Spread of the log ratio between two layouts' errors on the same cluster and stack (their
    shared bias cancels): two layouts closer than 1.28 of it are called tied."""
    memory_bias: _real(ge=-1, le=1) = 0.0
    """Median ln(measured / predicted peak memory)."""
    memory_sigma: _real(gt=0, le=2)
    """Spread of that log ratio."""
    basis: str = Field(default="", max_length=400)
    """What the spread was measured on (shown beside the intervals)."""


class ClusterSpec(_Spec):
    """A GPU cluster: identical nodes, NVLink domains, a rail-optimised scale-out network."""

    name: Name
    """Catalog id."""
    gpu: GpuSpec
    """The GPU in every node."""
    gpus_per_node: _count(1024)
    """GPUs per node (per compute tray on GB200 NVL72)."""
    nvlink_domain_size: _count(2**16)
    """GPUs in one NVLink/NVSwitch domain; a multiple of gpus_per_node (72 on GB200 NVL72)."""
    num_nodes: PosInt = 1
    """Nodes in the cluster."""
    nvlink: LinkTier
    """Scale-up fabric."""
    scaleout: ScaleOut
    """Scale-out fabric."""
    memory_overhead: _quantity("bytes", ge=0, le=1e15)
    """Per-GPU memory outside the ledger (CUDA context, NCCL buffers, allocator fragmentation); 0 where
    `planner calibrate` found the logs' peaks (reserved by the allocator) already within the ledger."""
    calibration: Calibration
    """Fitted efficiency parameters."""
    host: HostSpec | None = None
    """The nodes' CPU memory and host links (None: unknown, and optimizer offload is refused)."""
    prediction_error: PredictionError | None = None
    """Measured error of predictions here (set by planner calibrate); None: the published-run
    residuals of this GPU generation (planner.uncertainty)."""
    sources: list[dict[str, Any]] = Field(default_factory=list, repr=False)
    """Where the numbers come from."""
    provenance: dict[str, str] = Field(default_factory=dict, repr=False)
    """Field path -> source id and locator."""

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        d, g = self.nvlink_domain_size, self.gpus_per_node
        if self.num_nodes * g > MAX_GPUS:
            raise ValueError(f"num_nodes: num_nodes({self.num_nodes})*gpus_per_node({g}) = {self.num_nodes * g} "
                             f"exceeds the {MAX_GPUS:,} GPUs the planner models")
        if self.memory_overhead >= self.gpu.memory:
            raise ValueError(f"memory_overhead: the overhead item ({self.memory_overhead / 2**30:.1f} GiB) must be "
                             f"smaller than gpu.memory ({self.gpu.memory / 2**30:.1f} GiB)")
        if d % g and g % d:
            raise ValueError(f"nvlink_domain_size: nvlink_domain_size ({d}) and gpus_per_node ({g}) must nest (one divides the other)")
        if d > g and (self.num_nodes * g) % d and self.num_nodes * g > d:
            raise ValueError(
                f"num_nodes: num_nodes*gpus_per_node ({self.num_nodes * g}) must be a multiple of nvlink_domain_size ({d}); "
                f"for a job on part of each NVLink domain give the GPUs it gets of one (nvlink_domain_size, the CLI's "
                f"--nvlink-domain), e.g. {max(k for k in range(g, d, g) if (self.num_nodes * g) % k == 0)}"
            )
        return self

    @property
    def world_size(self) -> int:
        """Total GPUs."""
        return self.num_nodes * self.gpus_per_node

    @property
    def usable_memory(self) -> float:
        """GPU memory minus the overhead item, bytes."""
        return self.gpu.memory - self.memory_overhead

    @property
    def host_memory_per_gpu(self) -> float | None:
        """Host memory one GPU's rank may fill with offloaded states: the node's, less its reserve,
        shared evenly by the node's GPUs (None without a host spec)."""
        return None if self.host is None else (self.host.memory - self.host.reserve) / self.gpus_per_node


@dataclass(frozen=True)
class MoERouting:
    """How an MoE layer's routed tokens fall on the busiest expert-parallel rank (TrainingSpec.moe_routing):
    its share of the mean (imbalance), capped per source rank and expert at the capacity factor where
    tokens are dropped, or exactly the capacity where inputs are padded to it."""

    imbalance: float = 1.0
    capacity_factor: float | None = None
    pad: bool = False

    @property
    def share(self) -> float:
        """The busiest rank's routed rows over the balanced mean, without padding: the imbalance,
        at most the capacity factor (each source rank sends an expert at most its capacity)."""
        return self.imbalance if self.capacity_factor is None else min(self.imbalance, self.capacity_factor)


BALANCED = MoERouting()
"""Dropless routing with the tokens balanced over the experts, as NVIDIA's benchmarks force it."""


FP8_ATTENTION_RECIPES = ("delayed", "tensorwise", "mxfp8")
"""The recipes megatron-core passes --fp8-dot-product-attention to (fp8_dpa) [megatron-core 0.19
fp8_utils.py: get_fp8_recipe]."""


class TrainingSpec(_Spec):
    """The workload: batch, sequence, precision and optimizer."""

    global_batch_size: _count(MAX_BATCH)
    """Sequences per optimizer step."""
    seq_length: _count(MAX_SEQ)
    """Tokens per sequence."""
    precision: Literal["bf16", "fp16"] = "bf16"
    """Mixed-precision compute dtype (parameters and activations)."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer; Adam keeps fp32 master weights, momentum and variance (12 bytes/param)."""
    grad_dtype: Literal["bf16", "fp32"] = "fp32"
    """Gradient buffer dtype: 'bf16' is the 16-bytes/param ledger; 'fp32' main grads (Megatron's default) is 18."""
    attention: Literal["flash", "eager"] = "flash"
    """Attention kernel: 'flash' stores no s^2 scores; 'eager' does."""
    kernels: Kernels = "fused"
    """'fused': Megatron/Transformer Engine fused norms and activations; 'unfused': PyTorch's own
    kernels as FSDP trainers run them (llm-foundry; torchtitan, whose compiled blocks it predicts:
    planner.torchtitan_engine.KERNELS)."""
    cross_entropy: Literal["fp32", "unfused", "fused", "te"] = "fp32"
    """The loss kernel: 'fp32' works on an FP32 copy of the logits (the engine's own loss as the planner
    launches it: megatron-core's fused vocab-parallel cross entropy under --cross-entropy-loss-fusion,
    Megatron-DeepSpeed's, torch's); 'unfused' is megatron-core's loss without that flag (Megatron-LM's
    default: the same bytes held, one pass per step; the Megatron launch files then leave the flag out);
    'fused' reads the BF16 logits and writes a BF16 gradient beside them
    (flash-attn's CrossEntropyLoss, llm-foundry's default loss_fn 'fused_crossentropy'); 'te' writes
    the gradient over the BF16 logits (Transformer Engine's parallel cross-entropy, which Megatron-
    Bridge's recipes turn on: cross_entropy_fusion_impl='te'). 'fused' and 'te' are priced, not
    emitted: the launch configs refuse them (megatron-core 0.19.2's validate_args rejects 'te')."""
    fp8: Fp8Recipe | None = None
    """FP8 linear layers: a Transformer Engine recipe as Megatron's --fp8-recipe names it
    (delayed, tensorwise, blockwise, mxfp8), or torchao's float8 as torchtitan runs it: 'rowwise'
    (its default since 2025) or 'torchao-tensorwise' (dynamic tensor-wise scaling, the only one
    before: its sequence-parallel all-gathers move FP8 [torchao float8/float8_tensor_parallel.py:
    Float8ColwiseParallel, Float8RowwiseParallel]), or 'torchao-mxfp8': torchao's MXFP8 linears and
    grouped experts on Blackwell (torchtitan 0.3's MXFP8LinearConverter and MXFP8GroupedExpertsConverter:
    E4M3 values, a scale per 32, RCEIL scales, cuBLAS's block-scaled GEMMs); 'nvfp4': Transformer Engine's NVFP4BlockScaling
    (E2M1 values, an E4M3 scale per 16, Blackwell; Megatron's --fp4-format e2m1 --fp4-recipe nvfp4);
    None = BF16/FP16 GEMMs. Attention, embedding and the LM head stay in `precision`."""
    optimizer_states: Literal["fp32", "bf16"] = "fp32"
    """Adam's states: 'fp32' (master weights, m, v: 12 B/param) or 'bf16': Megatron's precision-aware
    optimizer with BF16 moments (--use-precision-aware-optimizer --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16), 2 + 2 B, and FP32 master weights that Transformer Engine's FusedAdam
    stores as the 16 bits the BF16 weight lacks (store_param_remainders, 2 B) unless an FP8 recipe
    other than delayed makes Megatron keep them whole (4 B) [Megatron-LM@d98e8a6
    megatron/core/optimizer/__init__.py: use_precision_aware_optimizer; optimizer_config.py:
    store_param_remainders, use_precision_aware_optimizer_no_fp8_or_ds_fp8]."""
    fp8_param_gather: Bool = False
    """The linear weights are all-gathered in FP8: Megatron's --fp8-param-gather (kept as FP8 tensors,
    no BF16 copy beside them; the distributed optimizer gathers FP8) with a Transformer Engine
    recipe, or torchtitan's float8.enable_fsdp_float8_all_gather with 'torchao-tensorwise' (FSDP2
    gathers the FP8 cast of each shard [torchao float8/fsdp_utils.py: WeightWithDynamicFloat8CastTensor]).
    torchao's rowwise has none."""
    bf16_first_layers: _count(MAX_LAYERS, lo=0) = 0
    """Transformer layers at the start of the model whose linears stay in BF16 under the FP8/NVFP4
    recipe: Megatron's --first-last-layers-bf16 --num-layers-at-start-in-bf16 N (get_fp8_context /
    get_fp4_context return a null context for them) [Megatron-LM@d98e8a6 megatron/core/fp8_utils.py,
    fp4_utils.py]. Megatron-Bridge's bf16_with_fp8_current_scaling_mixed keeps 1 and 1; its
    performance recipes 0. Dense models, Transformer Engine recipes other than delayed; without a
    recipe (fp8=None) it has no effect."""
    bf16_last_layers: _count(MAX_LAYERS, lo=0) = 0
    """The same at the end of the model (--num-layers-at-end-in-bf16)."""
    fp8_attention: Bool = False
    """The attention core (QK^T, softmax, PV) runs Transformer Engine's FP8 fused attention too:
    TransformerConfig.fp8_dot_product_attention, which megatron-core hands to the delayed, tensorwise and
    mxfp8 recipes as fp8_dpa (blockwise and NVFP4 get none) [megatron-core 0.19 fp8_utils.py:
    get_fp8_recipe; extensions/transformer_engine.py: TEDelayedScaling] and Megatron-Bridge's MXFP8
    performance recipes turn on. Priced at the GPU's measured FP8 speed of that kernel
    (Calibration.fp8_attention_speed) with the casts of Q, K, V and of the output gradient; it saves
    Q, K, V (and under delayed scaling O) quantised (planner.memory.fp8_attention_relief). Layers kept
    in BF16 (bf16_first_layers / bf16_last_layers) attend in BF16. Priced, emitted by none: megatron-core
    0.19.2 gives it no command-line flag (arguments.py excludes it), so the Megatron launch refuses it."""
    optimizer_impl: Literal["megatron", "deepspeed", "fsdp2", "apex"] | None = None
    """Whose engine keeps the optimizer states and reduces the gradients: None or 'megatron' =
    Megatron's DDP and distributed optimizer (the ledger's 2 + 4 + 12 B/param, gradients reduced in
    grad_dtype in buckets of max(40M, 1M x dp) parameters); 'deepspeed' = DeepSpeed's engine as the
    DeepSpeed emitter configures it (planner.deepspeed_engine: the optimizer wrapper it builds, its
    500M-element reduce buckets, gradients reduced in the model dtype); 'fsdp2' = PyTorch FSDP2 as
    torchtitan applies it, for ZeRO-3 and for replication (ZeRO-0, a shard of one) alike: the FP32
    weight (shard) is Adam's master, 4 + 4 + 8 B/param, and the output layer's unit stays gathered
    with its BF16 gradient (planner.memory.stage_static_items, planner.torchtitan_engine); 'apex' = NeMo 1.x's
    distributed_fused_adam (Apex's DistributedFusedAdam as NeMo configures it, planner.apex_engine): the BF16
    weight, a contiguous gradient buffer in grad_dtype (FP32 for the embeddings and the output layer) with its
    reduced 1/dp shard beside it, and 2 + 4 + 4 B/param over dp (the master's 16-bit remainders, m, v; 4 + 4 + 4
    with fp8_param_gather or FP16), ZeRO-1 only, 125 MiB buckets; priced, emitted by none.
    A search for framework='deepspeed' or 'torchtitan' sets it."""
    optimizer_offload: _real(ge=0, le=1) = 0.0
    """Share of each rank's optimizer shard kept and stepped on the CPU: Megatron's
    --optimizer-cpu-offload --optimizer-offload-fraction F (with --use-precision-aware-optimizer,
    which it requires, and --overlap-cpu-optimizer-d2h-h2d). HybridDeviceOptimizer pins an FP32 copy
    of the first F of the shard's elements in host memory with torch's AdamW m and v and an FP32
    gradient (16 B per element), steps them with torch's fused CPU AdamW and keeps the rest on the
    GPU with Transformer Engine's FusedAdam over FP32 copies (12 B) [Megatron-LM@d98e8a6
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py: HybridDeviceOptimizer.
    _get_sub_optimizer_param_groups, _set_sub_optimizer_grads, step; optimizer/__init__.py:
    _get_megatron_optimizer_based_on_param_groups]. With optimizer_impl 'deepspeed', ZeRO-Offload:
    DeepSpeed's ZeRO optimizer keeps the whole partition on the host (1 only) and steps it with
    DeepSpeedCPUAdam (planner.deepspeed_engine: [Offload] for ZeRO-1/2, with FP32 gradient accumulation,
    [Offload3] for ZeRO-3, whose gradient partition lives on the host in either dtype; the rules below
    and planner.space.offload_zero_stages). With 'fsdp2', torchtitan's training.enable_cpu_offload: FSDP2 keeps the
    shard's FP32 parameters, gradients and AdamW states on the host and steps them there
    (planner.torchtitan_engine [Offload]; 1 only, ZeRO-3 without PP). 0 = off. Megatron's
    distributed optimizer (ZeRO-1), DeepSpeed's ZeRO-1/2/3 or FSDP2, FP32 Adam states, and a cluster
    with a host spec."""
    moe_imbalance: _real(ge=1, le=64) = 1.0
    """MoE only: routed tokens on the busiest expert-parallel rank over the mean. 1 = balanced, as
    NVIDIA's benchmarks force it (--moe-router-force-load-balancing); the busiest rank's grouped
    GEMMs, receive buffers and all-to-all set each layer's pace, so all three scale with it."""
    moe_capacity_factor: _real(gt=0, le=64) | None = None
    """MoE only: Megatron's --moe-expert-capacity-factor c (token dropping). Each rank lets each expert
    take at most ceil(N top_k / E x c) of its N tokens' assignments and drops the rest, the lowest
    probabilities first (--moe-token-drop-policy probs, the default) [megatron-core 0.19.2
    transformer/moe/moe_utils.py: get_capacity, apply_router_token_dropping; router.py:
    TopKRouter.routing]. None: dropless, Megatron's default. A training choice (it changes what the
    model learns), so it is the user's to set, never searched."""
    moe_pad_to_capacity: bool = False
    """MoE only, with moe_capacity_factor: Megatron's --moe-pad-expert-input-to-capacity. Every rank
    sends each expert exactly its capacity rows, padded, and every expert computes them, whatever
    the routing [token_dispatcher.py: MoEAlltoAllTokenDispatcher.preprocess and
    MoEFlexTokenDispatcher's drop_and_pad]."""
    token_budget: _real(gt=0, le=1e18) | None = None
    """Tokens to train on, for time-to-train (optional)."""
    loss_chunks: _count(64) = 1
    """Sequence chunks the output layer and the loss run in, one after the other, each chunk's
    logits freed by its own backward: torchtitan 0.3's ChunkedLossWrapper, 8 in its registry configs
    (planner.torchtitan_engine [Loss]; framework='torchtitan' sets it). 1 = the whole sequence at
    once, as Megatron, DeepSpeed and older torchtitan compute it."""
    document_tokens: _count(MAX_SEQ) | None = None
    """Where attention is masked per packed document, as torchtitan 0.3 always does (block-causal
    FlexAttention over the documents its dataloader packs: models/common/config_utils.py:
    get_attention_config), the length of a token's document, averaged over tokens (sum d^2 / sum d
    over the documents, each cut at seq_length): attention is priced as seq_length / d causal blocks
    of d tokens (planner.cost.computed_score_share). None: causal over the whole sequence, as
    Megatron and DeepSpeed attend (an upper bound for torchtitan). Priced, emitted by none: the
    Megatron and DeepSpeed launch configs refuse it; torchtitan's needs no flag."""

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        n = self.global_batch_size * self.seq_length
        if n > MAX_TOKENS_PER_STEP:
            raise ValueError(f"global_batch_size: global_batch_size({self.global_batch_size})*seq_length"
                             f"({self.seq_length}) = {n:,} tokens per step exceeds {MAX_TOKENS_PER_STEP:,}")
        if self.fp8_param_gather and self.fp8 == "nvfp4":
            raise ValueError("fp8_param_gather: NVFP4 weights gathered in FP4 (Megatron's --fp4-param-gather) are not "
                             "priced; drop fp8_param_gather with fp8='nvfp4'")
        if self.fp8_param_gather and self.fp8 in (None, "rowwise", "torchao-mxfp8"):
            raise ValueError(f"fp8_param_gather: needs a Transformer Engine FP8 recipe (delayed, tensorwise, blockwise, "
                             f"mxfp8) or torchao-tensorwise, got fp8={self.fp8!r}")
        if self.optimizer_offload:
            if self.optimizer_states != "fp32":
                # HybridDeviceOptimizer builds its Adams without exp_avg_dtype: FP32 m and v on both sides
                raise ValueError("optimizer_offload: Megatron's offloaded optimizer keeps FP32 Adam states; "
                                 f"optimizer_states={self.optimizer_states!r} is not what it runs")
            if self.optimizer_impl == "fsdp2" and self.optimizer_offload != 1:
                # CPUOffloadPolicy moves every shard: parameters, gradients and optimizer states
                raise ValueError(f"optimizer_offload: FSDP2's CPU offload keeps the whole shard on the host (1), "
                                 f"got {self.optimizer_offload:g}")
            if self.optimizer_impl == "deepspeed" and self.optimizer_offload != 1:
                # offload_optimizer.ratio (stage 3's partial offload) is not priced
                raise ValueError(f"optimizer_offload: DeepSpeed's ZeRO offload is priced for the whole optimizer partition "
                                 f"(1), got {self.optimizer_offload:g}")
            if self.fp8_param_gather and self.fp8 != "delayed":
                # megatron/training/arguments.py: validate_args, "Optimizer CPU offload check"
                raise ValueError("optimizer_offload: with fp8_param_gather Megatron offloads the optimizer only "
                                 f"under the delayed recipe, got fp8={self.fp8!r}")
        if self.optimizer_impl == "apex":
            if self.optimizer_states != "fp32" or self.optimizer_offload:
                # DistributedFusedAdam keeps FP32 m and v (NeMo's optimizer dtype) on the GPU
                raise ValueError("optimizer_impl: 'apex' (NeMo's distributed_fused_adam) keeps FP32 Adam states on the "
                                 f"GPU; optimizer_states={self.optimizer_states!r} and optimizer_offload="
                                 f"{self.optimizer_offload:g} are not what it runs")
            if self.fp8 not in (None, "delayed"):
                raise ValueError(f"optimizer_impl: 'apex' is NeMo 1.x's optimizer, whose FP8 is Transformer Engine's "
                                 f"delayed scaling; fp8={self.fp8!r} is not priced on it")
        if self.cross_entropy == "unfused" and self.optimizer_impl in ("deepspeed", "fsdp2"):
            raise ValueError(f"cross_entropy: 'unfused' is megatron-core's loss without --cross-entropy-loss-fusion; "
                             f"the {self.optimizer_impl} engine runs its own (use 'fp32')")
        if self.seq_length % self.loss_chunks:
            raise ValueError(f"loss_chunks: seq_length ({self.seq_length}) must divide into {self.loss_chunks} chunks")
        if self.document_tokens is not None:
            if self.document_tokens > self.seq_length:
                raise ValueError(f"document_tokens: a document is cut at seq_length ({self.seq_length}), got "
                                 f"{self.document_tokens}")
            if self.attention != "flash":
                raise ValueError("document_tokens: needs attention='flash' (an eager kernel computes the whole score "
                                 "matrix, masked or not)")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            # megatron-core 0.19.2 transformer_config.py: TransformerConfig.__post_init__
            raise ValueError("moe_pad_to_capacity: needs moe_capacity_factor (Megatron pads each expert's input to "
                             "its capacity)")
        if self.fp8_attention:
            if self.fp8 not in FP8_ATTENTION_RECIPES:
                raise ValueError(f"fp8_attention: Megatron runs FP8 attention under the delayed, tensorwise or mxfp8 "
                                 f"recipe (fp8_dpa), got fp8={self.fp8!r}")
            if self.attention != "flash" or self.kernels != "fused":
                raise ValueError("fp8_attention: Transformer Engine's fused attention only (attention='flash', "
                                 "kernels='fused')")
        if self.bf16_first_layers or self.bf16_last_layers:  # no effect without a recipe, as in Megatron
            field = "bf16_first_layers" if self.bf16_first_layers else "bf16_last_layers"
            if self.fp8 not in (None, "tensorwise", "blockwise", "mxfp8", "nvfp4"):
                # megatron-core TransformerConfig.__post_init__: "Delayed scaling does not support first /
                # last layer in BF16"; torchao's float8 has no such option
                raise ValueError(f"{field}: BF16 first/last layers need a Transformer Engine recipe other than "
                                 f"delayed (tensorwise, blockwise, mxfp8, nvfp4), got fp8={self.fp8!r}")
        return self

    @property
    def moe_routing(self) -> MoERouting:
        """How the routed tokens fall on the busiest expert rank (MoERouting)."""
        return MoERouting(self.moe_imbalance, self.moe_capacity_factor, self.moe_pad_to_capacity)

    @property
    def bf16_end_layers(self) -> tuple[int, int]:
        """(first, last) layers kept in BF16 that take effect: (0, 0) without a low-precision recipe."""
        return (0, 0) if self.fp8 is None else (self.bf16_first_layers, self.bf16_last_layers)


class Layout(_Spec):
    """A parallel layout: degrees, sharding, micro-batch and recomputation."""

    tp: PosInt = 1
    """Tensor-parallel degree."""
    pp: PosInt = 1
    """Pipeline-parallel degree."""
    dp: PosInt = 1
    """Data-parallel degree."""
    cp: PosInt = 1
    """Context-parallel degree."""
    ep: PosInt = 1
    """Expert-parallel degree (MoE): the routed experts of each layer split over ep GPUs (Megatron
    --expert-model-parallel-size). The expert grid etp x ep x edp folds onto the same tp x cp x dp
    GPUs of each pipeline stage."""
    etp: PosInt | None = None
    """Expert tensor-parallel degree (--expert-tensor-parallel-size); None = tp, Megatron's default."""
    moe_dispatcher: Literal["alltoall", "allgather", "deepep"] = "alltoall"
    """MoE token dispatcher: Megatron's all-to-all (NCCL; stock Megatron + Transformer Engine), its
    all-gather (Megatron's default: every token gathered over the etp x ep group, each rank keeping its
    experts' rows, the outputs reduce-scattered back), or its flex dispatcher with the DeepEP backend
    (needs the deep_ep package), which sends a token once to each remote node its experts sit on and
    forwards it over NVLink there."""
    zero_stage: _count(3, lo=0) = 0
    """ZeRO stage: 1 shards optimizer states, 2 also grads, 3 also params (over dp*cp ranks)."""
    micro_batch_size: _count(MAX_BATCH) = 1
    """Sequences per micro-batch per model replica."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation granularity."""
    recompute_num_layers: _count(MAX_LAYERS, lo=0) | None = None
    """With full recompute: layers per pipeline stage that are recomputed (None = all)."""
    recompute_modules: Annotated[tuple[Literal[RECOMPUTE_MODULES], ...], BeforeValidator(_module_set),
                                 Field(min_length=1)] | None = None
    """With selective recompute: Megatron's --recompute-modules (RECOMPUTE_MODULES); None is Megatron's
    default, the attention core alone."""
    vpp: _count(MAX_LAYERS) = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; 1 = plain 1F1B."""
    sequence_parallel: Bool = False
    """Megatron sequence parallelism (needs tp > 1)."""
    first_stage_layers: _count(MAX_LAYERS) | None = None
    """Layers on the first pipeline stage when uneven (None = even split)."""
    last_stage_layers: _count(MAX_LAYERS) | None = None
    """Layers on the last pipeline stage when uneven (None = even split)."""
    pipeline_layers: tuple[_count(MAX_LAYERS, lo=0), ...] | None = None
    """Any split: decoder layers of each virtual stage in Megatron's order (stage i on pipeline
    rank i % pp, chunk i // pp; pp * vpp entries summing to num_layers), the embedding on the first
    and the loss on the last (Megatron --pipeline-model-parallel-layout). None: even, or the
    first/last fields."""
    rank_order: Literal["tp-cp-dp-pp", "tp-cp-pp-dp"] = "tp-cp-dp-pp"
    """Rank placement, innermost axis first: Megatron's default, or its --use-tp-pp-dp-mapping."""
    overlap_grad_reduce: Bool = False
    """Gradient buckets are reduced during backward as they fill (Megatron --overlap-grad-reduce,
    DeepSpeed overlap_comm, PyTorch DDP's buckets); off: one collective after backward (Megatron's default)."""
    overlap_param_gather: Bool = False
    """With the distributed optimizer (ZeRO-1/2): the updated parameters are all-gathered bucket by
    bucket during the next forward (Megatron --overlap-param-gather); off: after the optimizer step."""
    tp_comm_overlap: Bool = False
    """Megatron --tp-comm-overlap (Transformer Engine userbuffers, needs sequence parallelism): each
    sequence-parallel all-gather / reduce-scatter runs beside the GEMM it feeds or follows."""
    ep_overlap: Bool = False
    """MoE: Megatron's --overlap-moe-expert-parallel-comm (combined 1F1B): one micro-batch's forward
    runs beside another's backward layer by layer, each dispatch / combine all-to-all beside the
    other's attention or expert compute; the first forward and the last backward run alone, and
    one more micro-batch (pp = 1) or model chunk (interleaved) of activations is in flight. Needs
    ep > 1, no full recompute and, with pp > 1, interleaving."""
    overlap_p2p: Bool | None = None
    """Interleaved 1F1B: pipeline sends and receives run beside the next chunk's compute. None is
    Megatron's default (megatron-core 0.19.2 arguments.py: on for interleaved schedules, which
    --no-overlap-p2p-communication turns off; forced off without interleaving)."""

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.recompute_modules is not None and self.recompute != Recompute.SELECTIVE:
            raise ValueError(f"recompute_modules: needs recompute='selective' (got recompute='{self.recompute.value}')")
        return self

    @property
    def recomputed_modules(self) -> tuple[str, ...]:
        """What selective recompute re-runs: recompute_modules, or Megatron's default ('core_attn',);
        () for any other granularity."""
        if self.recompute != Recompute.SELECTIVE:
            return ()
        return self.recompute_modules or ("core_attn",)

    @property
    def p2p_overlapped(self) -> bool:
        """Whether pipeline p2p overlaps compute: only with interleaving, on unless turned off."""
        return self.vpp > 1 and self.overlap_p2p is not False

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree in effect: etp, else tp (Megatron's default)."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: tp*cp*dp / (ep*etp), the ranks that hold the same experts
        (megatron-core parallel_state.initialize_model_parallel: expert_data_parallel_size)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def model_parallel(self) -> int:
        """GPUs in one model replica: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        """GPUs the layout occupies: tp * pp * dp * cp."""
        return self.tp * self.pp * self.dp * self.cp

    def short(self) -> str:
        """Compact one-line description."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}", f"cp{self.cp}", f"zero{self.zero_stage}",
                 f"mbs{self.micro_batch_size}", f"rc={self.recompute.value}"]
        if self.recompute == Recompute.FULL and self.recompute_num_layers is not None:
            parts[-1] += f"({self.recompute_num_layers})"
        if self.recompute_modules is not None and self.recompute_modules != ("core_attn",):
            parts[-1] += f"({','.join(self.recompute_modules)})"
        if self.ep > 1 or self.etp is not None:
            parts.insert(4, f"ep{self.ep}" + (f" etp{self.etp}" if self.etp is not None else "")
                         + ("" if self.moe_dispatcher == "alltoall" else f" {self.moe_dispatcher}"))
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.first_stage_layers or self.last_stage_layers:
            parts.append(f"stages={self.first_stage_layers or '-'}/{self.last_stage_layers or '-'}")
        if self.pipeline_layers is not None:
            parts.append("split=" + "|".join(map(str, self.pipeline_layers)))
        if self.rank_order != "tp-cp-dp-pp":
            parts.append(f"order={self.rank_order}")
        if self.vpp > 1 and not self.p2p_overlapped:
            parts.append("p2p=exposed")
        if self.overlap_grad_reduce or self.overlap_param_gather or self.tp_comm_overlap or self.ep_overlap:
            parts.append("ov=" + "+".join(x for x, on in (("tp", self.tp_comm_overlap), ("ep", self.ep_overlap),
                                                         ("grad", self.overlap_grad_reduce),
                                                         ("param", self.overlap_param_gather)) if on))
        return " ".join(parts)


def num_microbatches(training: TrainingSpec, layout: Layout) -> int:
    """m = global batch / (dp * micro-batch) (floor; planner.space requires exact division)."""
    return training.global_batch_size // (layout.dp * layout.micro_batch_size)
