"""A small memo for pure functions of frozen specs: specs are keyed by identity and kept alive."""

from __future__ import annotations

from functools import wraps

from pydantic import BaseModel

__all__ = ["memo"]


def memo(maxsize: int = 1 << 16):
    """Cache a pure function whose arguments are frozen specs (keyed by id) and plain values."""

    def deco(fn):
        cache: dict = {}

        @wraps(fn)
        def wrapper(*args, **kwargs):
            key = tuple([id(a) if isinstance(a, BaseModel) else a for a in args])
            if kwargs:
                key += tuple(sorted(kwargs.items()))
            hit = cache.get(key)
            if hit is not None:
                return hit[0]
            value = fn(*args, **kwargs)
            if len(cache) >= maxsize:
                cache.clear()
            # holding the specs keeps their ids from being reused while the entry lives
            cache[key] = (value, [a for a in args if isinstance(a, BaseModel)])
            return value

        wrapper.cache_clear = cache.clear
        return wrapper

    return deco
