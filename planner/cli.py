"""Command-line interface: `planner plan | evaluate | explain | ledger | catalog`. The only module that prints."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.catalog import cluster_ids, load_cluster, load_model, model_ids
from planner.emit import LAUNCH_FILE_NAMES
from planner.errors import PlannerError
from planner.outputs import check_file, check_folder
from planner.memory import offload_host_note
from planner.plans import evaluate
from planner.pipeline_layout import parse_layout_string
from planner.report import GiB, ledger_rows, plan_row, result_dict, workload_tags
from planner.search import MAX_TIME_LIMIT_S, plan
from planner.space import (FP8_ARCHS, FRAMEWORK_ENGINES, default_fp8_recipe, RANK_ORDERS, RECOMPUTE_MODES,
                           framework_training, overlaps)
from planner.specs import MAX_GPUS, Layout, TrainingSpec
from planner.torchtitan_engine import LOSS_CHUNKS as TORCHTITAN_LOSS_CHUNKS
from planner.units import count_text

__all__ = ["main"]

DEFAULT = dict(model="llama3-70b", cluster="dgx-h100", nodes=8, global_batch_size=1024, seq_length=8192)
EXIT_OK, EXIT_INFEASIBLE, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3
"""0 ok; 1 proven infeasible (the answer says what would fit); 2 bad input; 3 the time limit ended
the search before any layout was found (nothing proven)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(text: Any) -> str:
    """Terminal-safe text: control characters (escape sequences, line breaks) become '?'."""
    return _CONTROL.sub("?", str(text))


def _u(text: Any) -> str:
    """A user-reachable string made safe inside rich markup: cleaned, then markup-escaped."""
    return escape(_clean(text))


