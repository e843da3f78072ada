"""The stand-ins Megatron needs to import and validate on a CPU-only machine (Python 3.11, no triton, no TE)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import typing


class _Anything:
    """Any triton object: attribute access, calls, decorators and subscripts all succeed."""

    def __init__(self, name: str = "triton") -> None:
        self._name = name

    def __getattr__(self, item: str):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a bare decorator: @triton.jit
        return _Anything(self._name)

    def __getitem__(self, item):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self.__name__}.{item}")


class _TritonFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.__version__ = "3.0.0"
        return m

    def exec_module(self, module):
        pass


def install_shims() -> None:
    """typing.override on 3.11; a triton stand-in registered only after torch has probed for the
    real one (torch's flop counter and inductor decide at import whether triton exists)."""
    if not hasattr(typing, "override"):  # Python 3.12 API used by megatron-core >= 0.17
        typing.override = lambda f: f
    import torch  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    if importlib.util.find_spec("triton") is None:
        sys.meta_path.insert(0, _TritonFinder())


def assume_transformer_engine() -> None:
    """Megatron defaults to Transformer Engine (fused RoPE); the target has it, this CPU does not."""
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.transformer_config as transformer_config

    if getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    transformer_config.is_te_min_version = lambda *a, **k: True
    import megatron.training.arguments as arguments  # validate_args' own copy (--fp4-format needs TE >= 2.7)

    arguments.is_te_min_version = lambda *a, **k: True
