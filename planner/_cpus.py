"""The CPUs this process may run on (standard library only: planner.check's Megatron worker reads it too)."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs in this process's affinity mask where the platform has one (Linux), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
