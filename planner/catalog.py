"""Catalog lookup: models and clusters by id, YAML path, or Hugging Face config.json."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import CatalogError, ConfigImportError
from planner.outputs import shown_path
from planner.specs import ClusterSpec, ModelSpec

__all__ = ["load_model", "load_cluster", "model_ids", "cluster_ids", "catalog_dir", "model_from_hf_config"]


def catalog_dir(kind: str) -> Path:
    """The folder holding the `kind` ('models' or 'clusters') catalog, installed or in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data" / kind, here.parent / kind):
        if candidate.is_dir():
            return candidate
    raise CatalogError(f"catalog folder '{kind}' not found next to the planner package")


def model_ids() -> list[str]:
    """Ids of the built-in models."""
    return sorted(p.stem for p in catalog_dir("models").glob("*.yaml"))


def cluster_ids() -> list[str]:
    """Ids of the built-in clusters."""
    return sorted(p.stem for p in catalog_dir("clusters").glob("*.yaml"))


MAX_FILE_BYTES = 1 << 20
"""Model, cluster and config.json files larger than 1 MiB are refused (real ones are a few KiB)."""


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys and aliases (a spec has neither; both hide mistakes)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the spec's own validation names it
            if key in seen:
                raise CatalogError(f"duplicate key '{key}' (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise CatalogError(f"YAML aliases (*{event.anchor}) are not accepted (line {event.start_mark.line + 1})")
        return super().compose_node(parent, index)


def _read_text(path: Path) -> str:
    """The file's text: UTF-8, at most MAX_FILE_BYTES, every failure one CatalogError line."""
    try:
        if not path.is_file():
            raise CatalogError(f"{shown_path(path)}: no such file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise CatalogError(f"{shown_path(path)}: larger than {MAX_FILE_BYTES // 2**10} KiB; not a spec file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CatalogError(f"{shown_path(path)}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise CatalogError(f"{shown_path(path)}: cannot read ({err.strerror or err})") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except CatalogError as err:
        raise CatalogError(f"{path.name}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise CatalogError(f"{shown_path(path.name)}: not valid YAML{where}") from None
    except RecursionError:
        raise CatalogError(f"{shown_path(path.name)}: nested too deeply to be a spec") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{shown_path(path.name)}: expected a mapping of fields at the top level")
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigImportError(f"duplicate key '{k}'")
        out[k] = v
    return out


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ConfigImportError(f"{shown_path(path.name)}: not valid JSON (line {err.lineno}: {err.msg})") from None
    except ConfigImportError as err:
        raise ConfigImportError(f"{shown_path(path.name)}: {err}") from None
    except RecursionError:
        raise ConfigImportError(f"{shown_path(path.name)}: nested too deeply to be a config.json") from None


def _unknown(kind: str, ref: str, ids: list[str]) -> CatalogError:
    close = difflib.get_close_matches(ref[:200], ids, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(ids)}"
    short = ref if len(ref) <= 120 else ref[:60] + "..." + ref[-40:]
    return CatalogError(f"unknown {kind} {short!r}{hint}")  # repr: quoted, control characters escaped


@cache
def _catalog_model(ref: str) -> ModelSpec:
    return ModelSpec.load(_read_yaml(catalog_dir("models") / f"{ref}.yaml"), f"models/{ref}.yaml")


def load_model(ref: str | Path | ModelSpec) -> ModelSpec:
    """Load a model by catalog id, YAML file, or Hugging Face config.json.

    Args:
        ref: a catalog id ('llama3-70b'), a path to a YAML spec, or a path to a config.json.

    Returns:
        The validated ModelSpec.

    Raises:
        CatalogError: unknown id or unreadable file (with the closest ids).
        SpecError: a field breaks a rule.
        ConfigImportError: a malformed or unsupported config.json.
    """
    if isinstance(ref, ModelSpec):
        return ref
    if not isinstance(ref, (str, Path)):
        raise CatalogError(f"model: expected a catalog id, a file path or a ModelSpec, got {type(ref).__name__}")
    text = str(ref)
    if "\x00" in text:
        raise CatalogError(f"model {shown_path(text)}: a name or path cannot contain NUL")
    path = Path(text)
    if text in model_ids():
        return _catalog_model(text)
    if path.suffix == ".json":
        data = _read_json(path)
        name = path.resolve().parent.name or path.stem
        return model_from_hf_config(data, name=name)
    if path.suffix in (".yaml", ".yml"):
        return ModelSpec.load(_read_yaml(path), path.name)
    raise _unknown("model", text, model_ids())


def load_cluster(ref: str | Path | ClusterSpec, nodes: int | None = None, **overrides: Any) -> ClusterSpec:
    """Load a cluster by catalog id or YAML path, optionally with a node count and field overrides.

    Args:
        ref: a catalog id ('dgx-h100') or a YAML path.
        nodes: number of nodes (defaults to the catalog's).
        **overrides: top-level fields to replace, e.g. memory_overhead="4 GiB".

    Raises:
        CatalogError: unknown id or unreadable file.
        SpecError: a field breaks a rule.
    """
    if isinstance(ref, ClusterSpec):
        data = ref.model_dump()
        where = ref.name
    elif not isinstance(ref, (str, Path)):
        raise CatalogError(f"cluster: expected a catalog id, a file path or a ClusterSpec, got {type(ref).__name__}")
    else:
        text = str(ref)
        if "\x00" in text:
            raise CatalogError(f"cluster {shown_path(text)}: a name or path cannot contain NUL")
        path = Path(text)
        if text in cluster_ids():
            path, where = catalog_dir("clusters") / f"{text}.yaml", f"clusters/{text}.yaml"
        elif path.suffix in (".yaml", ".yml"):
            where = path.name
        else:
            raise _unknown("cluster", text, cluster_ids())
        data = _read_yaml(path)
    if nodes is not None:
        data["num_nodes"] = nodes
    data.update(overrides)
    return ClusterSpec.load(data, where)


# Hugging Face architectures -> how to read their config.json
_LLAMA_LIKE = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
_MOE_LIKE = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM",
             "Llama4ForCausalLM"}  # llama layers with gated experts
_GPT_LIKE = {"GPT2LMHeadModel", "GPTNeoXForCausalLM"}
_MLA_LIKE = {"DeepseekV3ForCausalLM"}  # DeepSeek-V3, Kimi-K2: MLA, shared experts, leading dense layers
_HYBRID_LIKE = {"NemotronHForCausalLM"}  # Nemotron-H, Nemotron-3: Mamba-2, attention, MLP and MoE layers


def _need(cfg: dict[str, Any], key: str, name: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigImportError(f"{name}: config.json has no '{key}'")
    return cfg[key]


# Keys that make a config something the dense llama/gpt families cannot describe. A value that
# switches the feature on is refused, never dropped (the model would be priced as another model).
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "n_shared_experts", "moe_layer_freq", "expert_interval")
_SHAPE_FLAGS = {"mlp_bias": "MLP biases", "use_parallel_residual": None, "qk_layernorm": "Q/K normalisation",
                "use_qk_norm": "Q/K normalisation", "q_lora_rank": "multi-latent attention",
                "kv_lora_rank": "multi-latent attention"}


def _positive_int(v: Any, key: str, name: str, zero: bool = False) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if zero else 1):
        raise ConfigImportError(f"{name}: {key} = {v!r}: expected a {'non-negative' if zero else 'positive'} integer")


def _moe_of(cfg: dict[str, Any], arch: str, name: str) -> dict[str, Any]:
    """The MoE fields of a Mixtral, Qwen2-MoE or Qwen3-MoE config (Qwen2-MoE's gated shared expert).
    Qwen's decoder_sparse_step n makes layers n - 1, 2n - 1, ... MoE and the others dense
    [transformers models/qwen2_moe, qwen3_moe: DecoderLayer, (layer_idx + 1) % decoder_sparse_step
    == 0]: MoESpec.layer_step; mlp_only_layers (dense layers by index) is refused."""
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM"):
        return dict(num_experts=_need(cfg, "num_local_experts", name), top_k=_need(cfg, "num_experts_per_tok", name),
                    expert_ffn_hidden_size=_need(cfg, "intermediate_size", name))
    step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
    if dense:
        raise ConfigImportError(f"{name}: mlp_only_layers = {dense!r}: dense layers chosen by index are not modelled "
                                "(refused rather than counted as MoE)")
    _positive_int(step, "decoder_sparse_step", name)
    moe = dict(num_experts=_need(cfg, "num_experts", name), top_k=_need(cfg, "num_experts_per_tok", name),
               expert_ffn_hidden_size=_need(cfg, "moe_intermediate_size", name), layer_step=step)
    if arch == "Qwen2MoeForCausalLM":  # one gated shared expert [transformers models/qwen2_moe:
        # Qwen2MoeSparseMoeBlock.shared_expert, shared_expert_gate = Linear(hidden, 1, bias=False)]
        moe.update(shared_expert_ffn_hidden_size=_need(cfg, "shared_expert_intermediate_size", name),
                   shared_expert_gate=True)
    return moe


def _deepseek_v3_of(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """A DeepseekV3ForCausalLM config (DeepSeek-V3, Kimi-K2): multi-latent attention, first_k_dense_replace
    dense layers, then MoE layers with n_shared_experts shared experts of moe_intermediate_size
    [transformers models/deepseek_v3: DeepseekV3Config; DeepseekV3Attention, DeepseekV3MoE]. Its group-limited
    top-k (n_group, topk_group) is kept: it caps the nodes DeepEP sends a token to; the rest of its routing
    policy (sigmoid scores, routed_scaling_factor) moves no cost term the planner prices with balanced
    routing (TrainingSpec.moe_imbalance); its multi-token prediction depths (num_nextn_predict_layers,
    DeepSeek-V3's 1) become ModelSpec.mtp_layers, trained as the model was; MoE layers between dense
    ones are refused."""
    mtp = cfg.get("num_nextn_predict_layers") or 0
    _positive_int(mtp, "num_nextn_predict_layers", name, zero=True)
    if cfg.get("moe_layer_freq", 1) != 1:
        raise ConfigImportError(f"{name}: moe_layer_freq = {cfg['moe_layer_freq']!r}: dense layers between MoE layers "
                                "are not modelled")
    if cfg.get("attention_bias"):
        raise ConfigImportError(f"{name}: attention_bias = true with multi-latent attention is not modelled")
    e = _need(cfg, "moe_intermediate_size", name)
    groups = cfg.get("n_group") or 1  # group-limited routing (DeepSeek-V3: 8 groups, 4 per token); 1 = none
    limited = dict(router_groups=groups, router_group_topk=_need(cfg, "topk_group", name)) if groups > 1 else {}
    return dict(
        mtp_layers=mtp,
        moe=dict(num_experts=_need(cfg, "n_routed_experts", name), top_k=_need(cfg, "num_experts_per_tok", name),
                 expert_ffn_hidden_size=e, shared_expert_ffn_hidden_size=(cfg.get("n_shared_experts") or 0) * e,
                 first_dense_layers=cfg.get("first_k_dense_replace") or 0, **limited),
        mla=dict(q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=_need(cfg, "kv_lora_rank", name),
                 qk_head_dim=_need(cfg, "qk_nope_head_dim", name), qk_rope_head_dim=_need(cfg, "qk_rope_head_dim", name),
                 v_head_dim=_need(cfg, "v_head_dim", name)))


def _llama4_of(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """A Llama4ForCausalLM (llama4_text) config: dense layers of intermediate_size_mlp between MoE
    layers of num_local_experts experts of intermediate_size (top num_experts_per_tok) beside one
    shared expert of the same width, every interleave_moe_layer_step-th layer MoE (its moe_layers),
    and attention_chunk_size-token chunks on the RoPE layers [transformers models/llama4:
    Llama4TextConfig (moe_layers, no_rope_layers), Llama4TextDecoderLayer, Llama4TextMoe
    (shared_expert), Llama4TextAttention]. The NoPE layers differ in no parameter or FLOP."""
    layers, step = _need(cfg, "num_hidden_layers", name), cfg.get("interleave_moe_layer_step", 1)
    _positive_int(step, "interleave_moe_layer_step", name)
    moe_layers = cfg.get("moe_layers")
    if moe_layers is not None and list(moe_layers) != list(range(step - 1, layers, step)):
        raise ConfigImportError(f"{name}: moe_layers = {moe_layers!r} is not every interleave_moe_layer_step-th layer; "
                                "other patterns are not modelled")
    e = _need(cfg, "intermediate_size", name)
    return dict(ffn_hidden_size=_need(cfg, "intermediate_size_mlp", name), attention_chunk=cfg.get("attention_chunk_size"),
                moe=dict(num_experts=_need(cfg, "num_local_experts", name), top_k=_need(cfg, "num_experts_per_tok", name),
                         expert_ffn_hidden_size=e, shared_expert_ffn_hidden_size=e, layer_step=step))


def _gpt_oss_attention(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """GPT-OSS's layers: biased linears, a learnable sink per head, the clamped quick-GELU GLU, and a
    window on the layers layer_types marks sliding ('full_attention' every n-th layer, 1-based, as
    Megatron's --window-attn-skip-freq n) [transformers models/gpt_oss: GptOssConfig.layer_types,
    GptOssAttention.sinks, GptOssExperts limit 7.0]."""
    if cfg.get("swiglu_limit", 7.0) != 7.0:
        raise ConfigImportError(f"{name}: swiglu_limit = {cfg['swiglu_limit']!r}; only GPT-OSS's clamp of 7.0 is emitted")
    window = _need(cfg, "sliding_window", name)
    kinds = cfg.get("layer_types") or ["sliding_attention", "full_attention"] * (_need(cfg, "num_hidden_layers", name) // 2)
    full = [i + 1 for i, k in enumerate(kinds) if k == "full_attention"]
    every = full[0] if full else None
    if any(k not in ("sliding_attention", "full_attention") for k in kinds) or (
            full and full != list(range(every, len(kinds) + 1, every))):
        raise ConfigImportError(f"{name}: layer_types is not every n-th layer full and the rest sliding; "
                                "other attention patterns are not modelled")
    return dict(sliding_window=window, full_attention_every=every, attention_sinks=True,
                linear_bias=bool(cfg.get("attention_bias", True)), activation="clamped-quick-geglu")


def _nemotron_h_of(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """A NemotronHForCausalLM config (Nemotron-H, Nemotron-3 Nano), read with the names Megatron-Bridge maps
    to Megatron's [NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py:
    NemotronHBridge.CONFIG_MAPPING, provider_bridge; models/conversion/model_bridge.py: CONFIG_MAPPING]: the
    layers from hybrid_override_pattern, the Mamba-2 mixer from mamba_num_heads, mamba_head_dim,
    ssm_state_size and n_groups, experts from n_routed_experts, num_experts_per_tok, moe_intermediate_size and
    moe_shared_expert_intermediate_size; squared-ReLU MLPs and no position embedding, as the bridge sets them.
    Refused rather than priced as another model: another activation (mlp_hidden_act), a convolution other
    than Megatron's 4 taps (conv_kernel), biases (use_bias). LatentMoE's moe_latent_size becomes
    MoESpec.latent_size; num_nextn_predict_layers MTP depths become mtp_layers where their
    mtp_hybrid_override_pattern is one transformer layer ('*E' with experts, '*-' without: Nemotron-3
    Super's), any other depth pattern is refused. The config's depths are blocks of their own weights;
    a recipe that repeats one block (Megatron --mtp-use-repeated-layer) sets mtp_shared itself."""
    pattern = _need(cfg, "hybrid_override_pattern", name)
    if not isinstance(pattern, str):
        raise ConfigImportError(f"{name}: hybrid_override_pattern = {pattern!r}: expected a string of M, *, - and E")
    for key, ok, what in (("mlp_hidden_act", ("relu2",), "an activation other than squared ReLU"),
                          ("conv_kernel", (4,), "a Mamba convolution other than Megatron's 4 taps"),
                          ("use_bias", (False, None), "linear biases")):
        if cfg.get(key, ok[0]) not in ok:
            raise ConfigImportError(f"{name}: {key} = {cfg[key]!r} ({what}) is not modelled; refused rather than ignored")
    mtp = cfg.get("num_nextn_predict_layers") or 0
    depth = "*E" if "E" in pattern else "*-"
    if mtp and cfg.get("mtp_hybrid_override_pattern") != depth:
        raise ConfigImportError(f"{name}: mtp_hybrid_override_pattern = {cfg.get('mtp_hybrid_override_pattern')!r}: an MTP "
                                f"depth other than one transformer layer ({depth!r}) is not modelled; refused rather than ignored")
    spec: dict[str, Any] = dict(
        layer_pattern=pattern, position_embedding="none", activation="squared-relu", mtp_layers=mtp,
        mamba=dict(num_heads=_need(cfg, "mamba_num_heads", name), head_dim=_need(cfg, "mamba_head_dim", name),
                   state_dim=_need(cfg, "ssm_state_size", name), num_groups=_need(cfg, "n_groups", name))
        if "M" in pattern else None)
    if "E" in pattern:
        groups = cfg.get("n_group") or 1  # 1 = every expert open to every token
        limited = dict(router_groups=groups, router_group_topk=_need(cfg, "topk_group", name)) if groups > 1 else {}
        spec["moe"] = dict(num_experts=_need(cfg, "n_routed_experts", name), top_k=_need(cfg, "num_experts_per_tok", name),
                           expert_ffn_hidden_size=_need(cfg, "moe_intermediate_size", name),
                           shared_expert_ffn_hidden_size=cfg.get("moe_shared_expert_intermediate_size") or 0,
                           latent_size=cfg.get("moe_latent_size") or None, **limited)
    return spec


def _window_of(cfg: dict[str, Any], arch: str, name: str) -> dict[str, Any]:
    """A Mistral config's window applies to every layer [HF MistralConfig.sliding_window]; Qwen2's
    use_sliding_window (windows only above max_window_layers) is refused."""
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") and cfg.get("use_sliding_window"):
        raise ConfigImportError(f"{name}: use_sliding_window = true (Qwen2's windows above max_window_layers) is not "
                                "modelled; refused rather than priced as full attention")
    w = cfg.get("sliding_window") if arch == "MistralForCausalLM" else None
    return {"sliding_window": w} if w else {}


def _refuse_unmodelled(cfg: dict[str, Any], name: str, moe: bool = False, mla: bool = False) -> None:
    for key in () if moe else _MOE_KEYS:
        v = cfg.get(key)
        if v not in (None, 0, 1, False, [], {}):
            raise ConfigImportError(f"{name}: '{key}' = {v!r} makes this a Mixture-of-Experts model, which this "
                                    "architecture does not build (refused rather than priced as a dense model)")
    for key, what in _SHAPE_FLAGS.items():
        if mla and key in ("q_lora_rank", "kv_lora_rank"):
            continue
        v = cfg.get(key)
        if what and v not in (None, 0, False):
            raise ConfigImportError(f"{name}: '{key}' = {v!r} ({what}) is not modelled; refused rather than ignored")


def model_from_hf_config(cfg: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json mapping.

    Supports Llama, Mistral and Qwen2 (llama family), Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS and Llama-4's
    text model (llama family with gated experts; GPT-OSS with its windows, sinks and biases, Llama-4 with
    dense layers between MoE ones and chunked attention), DeepSeek-V3's architecture
    (DeepSeek-V3, Kimi-K2: multi-latent attention, shared experts), Nemotron-H's hybrid Mamba-2 layers
    (Nemotron-3 Nano), GPT-2 and GPT-NeoX (gpt family).

    Raises:
        ConfigImportError: not a mapping, no or unsupported architecture, or a missing key.
    """
    if not isinstance(cfg, dict):
        raise ConfigImportError(f"{name}: config.json must be a JSON object")
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch == "Llama4ForConditionalGeneration":
        raise ConfigImportError(f"{name}: Llama4ForConditionalGeneration carries a vision encoder (vision_config), which "
                                "is not modelled; to plan the language model, give its text_config with "
                                "\"architectures\": [\"Llama4ForCausalLM\"]")
    known = _LLAMA_LIKE | _MOE_LIKE | _MLA_LIKE | _GPT_LIKE | _HYBRID_LIKE
    supported = sorted(known)
    if arch not in known:
        shown = arch if arch is None or arch.isprintable() else arch.encode("unicode_escape").decode()
        raise ConfigImportError(
            f"{name}: unsupported architecture {shown!r} in 'architectures'; supported: {', '.join(supported)}"
        )
    _refuse_unmodelled(cfg, name, moe=arch in _MOE_LIKE | _MLA_LIKE | _HYBRID_LIKE, mla=arch in _MLA_LIKE)
    if arch in _HYBRID_LIKE:
        head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim")
        spec = dict(name=name, family="llama", num_layers=_need(cfg, "num_hidden_layers", name),
                    hidden_size=_need(cfg, "hidden_size", name), num_attention_heads=_need(cfg, "num_attention_heads", name),
                    num_kv_heads=cfg.get("num_key_value_heads"), kv_channels=head_dim,
                    ffn_hidden_size=_need(cfg, "intermediate_size", name), vocab_size=_need(cfg, "vocab_size", name),
                    tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), **_nemotron_h_of(cfg, name))
    elif arch in _MLA_LIKE:
        spec = dict(name=name, family="llama", num_layers=_need(cfg, "num_hidden_layers", name),
                    hidden_size=_need(cfg, "hidden_size", name),
                    num_attention_heads=_need(cfg, "num_attention_heads", name),
                    ffn_hidden_size=_need(cfg, "intermediate_size", name), vocab_size=_need(cfg, "vocab_size", name),
                    tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), **_deepseek_v3_of(cfg, name))
    elif arch in _LLAMA_LIKE | _MOE_LIKE:
        h = _need(cfg, "hidden_size", name)
        head_dim = cfg.get("head_dim")
        heads = _need(cfg, "num_attention_heads", name)
        spec = dict(
            name=name, family="llama", num_layers=_need(cfg, "num_hidden_layers", name), hidden_size=h,
            num_attention_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads"),
            # head_dim changes the shape (Mistral-NeMo: 32 heads x 128 = 4096 != hidden 5120): honoured
            # as kv_channels whenever it differs from hidden/heads [HF MistralConfig.head_dim]
            kv_channels=head_dim if head_dim is not None and not (
                isinstance(h, int) and isinstance(heads, int) and heads and head_dim == h // heads and h % heads == 0)
            else None,
            ffn_hidden_size=None if arch == "Llama4ForCausalLM" else _need(cfg, "intermediate_size", name),
            vocab_size=_need(cfg, "vocab_size", name),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")  # Qwen2's attention always has Q/K/V biases
            or (bool(cfg.get("attention_bias", False)) and arch != "GptOssForCausalLM"),
            qk_norm=arch == "Qwen3MoeForCausalLM",  # Qwen3's attention always normalises Q and K per head
        )
        spec.update(_gpt_oss_attention(cfg, name) if arch == "GptOssForCausalLM" else _window_of(cfg, arch, name))
        if arch == "Llama4ForCausalLM":
            spec.update(_llama4_of(cfg, name))
        elif arch in _MOE_LIKE:
            spec["moe"] = _moe_of(cfg, arch, name)
    elif arch == "GPT2LMHeadModel":
        h = _need(cfg, "n_embd", name)
        spec = dict(
            name=name, family="gpt", num_layers=_need(cfg, "n_layer", name), hidden_size=h,
            num_attention_heads=_need(cfg, "n_head", name), ffn_hidden_size=cfg.get("n_inner") or 4 * h,
            vocab_size=_need(cfg, "vocab_size", name), max_position_embeddings=_need(cfg, "n_positions", name),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        )
    else:  # GPTNeoXForCausalLM: LayerNorm, GeLU, biases, rotary positions, untied by default
        spec = dict(
            name=name, family="gpt", position_embedding="rope", num_layers=_need(cfg, "num_hidden_layers", name),
            hidden_size=_need(cfg, "hidden_size", name), num_attention_heads=_need(cfg, "num_attention_heads", name),
            ffn_hidden_size=_need(cfg, "intermediate_size", name), vocab_size=_need(cfg, "vocab_size", name),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    return ModelSpec.load(spec, f"{name} (config.json)")
