"""Megatron's --pipeline-model-parallel-layout strings, written from and read into Layout.pipeline_layers.

The grammar is megatron-core 0.19.2's [transformer/pipeline_parallel_layer_layout.py:
PipelineParallelLayerLayout.parse_str_to_list, validate_layer_layout]: virtual stages in order
(stage i on pipeline rank i % pp) separated by '|', one character per item ('E' the embedding,
't' a decoder layer, 'm' a multi-token prediction depth, 'L' the loss), '(...)*n' and 'x*n'
repeated, commas cosmetic. The planner prices the embedding on the first virtual stage and the
loss and every MTP depth on the last, so layouts that put them elsewhere are refused, not moved.
"""

from __future__ import annotations

import re

from planner.errors import PlannerError

__all__ = ["layout_string", "parse_layout_string"]

_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))  # (...)*n first, then x*n


def layout_string(split: tuple[int, ...], mtp: int = 0) -> str:
    """The layout for decoder-layer counts per virtual stage: 't' per layer, 'E' first, then `mtp`
    depths 'm' and 'L' last, in the last virtual stage (where the cost model puts them)."""
    stages = ["t" * n for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"  # the same stage when there is only one
    return "|".join(stages)


def parse_layout_string(text: str, pp: int, num_layers: int, mtp: int = 0) -> tuple[int, ...]:
    """Decoder layers per virtual stage of a layout string, checked as Megatron checks it (stages a
    multiple of pp, E first and L last once each, num_layers 't', mtp 'm' after every 't') and as the
    planner prices it (E in the first stage, the MTP depths and L in the last). PlannerError, one
    line naming the rule, otherwise."""
    where = f"pipeline layout {text!r}"
    flat = text.replace(",", "")
    for pattern in _REPEATS:
        flat = pattern.sub(lambda g: g.group(1) * int(g.group(2)), flat)
    stages = flat.split("|")
    bad = sorted(set(flat) - set("EtmL|"))
    if bad:
        raise PlannerError(f"{where}: unknown item(s) {', '.join(map(repr, bad))} (E, t, m, L and '|' only)")
    if len(stages) % pp:
        raise PlannerError(f"{where}: {len(stages)} virtual stages is not a multiple of pp ({pp})")
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise PlannerError(f"{where}: 'E' must come first and 'L' last, once each")
    if flat.count("t") != num_layers:
        raise PlannerError(f"{where}: {flat.count('t')} decoder layers 't', the model has {num_layers}")
    if flat.count("m") != mtp:
        raise PlannerError(f"{where}: {flat.count('m')} MTP depths 'm', the model has mtp_layers = {mtp}")
    if mtp and "t" in flat[flat.find("m"):]:
        raise PlannerError(f"{where}: decoder layers must come before the MTP depths")
    if mtp and stages[-1].count("m") != mtp:
        raise PlannerError(f"{where}: the MTP depths are priced in the last virtual stage, beside the loss "
                           "(a standalone MTP stage is not)")
    return tuple(s.count("t") for s in stages)