def _row(table: Table, *cells: Any) -> None:
    table.add_row(*(_u(c) for c in cells))


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, exit status 2 (never argparse's two-line usage dump)
        raise _UsageError(f"{self.prog}: {message}")


def _int_at_least(lo: int, what: str):
    """An argparse type: an integer >= lo, else one line saying `what` was expected."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "a whole number >= 0")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number (finite), got {text!r}")
    return v


def _fraction(text: str) -> float:
    """A number in [0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return v


def _probability(text: str) -> float:
    """'5%' or '0.05' -> 0.05, strictly between 0 and 1."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability such as 5% or 0.05, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a probability strictly between 0 and 1, got {text!r}")
    return value


def _time_limit(text: str) -> float:
    v = _positive_float(text)
    if v > MAX_TIME_LIMIT_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TIME_LIMIT_S:g} seconds, got {text!r}")
    return v


def _problem_args(p: argparse.ArgumentParser, defaults: bool) -> None:
    d = DEFAULT if defaults else {}
    p.add_argument("model", nargs="?" if defaults else None, default=d.get("model"),
                   help="catalog id, YAML spec or Hugging Face config.json" + (f" (default {d['model']})" if d else ""))
    p.add_argument("cluster", nargs="?" if defaults else None, default=d.get("cluster"),
                   help="catalog id or YAML" + (f" (default {d['cluster']})" if d else ""))
    p.add_argument("--nodes", type=_positive_int, default=d.get("nodes"), help="number of nodes")
    p.add_argument("--nvlink-domain", type=_positive_int, default=None, metavar="GPUS",
                   help="GPUs per NVLink domain the job gets (default the cluster's: 72 on an NVL72 rack; 64 for "
                   "jobs that take 16 of a rack's 18 trays)")
    p.add_argument("--global-batch-size", type=_positive_int, default=d.get("global_batch_size", 1024),
                   help="sequences per step (default 1024)")
    p.add_argument("--seq-length", type=_positive_int, default=d.get("seq_length", 8192), help="tokens per sequence (default 8192)")
    p.add_argument("--grad-dtype", choices=["bf16", "fp32"], default="fp32", help="gradient buffer: bf16 = 16 B/param, fp32 = 18 (default)")
    p.add_argument("--attention", choices=["flash", "eager"], default="flash")
    p.add_argument("--cross-entropy", choices=["fp32", "unfused", "fused", "te"], default="fp32",
                   help="loss kernel: fp32 logits (megatron-core's fused loss as the Megatron files launch it, torch's; "
                        "default), unfused (megatron-core's without --cross-entropy-loss-fusion), fused (flash-attn's, "
                        "llm-foundry's) or te (Transformer Engine's, Megatron-Bridge's); fused and te priced with "
                        "--framework any, not emitted")
    p.add_argument("--fp8", default=None, metavar="RECIPE[,RECIPE]",
                   help="low-precision linear layers: delayed, tensorwise, blockwise (Hopper+), mxfp8, nvfp4 (Blackwell), rowwise, "
                        "torchao-tensorwise or torchao-mxfp8 (torchao; Blackwell); a comma list with 'none' offers a choice, "
                        "e.g. none,delayed (plan only)")
    p.add_argument("--precision", default=None, metavar="bf16|fp16|fp8[,...]",
                   help="compute precision: bf16 (default), fp16, or fp8 (BF16 with the GPU's default FP8 recipe: "
                        "delayed on Hopper, mxfp8 on Blackwell; torchtitan's rowwise on Hopper, torchao-mxfp8 on Blackwell; "
                        "--fp8 names one); bf16,fp8 offers the choice (plan only)")
    p.add_argument("--optimizer-states", default="fp32", metavar="fp32|bf16[,...]",
                   help="Adam states: fp32 (12 B/param) or bf16 (Megatron's precision-aware optimizer, 6 B/param); "
                        "fp32,bf16 offers the choice (plan only)")
    p.add_argument("--optimizer-offload", default="0", metavar="F[,F...]",
                   help="share of each rank's optimizer shard kept and stepped on the CPU (Megatron's "
                        "--optimizer-cpu-offload --optimizer-offload-fraction F; 0 = off, the default); a comma list, "
                        "e.g. 0,0.5,1, offers the choice (plan only)")
    p.add_argument("--fp8-param-gather", action="store_true",
                   help="with a Transformer Engine FP8 recipe: FP8 weights, all-gathered in FP8 (Megatron's flag)")
    p.add_argument("--fp8-attention", action="store_true",
                   help="with the delayed, tensorwise or mxfp8 recipe: the attention core in FP8 too (Transformer "
                        "Engine's fp8_dpa, as Megatron-Bridge's recipes set it; priced, but Megatron-LM's command line "
                        "cannot turn it on, so plan with --framework any)")
    p.add_argument("--bf16-first-layers", type=_nonnegative_int, default=0, metavar="N",
                   help="with a Transformer Engine recipe other than delayed: the first N layers' linears stay BF16 "
                        "(Megatron's --first-last-layers-bf16 --num-layers-at-start-in-bf16 N)")
    p.add_argument("--bf16-last-layers", type=_nonnegative_int, default=0, metavar="N",
                   help="the same for the last N layers (--num-layers-at-end-in-bf16 N)")
    p.add_argument("--optimizer-impl", choices=["megatron", "deepspeed", "fsdp2", "apex"], default=None,
                   help="whose optimizer engine to price: Megatron's (default), DeepSpeed's (its wrapper and reduce "
                        "buckets), FSDP2's (torchtitan) or NeMo 1.x's distributed_fused_adam (apex: priced, not "
                        "emitted); --framework deepspeed/torchtitan and --emit set it")
    p.add_argument("--moe-imbalance", type=_positive_float, default=1.0, metavar="X",
                   help="MoE: routed tokens on the busiest expert rank over the mean (default 1: balanced)")
    p.add_argument("--moe-capacity-factor", type=_positive_float, default=None, metavar="C",
                   help="MoE: drop the tokens beyond C times each expert's balanced share (Megatron's "
                        "--moe-expert-capacity-factor; default: dropless)")
    p.add_argument("--moe-pad-to-capacity", action="store_true",
                   help="MoE, with --moe-capacity-factor: every expert computes exactly its capacity, padded "
                        "(Megatron's --moe-pad-expert-input-to-capacity)")
    p.add_argument("--tokens", type=_positive_float, default=None, help="token budget for time to train (e.g. 15e12)")
    p.add_argument("--document-tokens", type=_positive_int, default=None, metavar="D",
                   help="attention masked per packed document (torchtitan always does): a token's document length, "
                        "averaged over tokens (sum d^2 / sum d); default: causal over the whole sequence")
    p.add_argument("--memory-overhead", default=None, help="per-GPU overhead outside the ledger, e.g. '4 GiB'")


def _constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("constraints (fix a value, or bound it as LO:HI)")
    for name in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro-batch-size"):
        g.add_argument(f"--{name}", default=None, metavar="N|LO:HI")
    g.add_argument("--zero", default=None, metavar="N|LO:HI", help="ZeRO stage")
    g.add_argument("--moe-dispatcher", default=None, metavar="alltoall|allgather|deepep[,...]",
                   help="MoE token dispatchers to search (default alltoall; allgather is Megatron's default; "
                        "deepep needs the deep_ep package)")
    g.add_argument("--recompute", default=None,
                   help="none, selective (Megatron's attention core), full, op (torchtitan's per-op), or a comma list")
    g.add_argument("--ep-overlap", choices=["on", "off", "both"], default=None,
                   help="MoE: Megatron's combined 1F1B hiding the EP all-to-all (default off, Megatron's; both: searched)")
    g.add_argument("--no-sequence-parallel", action="store_true")
    g.add_argument("--no-uneven-stages", action="store_true", help="even layer splits only (pp must divide the layers)")
    g.add_argument("--max-oom-risk", type=_probability, default=None, metavar="P",
                   help="only layouts whose out-of-memory risk is at most P (e.g. 5%% or 0.05)")
    g.add_argument("--rank-order", choices=RANK_ORDERS, default=None,
                   help="rank placement (tp-cp-pp-dp = Megatron's --use-tp-pp-dp-mapping)")
    p.add_argument("--framework", choices=["megatron", "deepspeed", "torchtitan", "any"], default="megatron",
                   help="launch target; restricts ZeRO stages (default megatron)")
    p.add_argument("--top-k", type=_positive_int, default=5)
    p.add_argument("--time-limit", type=_time_limit, default=10.0,
                   help="seconds for the whole search: tables, solves and ranking (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-timing", action="store_true", help="leave wall-clock times out of --json (stable output)")
    _emit_args(p)


def _emit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--emit", choices=["megatron", "deepspeed", "torchtitan"], default=None,
                   help="write launch files for the best (or given) layout")
    p.add_argument("--out", default=None, help="folder for --emit (default ./launch-FRAMEWORK)")
    p.add_argument("--force", action="store_true", help="overwrite files in --out that planner did not write")


def _emit_folder(a) -> str | None:
    """The --emit folder, checked before any work (a file there that planner did not write, a link,
    or an unwritable folder fails now, not after the search)."""
    if not a.emit:
        return None
    folder = a.out or f"launch-{a.emit}"
    check_folder(folder, LAUNCH_FILE_NAMES[a.emit], force=a.force)
    return folder


def _emit(a, plan_, out: Console) -> None:
    if not a.emit or plan_ is None:
        return
    files = getattr(plan_, f"to_{a.emit}")()
    paths = files.write(a.out or f"launch-{a.emit}", force=a.force)
    if not a.json:
        out.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, highlight=False)


def _int_or_range(name: str, text: str | None, lo: int = 1, hi: int = MAX_GPUS):
    """--NAME N or LO:HI (either end may be left open), whole numbers in [lo, hi]."""
    if text is None:
        return None

    def one(word: str) -> int:
        try:
            n = int(word)
        except ValueError:
            raise _UsageError(f"--{name}: expected N or LO:HI with whole numbers, got {text!r}") from None
        if not lo <= n <= hi:
            raise _UsageError(f"--{name}: {n} is out of range ({lo} to {hi})")
        return n

    if ":" in text:
        first, last = text.split(":", 1)
        a, b = (one(first) if first.strip() else None), (one(last) if last.strip() else None)
        if a is not None and b is not None and a > b:
            raise _UsageError(f"--{name}: the range {text!r} is empty (LO > HI)")
        return (a, b)
    return one(text)


def _constraints(a) -> dict[str, Any]:
    c = {"tp": _int_or_range("tp", a.tp), "pp": _int_or_range("pp", a.pp), "dp": _int_or_range("dp", a.dp),
         "cp": _int_or_range("cp", a.cp), "vpp": _int_or_range("vpp", a.vpp),
         "ep": _int_or_range("ep", a.ep), "etp": _int_or_range("etp", a.etp),
         "micro_batch_size": _int_or_range("micro-batch-size", a.micro_batch_size),
         "zero_stage": _int_or_range("zero", a.zero, lo=0, hi=3),
         "moe_dispatcher": [d.strip() for d in a.moe_dispatcher.split(",")] if a.moe_dispatcher else None,
         "ep_overlap": {None: None, "on": True, "off": False, "both": "both"}[a.ep_overlap]}
    if a.recompute:
        modes = [m.strip() for m in a.recompute.split(",")]
        bad = [m for m in modes if m not in RECOMPUTE_MODES]
        if bad:
            raise _UsageError(f"--recompute: unknown mode {bad[0]!r} (none, selective, full, op, or a comma list)")
        c["recompute"] = modes
    if a.no_sequence_parallel:
        c["sequence_parallel"] = False
    if a.no_uneven_stages:
        c["uneven_stages"] = False
    if a.rank_order:
        c["rank_order"] = a.rank_order
    if a.max_oom_risk is not None:
        c["max_oom_risk"] = a.max_oom_risk
    return {k: v for k, v in c.items() if v is not None}


FP8_CHOICES = ("none", *FP8_ARCHS)


def _word_list(flag: str, text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """A comma list of allowed words (duplicates dropped, order kept); one value unless the command
    offers a choice."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in words if w not in allowed]
    if bad or not words:
        raise _UsageError(f"{flag}: unknown {what} {bad[0] if bad else text!r} (one of {', '.join(allowed)}, "
                          "or a comma list of them)")
    return list(dict.fromkeys(words))


def _precision_words(a) -> list[str]:
    """--precision as a list of words (bf16 when absent)."""
    return _word_list("--precision", a.precision, ("bf16", "fp16", "fp8"), "precision") if a.precision else ["bf16"]


def _precision(a) -> str:
    """TrainingSpec.precision from --precision: fp16 alone, else bf16."""
    words = _precision_words(a)
    if "fp16" in words and len(words) > 1:
        raise _UsageError("--precision: fp16 is offered alone (plan fp16 and bf16 or fp8 separately)")
    if a.fp8 is not None and words != ["bf16"]:
        raise _UsageError("--precision: give --precision fp8 or --fp8 RECIPE, not both")
    return words[0] if words == ["fp16"] else "bf16"


def _fp8_list(a, cluster) -> list[str | None]:
    """--fp8 (or --precision's fp8) as a list of recipes (None = no FP8)."""
    if a.fp8 is not None:
        return [None if w == "none" else w for w in _word_list("--fp8", a.fp8, FP8_CHOICES, "recipe")]
    return [default_fp8_recipe(cluster, getattr(a, "framework", None)) if w == "fp8" else None for w in _precision_words(a)]


def _states_list(a) -> list[str]:
    """--optimizer-states as a list of Adam state dtypes."""
    return _word_list("--optimizer-states", a.optimizer_states, ("fp32", "bf16"), "value")


def _offload_list(a) -> list[float]:
    """--optimizer-offload as a list of fractions in [0, 1]."""
    out = []
    for w in (w.strip() for w in a.optimizer_offload.split(",")):
        try:
            f = float(w)
        except ValueError:
            f = float("nan")
        if not 0 <= f <= 1:
            raise _UsageError(f"--optimizer-offload: {w!r} is not a fraction in [0, 1] (or a comma list of them)")
        out.append(f)
    return list(dict.fromkeys(out))


def _problem(a):
    model = load_model(a.model)
    overrides = {"memory_overhead": a.memory_overhead} if a.memory_overhead else {}
    if a.nvlink_domain:
        overrides["nvlink_domain_size"] = a.nvlink_domain
    cluster = load_cluster(a.cluster, nodes=a.nodes, **overrides)
    precision = _precision(a)
    recipes, states, offloads = _fp8_list(a, cluster), _states_list(a), _offload_list(a)
    for flag, vals in (("--fp8" if a.fp8 is not None else "--precision", recipes), ("--optimizer-states", states),
                       ("--optimizer-offload", offloads)):
        if len(vals) > 1 and a.command != "plan":
            raise _UsageError(f"{flag}: a choice is offered by 'plan' only; give one value for '{a.command}'")
    training = TrainingSpec(global_batch_size=a.global_batch_size, seq_length=a.seq_length, grad_dtype=a.grad_dtype,
                            precision=precision,
                            attention=a.attention, cross_entropy=a.cross_entropy, token_budget=a.tokens, fp8=recipes[0],
                            document_tokens=a.document_tokens,
                            fp8_param_gather=a.fp8_param_gather, fp8_attention=a.fp8_attention,
                            optimizer_states=states[0],
                            optimizer_offload=offloads[0] if len(offloads) == 1 else 0.0,
                            bf16_first_layers=a.bf16_first_layers, bf16_last_layers=a.bf16_last_layers,
                            moe_imbalance=a.moe_imbalance, moe_capacity_factor=a.moe_capacity_factor,
                            moe_pad_to_capacity=a.moe_pad_to_capacity, optimizer_impl=a.optimizer_impl)
    if a.optimizer_impl == FRAMEWORK_ENGINES["torchtitan"]:  # FSDP2 is torchtitan's engine: the rest of what it runs
        training = framework_training(training, "torchtitan")
    return model, cluster, training


def _plans_table(title: str, plans, best) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("#", "layout", "peak / capacity GiB", "OOM risk", "step s", "80 % interval", "vs best", "MFU", "tokens/s"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    has_budget = plans and plans[0].training.token_budget
    if has_budget:
        t.add_column("days", justify="right")
        t.add_column("GPU-hours", justify="right")
    # a choice search (--precision, --optimizer-states, --optimizer-offload lists) ranks plans of several
    # workloads: each row names the choice it was priced with wherever the rows differ in it
    for i, (p, tags) in enumerate(zip(plans, workload_tags(plans)), 1):
        r = plan_row(p, best)
        lo, hi = r["step_s_80"]
        cells = [str(i), r["layout"] + (f" [{tags}]" if tags else ""), f"{r['peak_gib']:.1f} / {r['capacity_gib']:.1f}", _risk(r["oom_risk"]),
                 f"{r['step_s']:.3f}", f"{lo:.4g}-{hi:.4g}", f"{r['delta']:+.1%}" + (" tied" if r["tied"] else ""),
                 f"{r['mfu']:.1%}", f"{r['tokens_per_s']:,.0f}"]
        if has_budget:
            cells += [f"{r['days_to_train']:.1f}", f"{r['gpu_hours']:,.0f}"]
        _row(t, *cells)
    return t


OOM_WARNING = 0.5
"""plan warns when its choice is likelier than this to run out of memory (and --max-oom-risk is unset)."""
SAFE_OOM_RISK = 0.05
"""An out-of-memory risk plan's warning calls safe: a tied runner-up at most this likely to run out is named."""


def _risk(p: float) -> str:
    return "<0.1%" if p < 0.001 else f"{p:.1%}"


def _status_line(r) -> str:
    if r.status == "optimal":
        return "proven optimal"
    if r.status == "feasible":
        return f"feasible, not proven optimal (proven gap at most {r.gap:.1%})"
    return "unknown: the time limit ended the search; the best layout found so far, nothing proven (raise --time-limit)"


LIMIT_MARGIN = 0.8
"""A search that used more than this share of --time-limit ends with a note: on a slower or busier machine the
same run may end 'unknown'; where the proof came inside it and the structural options took the rest, the note
says so instead (DeepSeek-V3's default run: proven in ~6.5 s of its 10 on a 2-core machine, one option unfinished)."""


def _limit_note(status: str, solve_time_s: float, limit_s: float, proof_s: float | None = None,
                unfinished: int = 0) -> str | None:
    """The note for a search that came close to --time-limit, or None. Where the main search's proof came
    well inside the limit and the structurally different options took the rest, the note says that instead
    (the status was never at risk), and how many of them the time left did not finish (`unfinished`)."""
    if status not in ("optimal", "feasible"):
        return None
    more = f"--time-limit {max(30, 3 * round(limit_s)):d}"
    if status == "optimal" and proof_s is not None and proof_s < LIMIT_MARGIN * limit_s:
        if unfinished:
            return (f"proven in {proof_s:.1f} s of the {limit_s:g} s limit; the time left did not finish "
                    f"{unfinished} of the structurally different options; give them more ({more})")
        if solve_time_s < LIMIT_MARGIN * limit_s:
            return None
        return (f"proven in {proof_s:.1f} s; the structurally different options took the rest of the {limit_s:g} s "
                f"limit, so on a slower or busier machine some may be left unfinished ({more} leaves room)")
    if solve_time_s < LIMIT_MARGIN * limit_s:
        return None
    return (f"the search used {solve_time_s:.1f} s of its {limit_s:g} s limit: on a slower or busier machine the "
            f"same run may end 'unknown'; give it more there ({more})")


def _flag_bound(bound: str) -> str:
    """A default cap of the space as the CLI widens it (the API's constraint=(1, N) is the flag's 1:N)."""
    for key, flag in (("micro_batch_size", "--micro-batch-size"), ("vpp", "--vpp"), ("cp", "--cp")):
        bound = bound.replace(f"{key}=(1, N)", f"{flag} 1:N")
    return bound


def _exit_code(r) -> int:
    if r.status == "infeasible":
        return EXIT_INFEASIBLE
    return EXIT_OK if r.best is not None else EXIT_UNKNOWN


def _cmd_plan(a, out: Console) -> int:
    model, cluster, training = _problem(a)
    _emit_folder(a)
    choice = fp8_note = ""
    options = {"fp8": _fp8_list(a, cluster), "optimizer_states": _states_list(a), "optimizer_offload": _offload_list(a)}
    options = {k: v for k, v in options.items() if len(v) > 1}
    if options:  # a workload choice: one proven search per combination, the fastest wins
        from planner.choices import combo_label, fp8_choice_note, plan_choices

        r, results = plan_choices(model, cluster, training, options, top_k=a.top_k, time_limit_s=a.time_limit,
                                  framework=a.framework, **_constraints(a))
        choice = "; ".join(f"{combo_label(list(options), k)}: "
                           + (f"{res.best.step_time_s:.3f} s ({res.status})" if res.best else res.status)
                           for k, res in results.items()) + "".join(f"; {x}" for x in r.refused_choices)
        if None in options.get("fp8", ()) and r.best is not None:  # FP8 against BF16: what checks that gain
            fp8_note = fp8_choice_note(model, cluster, r.best, results.values())
    else:
        r = plan(model, cluster, training, top_k=a.top_k, time_limit_s=a.time_limit, framework=a.framework,
                 **_constraints(a))
    if a.json:
        _emit(a, r.best, out)
        out.print_json(json.dumps(result_dict(r, timing=not a.no_timing)))
        return _exit_code(r)
    nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes != 1 else ''}"
    out.print(f"[bold]{_u(model.name)}[/] on {cluster.world_size} x {_u(cluster.gpu.name)} ({_u(cluster.name)}, "
              f"{nodes}), global batch {training.global_batch_size} x {training.seq_length} tokens")
    if r.status == "infeasible":
        out.print(f"[red]infeasible (proven)[/]: {_u(r.infeasibility.message)}")
        return EXIT_INFEASIBLE
    if r.best is None:
        out.print(f"[yellow]unknown[/]: {_u(r.explanation[0])}")
        return EXIT_UNKNOWN
    out.print(f"status: {_status_line(r)}; searched {count_text(r.space_size)} layouts in {r.solve_time_s:.2f} s")
    note = _limit_note(r.status, r.solve_time_s, a.time_limit, r.stats.proof_s if r.stats else None,
                       sum(alt.cut_short for alt in r.structural))
    if note:
        out.print(f"note: {note}", markup=False)
    if r.bounds:
        out.print(f"space: {_u('; '.join(_flag_bound(b) for b in r.bounds))}", markup=False)
    if choice:
        t_ = r.best.training
        out.print(f"choice: {_u(choice)}; chosen: fp8={_u(t_.fp8 or 'none')} optimizer_states={t_.optimizer_states} "
                  f"optimizer_offload={t_.optimizer_offload:g}", markup=False)
        if fp8_note:
            out.print(f"note: {_u(fp8_note)}", markup=False)
    out.print(_plans_table("ranked layouts", [r.best, *r.alternatives], r.best))
    if r.structural:
        t = Table(title="structurally different options", title_justify="left")
        for col in ("option", "layout", "step s", "vs best", "what binds"):
            t.add_column(col)
        for alt in r.structural:
            _row(t, alt.label, alt.plan.layout.short() if alt.plan else "-",
                 f"{alt.plan.step_time_s:.3f}" if alt.plan else "-",
                 f"{alt.delta:+.1%}" if alt.delta is not None else "-", alt.binds)
        out.print(t)
    for w in r.best.warnings:
        out.print(f"[yellow]warning[/]: {_u(w)}")
    if r.best.oom_risk > OOM_WARNING and a.max_oom_risk is None:  # the peak sits inside the memory model's error
        # a runner-up the model cannot rank below the choice and that most likely fits is the safer pick
        safer = next(((i, p) for i, p in enumerate(r.alternatives, 2)
                      if p.oom_risk <= SAFE_OOM_RISK and p.tied_with(r.best)), None)
        hint = "" if safer is None else (
            f"; #{safer[0]} ({safer[1].layout.short()}) is tied with it ({safer[1].step_time_s / r.best.step_time_s - 1:+.1%}) "
            f"and {safer[1].oom_risk:.0%} likely to run out: the safer pick at the model's resolution")
        out.print(f"[yellow]warning[/]: the chosen layout runs out of memory with probability {r.best.oom_risk:.0%} "
                  f"(peak {r.best.peak_memory_bytes / GiB:.1f} of {r.best.memory.capacity / GiB:.1f} GiB); "
                  f"--max-oom-risk 5% keeps only the layouts at most 5 % likely to run out{_u(hint)}")
    _emit(a, r.best, out)
    return EXIT_OK


def _layout_from_args(a) -> Layout:
    return Layout(tp=a.tp, pp=a.pp, dp=a.dp or 1, cp=a.cp, ep=a.ep, etp=a.etp, moe_dispatcher=a.moe_dispatcher,
                  ep_overlap=a.ep_overlap, zero_stage=a.zero,
                  micro_batch_size=a.micro_batch_size,
                  recompute=a.recompute, recompute_num_layers=a.recompute_num_layers,
                  recompute_modules=a.recompute_modules, vpp=a.vpp,
                  sequence_parallel=a.sequence_parallel, first_stage_layers=a.first_stage_layers,
                  last_stage_layers=a.last_stage_layers, rank_order=a.rank_order,
                  pipeline_layers=_layer_list(a.pipeline_layers),
                  overlap_grad_reduce=a.overlap_grad_reduce, overlap_param_gather=a.overlap_param_gather,
                  tp_comm_overlap=a.tp_comm_overlap)


def _layer_list(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        split = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise _UsageError(f"--pipeline-layers: expected comma-separated whole numbers, got {text!r}") from None
    if any(n < 0 for n in split):
        raise _UsageError(f"--pipeline-layers: layer counts cannot be negative, got {text!r}")
    return split


def _cmd_evaluate(a, out: Console) -> int:
    model, cluster, training = _problem(a)
    if a.pipeline_layers is not None and re.search(r"[EtmL]", a.pipeline_layers):  # Megatron's layout string
        split = parse_layout_string(a.pipeline_layers, a.pp, model.num_layers, model.mtp_layers)
        if a.vpp not in (1, len(split) // a.pp):
            raise _UsageError(f"--pipeline-layers: the layout has {len(split)} virtual stages, pp({a.pp}) x vpp({a.vpp}) "
                              f"= {a.pp * a.vpp}")
        a.pipeline_layers, a.vpp = ",".join(map(str, split)), len(split) // a.pp
    lay = _layout_from_args(a)
    _emit_folder(a)
    if a.dp is None:  # fill dp from the world size
        mp = lay.tp * lay.pp * lay.cp
        if cluster.world_size % mp:
            raise PlannerError(f"tp({lay.tp})*pp({lay.pp})*cp({lay.cp})={mp} does not divide world_size({cluster.world_size})")
        lay = lay.model_copy(update={"dp": cluster.world_size // mp})
    if a.emit:  # price the target's engine: DeepSpeed's wrapper and buckets, FSDP2's bytes
        training = framework_training(training, a.emit)
    # a split the engine makes itself where the layers do not divide (Megatron's account-for-ends flags,
    # DeepSpeed's and torchtitan's partitioners) is evaluate's: planner.space.framework_layout, one warning
    if a.emit == "torchtitan":  # torchtitan's overlaps are not options: price what it runs
        update = overlaps("torchtitan", lay.pp, lay.zero_stage, lay.vpp)
        del update["tp_comm_overlap"]  # yours to choose (--tp-comm-overlap: torchtitan's async TP)
        lay = lay.model_copy(update=update)
    p = evaluate(model, cluster, training, lay)
    _emit(a, p, out)
    found = plan(model, cluster, training, top_k=1, structural=False, time_limit_s=a.time_limit, framework="any")
    best = found.best
    if a.json:
        from planner.report import plan_dict, term_deltas
        d = plan_dict(p)
        d["optimum"] = plan_dict(best) if best else None
        d["optimum_status"] = found.status
        d["gap_by_term_s"] = {k: ya - yb for k, ya, yb in term_deltas(p, best)} if best else {}
        out.print_json(json.dumps(d))
        return EXIT_OK
    out.print(_plans_table("your layout" + (" and the optimum" if best else ""), [p] + ([best] if best else []), best))
    st = p.memory.peak_stage
    t = Table(title=f"memory per GPU, stage {st.stage} (the peak)", title_justify="left")
    t.add_column("item")
    t.add_column("GiB", justify="right")
    t.add_column("note")
    for i in st.items:
        _row(t, i.name, f"{i.bytes / GiB:.2f}", i.note)
    out.print(t)
    if p.memory.host:
        host = p.memory.host[st.stage]
        out.print(f"host memory per GPU, stage {st.stage}: {host / GiB:.2f} GiB of offloaded optimizer states "
                  f"({offload_host_note(p.training, p.layout.zero_stage)}) of {p.memory.host_capacity / GiB:.1f} GiB", markup=False)
    t = Table(title="step time", title_justify="left")
    t.add_column("term")
    t.add_column("s", justify="right")
    t.add_column("share", justify="right")
    for k, v in p.time.breakdown().items():
        _row(t, k, f"{v:.3f}", f"{v / p.step_time_s:.0%}")
    out.print(t)
    what = {"optimal": "the optimum", "feasible": "the best found (not proven optimal)",
            "unknown": "the best found within the time limit (not proven)"}.get(found.status, "the optimum")
    if best is not None and best.step_time_s < p.step_time_s:
        from planner.report import term_deltas

        t = Table(title="where the time goes (gap to the optimum)", title_justify="left")
        for col, just in (("term", "left"), ("yours s", "right"), ("optimum s", "right"), ("difference s", "right")):
            t.add_column(col, justify=just)
        for k, ya, yb in term_deltas(p, best):
            _row(t, k, f"{ya:.3f}", f"{yb:.3f}", f"{ya - yb:+.3f}")
        out.print(t)
    if best is not None:
        out.print(f"your layout takes {p.step_time_s / best.step_time_s - 1:.1%} longer per step than {what} "
                  f"({best.layout.short()})" if best.step_time_s < p.step_time_s else f"your layout is as fast as {what}",
                  markup=False)
    for w in p.warnings:
        out.print(f"[yellow]warning[/]: {_u(w)}")
    return EXIT_OK if p.fits else EXIT_INFEASIBLE


def _cmd_explain(a, out: Console) -> int:
    from planner.explain import explain_with_status
    model, cluster, training = _problem(a)
    lines, status = explain_with_status(model, cluster, training, framework=a.framework, time_limit_s=a.time_limit,
                                        **_constraints(a))
    if a.json:
        out.print_json(json.dumps({"status": status, "explanation": lines}))
    else:
        for line in lines:
            out.print(f"- {_u(line)}")
    return {"infeasible": EXIT_INFEASIBLE, "unknown": EXIT_UNKNOWN}.get(status, EXIT_OK)


def _cmd_ledger(a, out: Console) -> int:
    model = load_model(a.model)
    rows = ledger_rows(model, grad_dtype=a.grad_dtype, shard=a.shard, ep=a.ep, etp=a.etp)
    if a.json:
        out.print_json(json.dumps(rows))
        return EXIT_OK
    active = (f" ({model.active_params / 1e9:.2f}B active; experts over ep {a.ep} x etp {a.etp or 'TP'}, their states "
              f"over the expert-data-parallel group)") if model.moe else ""
    t = Table(title=f"{model.name}: {model.num_params / 1e9:.2f}B parameters{active}, static memory per GPU "
                    f"({'16' if a.grad_dtype == 'bf16' else '18'} bytes/param unsharded)", title_justify="left")
    for col in ("TP x PP", "ZeRO", "params GB", "grads GB", "Adam GB", "total GB"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['tp']} x {r['pp']}", f"{r['zero']} (/{r['shard']})" if r["zero"] else "0",
                  f"{r['params_gb']:.1f}", f"{r['grads_gb']:.1f}", f"{r['optimizer_gb']:.1f}", f"{r['total_gb']:.1f}")
    out.print(t)
    return EXIT_OK


def _cmd_catalog(a, out: Console) -> int:
    if a.kind == "models":
        t = Table(title="models", title_justify="left")
        for col in ("id", "family", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "source"):
            t.add_column(col)
        for ref in model_ids():
            m = load_model(ref)
            params = f"{m.num_params / 1e9:.2f}B" + (f" ({m.active_params / 1e9:.1f}B active, {m.active_params_without_embedding / 1e9:.1f}B "
                                                 "without the input embedding)" if m.moe else "")
            _row(t, ref, m.family.value + (" MoE" if m.moe else "") + (" MLA" if m.mla else ""), params,
                 str(m.num_layers), str(m.hidden_size),
                 f"{m.num_attention_heads}/{m.kv_heads}", str(m.ffn_hidden_size), str(m.vocab_size),
                 (m.sources[0].get("url", "") if m.sources else ""))
    else:
        t = Table(title="clusters", title_justify="left")
        for col in ("id", "GPU", "memory", "BF16 TFLOP/s", "GPUs/node", "NVLink domain", "NICs/node",
                    "host memory/node (offload)"):
            t.add_column(col)
        for ref in cluster_ids():
            c = load_cluster(ref)
            _row(t, ref, c.gpu.name, f"{c.gpu.memory / 2**30:.1f} GiB", f"{c.gpu.peak_bf16_flops / 1e12:.0f}",
                 str(c.gpus_per_node), str(c.nvlink_domain_size), str(c.scaleout.nics_per_node),
                 f"{c.host.memory / 2**30:.0f} GiB" if c.host else "- (no host spec)")
    out.print(t)
    return EXIT_OK


def _layout_args(p: argparse.ArgumentParser) -> None:
    for name in ("tp", "pp", "cp", "vpp", "micro-batch-size"):
        p.add_argument(f"--{name}", type=_positive_int, default=1)
    p.add_argument("--dp", type=_positive_int, default=None, help="default: what the world size leaves")
    p.add_argument("--ep", type=_positive_int, default=1, help="MoE: expert-parallel degree")
    p.add_argument("--moe-dispatcher", choices=["alltoall", "allgather", "deepep"], default="alltoall",
                   help="MoE token dispatcher: Megatron's all-to-all, or its flex dispatcher with DeepEP (needs deep_ep)")
    p.add_argument("--etp", type=_positive_int, default=None, help="MoE: expert tensor-parallel degree (default: = TP)")
    p.add_argument("--ep-overlap", action="store_true",
                   help="MoE: Megatron's --overlap-moe-expert-parallel-comm (combined 1F1B hiding the EP all-to-all)")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0, metavar="{0,1,2,3}")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none",
                   help="op: torchtitan's per-op selective checkpointing (its 'selective')")
    p.add_argument("--recompute-num-layers", type=_positive_int, default=None)
    p.add_argument("--recompute-modules", default=None, metavar="M[,M...]",
                   help="with --recompute selective: Megatron's --recompute-modules (core_attn, layernorm, "
                        "mla_up_proj, mlp, moe_act; default core_attn)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--first-stage-layers", type=_positive_int, default=None)
    p.add_argument("--last-stage-layers", type=_positive_int, default=None)
    p.add_argument("--pipeline-layers", default=None, metavar="N,N,...",
                   help="decoder layers of each virtual stage (pp x vpp, Megatron's order): any split, or "
                        "Megatron's layout string (e.g. 'Et*4|(t*4|)*14tmL'); emitted as --pipeline-model-parallel-layout")
    p.add_argument("--rank-order", choices=RANK_ORDERS, default="tp-cp-dp-pp")
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="gradient buckets reduced during backward (Megatron's flag; priced, and emitted with --emit)")
    p.add_argument("--tp-comm-overlap", action="store_true",
                   help="Megatron/TE TP communication overlap (needs --sequence-parallel)")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="with ZeRO >= 1: parameter all-gather during the next forward (Megatron's flag)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree (exposed for tests and docs)."""
    ap = _Parser(prog="planner", description="Proven-optimal parallel layouts for LLM training.")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)
    p = sub.add_parser("plan", help="find the fastest layout that fits (no arguments: Llama-3-70B on 8 DGX H100)")
    _problem_args(p, defaults=True)
    _constraint_args(p)
    p = sub.add_parser("explain", help="the reasoning behind the plan, with numbers")
    _problem_args(p, defaults=True)
    _constraint_args(p)
    p = sub.add_parser("report", help="a self-contained HTML review page (tables, memory, time, Pareto front)")
    _problem_args(p, defaults=True)
    _constraint_args(p)
    p = sub.add_parser("sweep", help="capacity planning over a grid, in parallel: CSV + plot")
    p.add_argument("--models", required=True, help="comma-separated model ids or files")
    p.add_argument("--clusters", required=True, help="comma-separated cluster ids")
    p.add_argument("--nodes", required=True, help="comma-separated node counts, e.g. 1,2,4,8")
    p.add_argument("--seq-lengths", default="8192", help="comma-separated (default 8192)")
    p.add_argument("--global-batch-size", type=_positive_int, default=1024)
    p.add_argument("--tokens", type=_positive_float, default=None, help="token budget for days and GPU-hours")
    p.add_argument("--framework", choices=["megatron", "deepspeed", "torchtitan", "any"], default="megatron")
    p.add_argument("--time-limit", type=_time_limit, default=10.0)
    p.add_argument("--workers", type=_positive_int, default=2)
    p.add_argument("--out", default="sweep.csv")
    p.add_argument("--plot", default=None, help="PNG path for the time-to-train plot")
    p.add_argument("--force", action="store_true", help="overwrite --out / --plot files that planner did not write")
    p = sub.add_parser("evaluate", help="memory and time of a layout you give")
    _problem_args(p, defaults=False)
    _layout_args(p)
    p.add_argument("--time-limit", type=_time_limit, default=10.0)
    p.add_argument("--json", action="store_true")
    _emit_args(p)
    p = sub.add_parser("calibrate", help="fit the cluster to your training logs; writes a calibrated cluster YAML")
    p.add_argument("model", help="catalog id, YAML spec or Hugging Face config.json")
    p.add_argument("cluster", help="catalog id or YAML")
    p.add_argument("logs", nargs="+", help="Megatron-LM, Megatron-Bridge/NeMo, torchtitan or DeepSpeed logs")
    p.add_argument("--nodes", type=_positive_int, default=None, help="nodes of the runs whose log has no argument dump")
    p.add_argument("--global-batch-size", type=_positive_int, default=None,
                   help="for logs without Megatron's argument dump (torchtitan, DeepSpeed, NeMo)")
    p.add_argument("--seq-length", type=_positive_int, default=None, help="likewise")
    p.add_argument("--grad-dtype", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--kernels", choices=["fused", "unfused"], default=None,
                   help="fused (Megatron/NeMo, the default for their logs) or unfused (eager PyTorch: torchtitan, DeepSpeed)")
    p.add_argument("--cross-entropy", choices=["fp32", "unfused", "fused", "te"], default="fp32",
                   help="for logs without Megatron's argument dump: the loss kernel the run used (te: Transformer "
                        "Engine's, as Megatron-Bridge's recipes set; fp32: megatron-core's fused one or torch's; default)")
    p.add_argument("--optimizer-offload", type=_fraction, default=0.0,
                   help="for logs without an argument dump: the optimizer share the run kept on the host "
                        "(torchtitan's training.enable_cpu_offload: 1)")
    p.add_argument("--loss-chunks", type=_positive_int, default=None,
                   help="torchtitan logs: the chunks its loss ran in (default 8, torchtitan 0.3's ChunkedLossWrapper; "
                        "1 for a torchtitan without it)")
    p.add_argument("--optimizer-impl", choices=["megatron", "apex"], default=None,
                   help="NeMo logs without an argument dump: the optimizer the run used (apex: NeMo 1.x's "
                        "distributed_fused_adam; default megatron's distributed optimizer)")
    p.add_argument("--fp8", default=None, metavar="RECIPE", choices=FP8_CHOICES[1:],
                   help="logs without an argument dump: the run's low-precision recipe (as plan's --fp8); without it a "
                        "torchtitan log that shows its quantisation converters sets it (rowwise, torchao-mxfp8)")
    _layout_args(p)
    p.add_argument("--out", default=None, help="calibrated cluster YAML (default CLUSTER-calibrated.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an --out file that planner did not write")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("check", help="run a framework's own validator on a launch config (needs the [validate] extra)")
    p.add_argument("framework", choices=["megatron", "deepspeed", "torchtitan"])
    p.add_argument("config", nargs="+", help="megatron: megatron_args.json or pretrain_gpt.py arguments (after --); "
                   "deepspeed: ds_config.json; torchtitan: train.sh overrides (after --)")
    p.add_argument("--world-size", type=_positive_int, default=None, help="GPUs (megatron_args.json carries it)")
    p.add_argument("--tp", type=_positive_int, default=1)
    p.add_argument("--pp", type=_positive_int, default=1)
    p.add_argument("--num-layers", type=_positive_int, default=None,
                   help="deepspeed, torchtitan: also print the decoder layers per stage the framework's pipeline "
                   "code places for a model this deep (torchtitan: default, the registry config's depth)")
    p.add_argument("--gpu-arch", type=int, choices=range(7, 13), default=9, metavar="7..12",
                   help="compute capability major of the target GPU (default 9)")
    p.add_argument("--fetch-megatron", action="store_true", help="download megatron-core 0.19.2 if Megatron is not found")
    p.add_argument("--job-folder", default=None, metavar="DIR",
                   help="torchtitan: a launch folder with planner_job.py (an FP8 plan, or a registry flavour without "
                   "a config function); it is the --module and --config")
    p.add_argument("--module", default="llama3", help="torchtitan: the model module train.sh names (default llama3)")
    p.add_argument("--config", dest="titan_config", default="llama3_8b",
                   help="torchtitan: the registry config train.sh names (default llama3_8b; qwen3_30b_a3b for Qwen3-30B-A3B)")
    p = sub.add_parser("ledger", help="the static-memory table of a model (params / grads / Adam)")
    p.add_argument("model")
    p.add_argument("--grad-dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--shard", type=_positive_int, default=8, help="data-parallel (ZeRO) ranks (default 8)")
    p.add_argument("--ep", type=_positive_int, default=1, help="MoE: expert-parallel degree (default 1)")
    p.add_argument("--etp", type=_positive_int, default=None, help="MoE: expert tensor parallel (default: = TP)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("catalog", help="the built-in models or clusters")
    p.add_argument("kind", choices=["models", "clusters"])
    return ap


def _cmd_check(a, out: Console) -> int:
    from planner import check

    if a.framework == "megatron":
        if not check.megatron_available():
            if not a.fetch_megatron:
                raise PlannerError("Megatron not found: set MEGATRON_PATH, or pass --fetch-megatron")
            import os
            import tempfile

            os.environ["MEGATRON_PATH"] = check.fetch_megatron(os.path.join(tempfile.gettempdir(), "planner-megatron"))
        if len(a.config) == 1 and a.config[0].endswith(".json"):
            payload = _megatron_file_payload(a.config[0], a)
        else:
            if not a.world_size:
                raise _UsageError("planner check megatron: --world-size is needed with raw arguments")
            payload = check.megatron_payload(a.config, a.world_size, {}, a.gpu_arch)
        result = check.check_megatron([payload])[0]
    elif a.framework == "deepspeed":
        if not a.world_size:
            raise _UsageError("planner check deepspeed: --world-size is needed")
        cfg = _json_file(a.config[0])
        if not isinstance(cfg, dict):
            raise PlannerError(f"{a.config[0]}: expected a JSON object (a ds_config)")
        result = check.check_deepspeed(cfg, a.world_size, tp=a.tp, pp=a.pp, num_layers=a.num_layers)
    else:
        if not a.world_size:
            raise _UsageError("planner check torchtitan: --world-size is needed")
        from planner.emit.torchtitan import JOB_MODULE

        job = ({"module": JOB_MODULE, "config": JOB_MODULE, "folder": a.job_folder} if a.job_folder
               else {"module": a.module, "config": a.titan_config})
        result = check.check_torchtitan(a.config, a.world_size, num_layers=a.num_layers, **job)
    out.print(_clean(result.line()), markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK if result.ok else EXIT_INFEASIBLE


def _json_file(path: str):
    """A JSON file of at most 1 MiB, or one PlannerError line naming the file and the reason."""
    from planner.outputs import shown_path

    try:
        with open(path, "rb") as f:
            return json.loads(f.read(1 << 20).decode("utf-8"))
    except OSError as e:
        raise PlannerError(f"{shown_path(path)}: cannot read ({e.strerror or type(e).__name__})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlannerError(f"{shown_path(path)}: not valid JSON ({type(e).__name__})") from None


def _megatron_file_payload(path: str, a) -> dict:
    """megatron_args.json as the emitter writes it, every field checked (one line naming it)."""
    from planner import check
    from planner.outputs import shown_path

    payload = _json_file(path)
    if not isinstance(payload, dict):
        raise PlannerError(f"{shown_path(path)}: expected a JSON object with 'args' and 'world_size'")
    args, env = payload.get("args", []), payload.get("env") or {}
    world = a.world_size or payload.get("world_size") or 1
    arch = payload.get("gpu_arch", a.gpu_arch)
    if not isinstance(args, list) or not all(isinstance(x, str) for x in args):
        raise PlannerError(f"{shown_path(path)}: field 'args' must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise PlannerError(f"{shown_path(path)}: field 'env' must map strings to strings")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_GPUS:
        raise PlannerError(f"{shown_path(path)}: field 'world_size' must be a whole number from 1 to {MAX_GPUS}")
    if isinstance(arch, bool) or not isinstance(arch, int) or not 7 <= arch <= 12:
        raise PlannerError(f"{shown_path(path)}: field 'gpu_arch' must be a whole number from 7 to 12")
    return check.megatron_payload(args, world, env, arch)


def _cmd_report(a, out: Console) -> int:
    from planner.outputs import write_file
    from planner.review import REPORT_MARKER, pareto_front, review_html

    model, cluster, training = _problem(a)
    cons = _constraints(a)
    path = check_file(a.out or "report.html", REPORT_MARKER, force=a.force)  # before the work
    r = plan(model, cluster, training, top_k=a.top_k, time_limit_s=a.time_limit, framework=a.framework, **cons)
    front = pareto_front(model, cluster, training, framework=a.framework, time_limit_s=a.time_limit, **cons) \
        if r.best is not None else []
    write_file(path, review_html(r, front).encode("utf-8"), REPORT_MARKER, force=a.force)
    out.print(f"wrote {path}", markup=False, highlight=False)
    return _exit_code(r)


def _csv_list(name: str, text: str, cast):
    try:
        vals = [cast(v) for v in text.split(",") if v.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        raise _UsageError(f"--{name}: expected a comma-separated list, got {text!r}") from None
    if not vals:
        raise _UsageError(f"--{name}: empty list")
    return vals


def _cmd_sweep(a, out: Console) -> int:
    from rich.progress import Progress

    from planner.sweep import CSV_MARKER, PNG_MARKER, grid, min_gpus_that_fit, plot_sweep, run_sweep, write_csv

    models = _csv_list("models", a.models, str)
    clusters = _csv_list("clusters", a.clusters, str)
    for m in models:  # fail fast, in this process, on unknown names and unusable outputs
        load_model(m)
    for c in clusters:
        load_cluster(c)
    check_file(a.out, CSV_MARKER, force=a.force)
    if a.plot:
        check_file(a.plot, PNG_MARKER, force=a.force)
    points = grid(models, clusters, _csv_list("nodes", a.nodes, _positive_int),
                  _csv_list("seq-lengths", a.seq_lengths, _positive_int), a.global_batch_size, a.tokens,
                  a.framework, a.time_limit)
    with Progress(console=out, transient=True) as bar:
        task = bar.add_task(f"planning {len(points)} grid points", total=len(points))
        rows = run_sweep(points, workers=a.workers, progress=lambda _row: bar.advance(task))
    write_csv(rows, a.out, force=a.force)
    t = Table(title="minimum GPUs that fit", title_justify="left")
    for col in ("model", "cluster", "seq", "GPUs"):
        t.add_column(col)
    for (m, c, s), g in min_gpus_that_fit(rows).items():
        sizes = [r["gpus"] for r in rows if r["cluster"] == c and "gpus" in r]
        _row(t, m, c, str(s), str(g) if g else (f"> {max(sizes)}" if sizes else "-"))
    out.print(t)
    if a.plot:
        plot_sweep(rows, a.plot, force=a.force)
    out.print(f"wrote {a.out}" + (f" and {a.plot}" if a.plot else ""), markup=False, highlight=False)
    return EXIT_OK


def _cmd_calibrate(a, out: Console) -> int:
    from planner.calibration import CALIBRATED_MARKER, calibrate, calibrated_yaml, observation
    from planner.logs import read_log
    from planner.outputs import write_file

    model, cluster = load_model(a.model), load_cluster(a.cluster)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", cluster.name)
    path = check_file(a.out or f"{stem}-calibrated.yaml", CALIBRATED_MARKER, force=a.force)  # before the work
    runs = []
    for log in a.logs:
        m = read_log(log)
        training = layout = None
        if not m.args:
            stated = {"--global-batch-size": "train_batch_size", "--nodes": "world_size"}  # DeepSpeed prints these
            for flag, value in (("--global-batch-size", a.global_batch_size), ("--seq-length", a.seq_length),
                                ("--nodes", a.nodes)):
                if value is None and stated.get(flag) not in m.config:
                    raise _UsageError(f"{flag}: {m.source} has no argument dump ({m.framework}); give {flag} "
                                      "and the layout flags")
            kernels = a.kernels or ("fused" if m.framework in ("megatron", "nemo") else "unfused")
            titan = m.framework == "torchtitan"
            if a.loss_chunks is not None and not titan:
                raise _UsageError(f"--loss-chunks: {m.source} is a {m.framework} log; a chunked loss is torchtitan's")
            if a.optimizer_impl == "apex" and m.framework != "nemo":
                raise _UsageError(f"--optimizer-impl: {m.source} is a {m.framework} log; apex (distributed_fused_adam) "
                                  "is NeMo's")
            training = TrainingSpec(global_batch_size=a.global_batch_size or 1, seq_length=a.seq_length,
                                    **({"fp8": a.fp8} if a.fp8 else {}),  # else the log's own (calibration.observation)
                                    grad_dtype=a.grad_dtype, kernels=kernels, optimizer_offload=a.optimizer_offload,
                                    cross_entropy=a.cross_entropy,
                                    loss_chunks=(a.loss_chunks or TORCHTITAN_LOSS_CHUNKS) if titan else 1,
                                    # torchtitan's FSDP2 (DeepSpeed's engine: deepspeed_setup, where ZeRO is on)
                                    optimizer_impl=FRAMEWORK_ENGINES["torchtitan"] if titan else
                                    "apex" if a.optimizer_impl == "apex" else None)
            layout = _layout_from_args(a)
            if a.dp is None and a.nodes is not None:
                mp, world = layout.tp * layout.pp * layout.cp, a.nodes * cluster.gpus_per_node
                if world % mp:
                    raise _UsageError(f"--dp: tp*pp*cp = {mp} does not divide the {world} GPUs of --nodes {a.nodes}")
                layout = layout.model_copy(update={"dp": world // mp})
        runs.append(observation(m, model, training, layout))
    result = calibrate(cluster, runs)
    write_file(path, calibrated_yaml(result).encode("utf-8"), CALIBRATED_MARKER, force=a.force)
    if a.json:
        from planner.report import calibration_dict
        out.print_json(json.dumps(calibration_dict(result, str(path))))
        return EXIT_OK
    t = Table(title="step time: measured and predicted (error vs measured)", title_justify="left")
    for col in ("run", "layout", "measured s", "catalog", "calibrated", "left out", "peak GiB meas / cal"):
        t.add_column(col, justify="left" if col in ("run", "layout") else "right")
    for r, o in zip(result.runs, runs):
        lo = f"{r.left_out_s:.3f} ({r.left_out_s / r.measured_s - 1:+.1%})" if r.left_out_s is not None else "-"
        mem = f"{r.measured_peak / GiB:.1f} / {r.after_peak / GiB:.1f}" if r.measured_peak else "-"
        recipe = f" [fp8={o.training.fp8}]" if o.training.fp8 else ""
        _row(t, r.label, o.layout.short() + recipe, f"{r.measured_s:.3f}",
             f"{r.before_s:.3f} ({r.before_s / r.measured_s - 1:+.1%})",
             f"{r.after_s:.3f} ({r.after_s / r.measured_s - 1:+.1%})", lo, mem)
    out.print(t)
    t = Table(title="fitted parameters (factor on the catalog value, or the amount added)", title_justify="left")
    for col in ("parameter", "fitted", "what"):
        t.add_column(col)
    from planner.calibration import PARAMETERS
    for p_ in PARAMETERS:
        _row(t, p_.name, p_.shown(result.factors[p_.name]), p_.what)
    _row(t, "memory_overhead", f"{result.overhead_before / GiB:.2f} -> {result.overhead_after / GiB:.2f} GiB",
         "per-GPU memory outside the ledger")
    out.print(t)
    e = result.error
    out.print(f"median |error|: catalog {result.median_error('before'):.1%}, calibrated {result.median_error('after'):.1%}"
              + (f", left out {result.median_error('left_out'):.1%}" if len(runs) > 1 else "")
              + f"; prediction spread now {e.step_time_sigma:.1%} (step) and {e.memory_sigma:.1%} (memory)", markup=False)
    for n in result.notes:
        out.print(f"note: {_u(n)}")
    out.print(f"wrote {path}; use it as the cluster: planner plan {_u(a.model)} {_u(path)} --nodes N ...",
              markup=False, highlight=False)
    return EXIT_OK


COMMANDS = {"sweep": _cmd_sweep, "calibrate": _cmd_calibrate, "report": _cmd_report, "check": _cmd_check, "plan": _cmd_plan, "explain": _cmd_explain, "evaluate": _cmd_evaluate, "ledger": _cmd_ledger,
            "catalog": _cmd_catalog}


def main(argv: list[str] | None = None, *, stdout=None, stderr=None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 infeasible, 2 bad input)."""
    out = Console(file=stdout or sys.stdout, width=160, emoji=False)
    err = stderr or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["plan"]
    try:
        a = build_parser().parse_args(argv)
        if a.command is None:
            raise _UsageError("planner: choose a command: " + ", ".join(COMMANDS))
        return COMMANDS[a.command](a, out)
    except _UsageError as e:
        print(f"error: {_clean(str(e))}", file=err)
        return EXIT_USAGE
    except PlannerError as e:
        print(f"error: {_clean((str(e).splitlines() or ['?'])[0])}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main())
