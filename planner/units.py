"""SI constants, dtype sizes and the quantity parser: the only place units are converted."""

from __future__ import annotations

import re

__all__ = ["GB", "GiB", "MiB", "TB", "parse_quantity", "BYTES", "US", "count_text"]

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB = 2.0**10, 2.0**20, 2.0**30
US = 1e-6  # seconds per microsecond

#: bytes per element of each dtype the ledger uses
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "bool": 1}

_SCALE = {
    "": 1.0, "k": KB, "K": KB, "M": MB, "G": GB, "T": TB, "P": 1e15,
    "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": 2.0**40,
}
# unit -> (SI unit kind, factor to SI base)
_UNITS = {
    "B": ("bytes", 1.0),
    "bit": ("bytes", 1 / 8),
    "B/s": ("bytes/s", 1.0),
    "bit/s": ("bytes/s", 1 / 8),
    "FLOP/s": ("flop/s", 1.0),
    "s": ("s", 1.0),
    "ms": ("s", 1e-3),
    "us": ("s", 1e-6),
}
_QTY = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*((?:[kKMGTP]i?)?)(\S*)\s*$")


def parse_quantity(value: str | int | float, kind: str) -> float:
    """Parse a quantity with its unit ("80 GB", "400 Gbit/s", "989 TFLOP/s", "25 us") to SI.

    Args:
        value: a string with a unit, or a bare number already in SI units.
        kind: the expected kind: "bytes", "bytes/s", "flop/s" or "s".

    Returns:
        The value in SI base units (bytes, bytes/s, FLOP/s, seconds).

    Raises:
        ValueError: the string is not a number with a unit of that kind.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a {kind} quantity, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _QTY.match(str(value))
    if not m:
        raise ValueError(f"cannot parse {value!r} as a {kind} quantity (e.g. '80 GB')")
    number, prefix, unit = m.groups()
    if unit in ("us", "ms", "s") and prefix:
        raise ValueError(f"cannot parse {value!r}: unknown unit")
    if prefix and unit == "" :
        raise ValueError(f"cannot parse {value!r}: missing unit")
    if unit not in _UNITS or _UNITS[unit][0] != kind:
        raise ValueError(f"{value!r} is not a {kind} quantity")
    return float(number) * _SCALE[prefix] * _UNITS[unit][1]


def count_text(n: int) -> str:
    """A count for people: 14,448 up to a million, then 1.7e24 (layout spaces with every split)."""
    return f"{n:,}" if n < 10**6 else f"{n:.1e}".replace("e+", "e")
