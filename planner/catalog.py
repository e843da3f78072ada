"""Catalog lookup: models and clusters by id, YAML path, or Hugging Face config.json."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import CatalogError, ConfigImportError
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


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise CatalogError(f"{path.name}: not valid YAML{where}") from None
    except OSError as err:
        raise CatalogError(f"{path}: cannot read ({err.strerror})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path.name}: expected a mapping of fields at the top level")
    return data


def _unknown(kind: str, ref: str, ids: list[str]) -> CatalogError:
    close = difflib.get_close_matches(ref, ids, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(ids)}"
    return CatalogError(f"unknown {kind} '{ref}'{hint}")


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
    text = str(ref)
    path = Path(text)
    if text in model_ids():
        return _catalog_model(text)
    if path.suffix == ".json":
        if not path.is_file():
            raise CatalogError(f"{text}: no such file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigImportError(f"{path.name}: not valid JSON (line {err.lineno}: {err.msg})") from None
        return model_from_hf_config(data, name=path.parent.name or path.stem)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise CatalogError(f"{text}: no such file")
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
    else:
        text = str(ref)
        path = Path(text)
        if text in cluster_ids():
            path, where = catalog_dir("clusters") / f"{text}.yaml", f"clusters/{text}.yaml"
        elif path.suffix in (".yaml", ".yml"):
            if not path.is_file():
                raise CatalogError(f"{text}: no such file")
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
_GPT_LIKE = {"GPT2LMHeadModel", "GPTNeoXForCausalLM"}


def _need(cfg: dict[str, Any], key: str, name: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigImportError(f"{name}: config.json has no '{key}'")
    return cfg[key]


def model_from_hf_config(cfg: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json mapping.

    Supports Llama, Mistral and Qwen2 (llama family), GPT-2 and GPT-NeoX (gpt family).

    Raises:
        ConfigImportError: not a mapping, no or unsupported architecture, or a missing key.
    """
    if not isinstance(cfg, dict):
        raise ConfigImportError(f"{name}: config.json must be a JSON object")
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    supported = sorted(_LLAMA_LIKE | _GPT_LIKE)
    if arch not in _LLAMA_LIKE | _GPT_LIKE:
        raise ConfigImportError(
            f"{name}: unsupported architecture {arch!r} in 'architectures'; supported: {', '.join(supported)}"
        )
    if arch in _LLAMA_LIKE:
        h = _need(cfg, "hidden_size", name)
        spec = dict(
            name=name, family="llama", num_layers=_need(cfg, "num_hidden_layers", name), hidden_size=h,
            num_attention_heads=_need(cfg, "num_attention_heads", name),
            num_kv_heads=cfg.get("num_key_value_heads"),
            ffn_hidden_size=_need(cfg, "intermediate_size", name), vocab_size=_need(cfg, "vocab_size", name),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        )
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
