"""Training logs: step time and peak memory as Megatron-LM, Megatron-Bridge/NeMo, torchtitan and
DeepSpeed print them.

Each format is read from the framework's source (the line it prints is quoted beside its parser):
- Megatron-LM [NVIDIA/Megatron-LM@d98e8a6 megatron/training/training.py:training_log] prints, on the
  last rank every --log-interval iterations,
  `` [YYYY-mm-dd HH:MM:SS.ffffff] iteration      I/     N | consumed samples: … | elapsed time per
  iteration (ms): X | …``, the time averaged over the interval; [megatron/training/utils/
  common_utils.py:report_memory] prints per DP-rank-0 (one line per pipeline/tensor rank)
  ``[Rank R] (after I iterations) memory (MB) | allocated: … | max allocated: … | reserved: … |
  max reserved: …`` (MiB); [megatron/training/arguments.py:_print_args] the argument dump
  between ``---- arguments ----`` and ``---- end of arguments ----``, one ``  name ..... value`` per line.
- Megatron-Bridge [NVIDIA-NeMo/Megatron-Bridge@067f987 src/megatron/bridge/training/utils/
  train_utils.py:training_log] prints the same iteration line (timestamp without fractions) and
  ``[Rank R] (after I iterations) memory (GB) | mem-max-reserved-gigabytes: X | …`` (1e9 bytes);
  NeMo 2 (Lightning) prints ``… | train_step_timing in s: X | …``.
- torchtitan [pytorch/torchtitan@b5bcd76 torchtitan/components/metrics.py:MetricsProcessor.log]:
  ``step: S  loss: …  grad_norm: …  memory: X.XXGiB(P%)  tps: N,NNN  tflops: …  mfu: …%`` (ANSI
  colours optional) — memory is the peak *reserved* GiB since the last line, tps tokens per second
  per device divided by the non-data-parallel size (= tokens/s per GPU).
- DeepSpeed [deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/config.py:DeepSpeedConfig.print] logs its
  configuration as ``[config.py:N:print]   name ....... value`` (dots pad to 29), and
  [deepspeed/utils/timer.py:ThroughputTimer.stop]:
  ``epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=X, CurrSamplesPerSec=Y,
  MemAllocated=AGB, MaxMemAllocated=BGB`` (samples = the global train batch, engine.py);
  [deepspeed/runtime/utils.py:see_memory_usage] ``MA x GB  Max_MA x GB  CA x GB  Max_CA x GB``
  (GiB; Max_CA = peak reserved, rounded to whole GiB).

Megatron-DeepSpeed prints Megatron's iteration line and DeepSpeed's: the former is the step time.
Warm-up is skipped: the first logged step of each run (it carries compilation, allocator growth
and NCCL set-up) and every step numbered ≤ WARMUP_STEPS; the measurement is the median of the
steady-state steps. Peak memory is the largest peak *reserved* over the ranks that print it (what
the planner's peak — ledger plus overhead — is compared with); where a log has only allocated
bytes, that is used and named.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from planner.errors import PlannerError

__all__ = ["LogError", "LogMeasurement", "LowPrecision", "parse_log", "read_log", "WARMUP_STEPS", "MAX_LOG_BYTES"]

WARMUP_STEPS = 3
"""Steps numbered up to this are warm-up (in addition to the first logged step)."""

MAX_LOG_BYTES = 256 << 20
"""Logs larger than 256 MiB are refused (read the tail of a longer one)."""

Framework = Literal["megatron", "nemo", "torchtitan", "deepspeed"]
Rate = Literal["step_s", "tokens_per_s_per_gpu", "samples_per_s"]


class LogError(PlannerError, ValueError):
    """A training log could not be read: names the file and line and what was expected."""


@dataclass(frozen=True)
class LowPrecision:
    """The low-precision recipe a torchtitan log shows its converters applied: to the linears ('rowwise' or
    'rowwise_with_gw_hp' as Float8LinearConverter names its recipe, 'float8' where an older torchtitan names
    none, 'torchao-mxfp8', or 'none') and to the routed experts ('rowwise', 'torchao-mxfp8', or None)."""

    linears: str
    experts: str | None = None

    @property
    def recipe(self) -> str | None:
        """The TrainingSpec.fp8 the log names: its linears' recipe where it is one the planner prices by that
        name ('rowwise', 'torchao-mxfp8'), else None (BF16, or a float8 line that names no recipe)."""
        return self.linears if self.linears in ("rowwise", "torchao-mxfp8") else None

    def problem(self, fp8: str | None, moe: bool) -> str | None:
        """Why a workload with TrainingSpec.fp8 = `fp8` is not the run this log shows (one line), or None."""
        ran = None if self.linears == "none" else self.linears
        if self.linears == "rowwise_with_gw_hp":
            return "torchtitan ran float8 'rowwise_with_gw_hp' (weight gradients in high precision), which is not priced"
        if (moe and ran is not None) or self.experts is not None:  # the planner prices both in one recipe
            if self.experts != ran:
                return (f"torchtitan ran its linears in {ran or 'BF16'} and its routed experts in "
                        f"{self.experts or 'BF16'}, which is not priced (one recipe for both)")
        if fp8 == ran or (ran == "float8" and fp8 in ("rowwise", "torchao-tensorwise")):
            return None
        said = f"its linears in torchao {ran}" if ran else "its linears in BF16 (no quantisation converter in its log)"
        give = ("leave fp8 unset (drop --fp8)" if ran is None else
                "give fp8 'rowwise' or 'torchao-tensorwise' (--fp8)" if ran == "float8" else f"give fp8 '{ran}' (--fp8 {ran})")
        return f"torchtitan ran {said}, the workload says fp8={fp8!r}: {give}"


@dataclass(frozen=True)
class LogMeasurement:
    """What one training log measured (steady state)."""

    source: str
    """The file name (or '<text>')."""
    framework: Framework
    rate: Rate
    """What `value` is: seconds per step, tokens/s per GPU (torchtitan) or global samples/s (DeepSpeed)."""
    value: float
    """Median over the steady-state steps."""
    steps: tuple[int, ...]
    """The step numbers the median is taken over."""
    peak_memory_bytes: float | None = None
    memory_kind: Literal["max reserved", "max allocated"] | None = None
    args: dict[str, str] = field(default_factory=dict, repr=False)
    """Megatron's argument dump, name → printed value (empty where the log has none)."""
    config: dict[str, str] = field(default_factory=dict, repr=False)
    """DeepSpeed's printed configuration (DeepSpeedConfig.print: train_batch_size,
    train_micro_batch_size_per_gpu, zero_optimization_stage, world_size = the data-parallel size, ...)."""
    compiled: bool | None = None
    """torchtitan: whether it compiled its blocks -- True where the log has the line apply_compile prints
    ('Compiling each TransformerBlock with torch.compile'), False where it shows the model being built (the
    'Model … size: N total parameters' line, logged before the model is parallelised and compiled) without
    it, None where the log starts later [pytorch/torchtitan@b5bcd76 torchtitan/distributed/compile.py:
    apply_compile; trainer.py: Trainer.__init__; the same lines at 9dec370, parallelize_llama.py, train.py]."""

    low_precision: LowPrecision | None = None
    """torchtitan: what its quantisation converters logged while building the model config (before the model's
    size line), None where the log starts later [torchtitan 0.3 components/quantization/float8.py:
    Float8LinearConverter ('Float8 training active with recipe R'), Float8GroupedExpertsConverter; mx.py:
    MXFP8LinearConverter ('Converted Linear layers to MXFP8Linear'), MXFP8GroupedExpertsConverter]."""

    def step_time_s(self, global_batch_size: int, seq_length: int, num_gpus: int) -> float:
        """Seconds per optimizer step, whatever the framework printed."""
        if self.rate == "step_s":
            return self.value
        if self.rate == "samples_per_s":
            return global_batch_size / self.value
        return global_batch_size * seq_length / (self.value * num_gpus)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_MEGATRON_MEM = re.compile(r"\(after (\d+) iterations\) memory \((MB|GB)\)\s*\|(.*)$")
_NEMO_STEP = re.compile(r"train_step_timing in s:\s*" + _NUM)
_NEMO_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)")
_NEMO_GLOBAL_STEP = re.compile(r"global_step:\s*" + _NUM)
_TITAN = re.compile(r"\bstep:\s*(\d+)\s+loss:.*?memory:\s*" + _NUM + r"\s*GiB.*?\btps:\s*" + _NUM)
_TITAN_SIZE = re.compile(r"\bsize: [\d,]+ total parameters")
_TITAN_COMPILE = "Compiling each TransformerBlock with torch.compile"
_TITAN_FLOAT8 = re.compile(r"Float8 training active(?: with recipe (\w+))?")
_TITAN_MXFP8 = "Converted Linear layers to MXFP8Linear"
_TITAN_EXPERTS = re.compile(r"Converted GroupedExperts to use dynamic (float8 rowwise|mxfp8\w*) ")
_DS_TPUT = re.compile(r"global_step=(\d+),\s*RunningAvgSamplesPerSec=" + _NUM + r",\s*CurrSamplesPerSec=" + _NUM
                      + r"(?:,\s*MemAllocated=" + _NUM + r"GB,\s*MaxMemAllocated=" + _NUM + r"GB)?")
_DS_MEM = re.compile(r"\bMA\s+" + _NUM + r"\s*GB\s+Max_MA\s+" + _NUM + r"\s*GB\s+CA\s+" + _NUM + r"\s*GB\s+Max_CA\s+"
                     + _NUM + r"\s*GB")
_DS_CONFIG = re.compile(r"\[config\.py:\d+:print\]\s+(\w+) (?:\.+ | )(\S.*)$")
_ARGS_BEGIN = re.compile(r"^-+ arguments -+\s*$")
_ARGS_END = re.compile(r"^-+ end of arguments -+\s*$")
_ARG = re.compile(r"^\s+(\S+) \.+ (.*)$")

MIB, GIB = 2**20, 2**30
MAX_LINE = 1 << 16
"""Lines longer than 64 KiB are not read (step and memory lines are a few hundred bytes; a longer
line is a dump, and the patterns should not scan it)."""


def _number(text: str, where: str) -> float:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        raise LogError(f"{where}: '{text}' is not a number") from None
    if not math.isfinite(value):
        raise LogError(f"{where}: '{text}' is not a finite number")
    return value


def _memory(text: str, where: str) -> float:
    value = _number(text, where)
    if value < 0:
        raise LogError(f"{where}: memory '{text}' is negative")
    return value


def _steady(points: list[tuple[int, float]], where: str, what: str) -> tuple[float, tuple[int, ...]]:
    """Median of the steady-state points (drops the first logged step and steps ≤ WARMUP_STEPS)."""
    if not points:
        raise LogError(f"{where}: no {what} found")
    first = points[0][0]
    steady = [(s, v) for s, v in points if s != first and s > WARMUP_STEPS]
    if not steady:
        steps = ", ".join(str(s) for s, _ in points)
        raise LogError(f"{where}: only warm-up steps ({steps}); log more steps (the first logged step "
                       f"and steps ≤ {WARMUP_STEPS} are skipped)")
    bad = [s for s, v in steady if v <= 0]
    if bad:
        raise LogError(f"{where}: step {bad[0]}: {what} must be positive")
    return statistics.median(v for _, v in steady), tuple(s for s, _ in steady)


def _fields(tail: str) -> dict[str, str]:
    """'a: 1 | b: 2 |' → {'a': '1', 'b': '2'}."""
    out = {}
    for part in tail.split("|"):
        if ":" in part:
            key, _, value = part.partition(":")
            out[key.strip()] = value.strip()
    return out


def _megatron_args(lines: list[str], where: str) -> dict[str, str]:
    args: dict[str, str] = {}
    inside = False
    for i, line in enumerate(lines, 1):
        if _ARGS_BEGIN.match(line):
            inside, args = True, {}
        elif _ARGS_END.match(line):
            inside = False
        elif inside:
            m = _ARG.match(line)
            if m:
                args[m.group(1)] = m.group(2).strip()
    if inside:
        raise LogError(f"{where}: the argument dump starts but never ends (truncated log?)")
    return args


def parse_log(text: str, source: str = "<text>") -> LogMeasurement:
    """The steady-state step time and peak memory of one training log (format detected).

    Raises:
        LogError: no known step line, only warm-up steps, or a malformed number (names the line).
    """
    lines = [_ANSI.sub("", raw).rstrip("\r") for raw in text.split("\n")]
    megatron, nemo, titan, ds = [], [], [], []
    titan_mem, ds_mem_alloc = [], []
    titan_built = titan_compiled = False
    titan_linears = titan_experts = None
    mem_reserved: list[float] = []
    mem_allocated: list[float] = []
    ds_config: dict[str, str] = {}
    for i, line in enumerate(lines, 1):
        where = f"{source}:{i}"
        if len(line) > MAX_LINE:
            continue
        if (m := _DS_CONFIG.search(line)):
            ds_config[m.group(1)] = m.group(2).strip()
            continue
        if (m := _MEGATRON_ITER.search(line)) and "elapsed time per iteration" in line:
            e = _ELAPSED.search(m.group(3))
            if not e:
                raise LogError(f"{where}: iteration line without 'elapsed time per iteration (ms): <number>'")
            megatron.append((int(m.group(1)), _number(e.group(1), where) / 1e3))
        elif (m := _MEGATRON_MEM.search(line)):
            f, scale = _fields(m.group(3)), (MIB if m.group(2) == "MB" else 1e9)
            reserved = f.get("max reserved", f.get("mem-max-reserved-gigabytes"))
            allocated = f.get("max allocated", f.get("mem-max-allocated-gigabytes"))
            if reserved is None and allocated is None:
                raise LogError(f"{where}: memory line without 'max reserved' or 'max allocated'")
            if reserved is not None:
                mem_reserved.append(_memory(reserved, where) * scale)
            if allocated is not None:
                mem_allocated.append(_memory(allocated, where) * scale)
        elif (m := _NEMO_STEP.search(line)):
            it = _NEMO_ITER.search(line) or _NEMO_GLOBAL_STEP.search(line)
            step = int(float(it.group(1).replace(",", ""))) if it else len(nemo) + 1
            nemo.append((step, _number(m.group(1), where)))
        elif _TITAN_COMPILE in line:
            titan_compiled = True
        elif (m := _TITAN_FLOAT8.search(line)):
            titan_linears = m.group(1) or "float8"
        elif _TITAN_MXFP8 in line:
            titan_linears = "torchao-mxfp8"
        elif (m := _TITAN_EXPERTS.search(line)):
            titan_experts = "rowwise" if m.group(1) == "float8 rowwise" else "torchao-mxfp8"
        elif _TITAN_SIZE.search(line):
            titan_built = True
        elif (m := _TITAN.search(line)):
            titan.append((int(m.group(1)), _number(m.group(3), where)))
            titan_mem.append((int(m.group(1)), _memory(m.group(2), where) * GIB))
        elif (m := _DS_TPUT.search(line)):
            ds.append((int(m.group(1)), _number(m.group(3), where)))
            if m.group(5) is not None:
                ds_mem_alloc.append(_memory(m.group(5), where) * GIB)
        elif (m := _DS_MEM.search(line)):
            mem_reserved.append(_memory(m.group(4), where) * GIB)
            mem_allocated.append(_memory(m.group(2), where) * GIB)
        elif "elapsed time per iteration" in line or "train_step_timing" in line or "CurrSamplesPerSec" in line:
            raise LogError(f"{where}: a step line in an unexpected shape: {line.strip()[:120]!r}")
    if megatron:  # Megatron-DeepSpeed prints both: Megatron's iteration line is the step
        ds = []
    found = [name for name, pts in (("megatron", megatron), ("nemo", nemo), ("torchtitan", titan),
                                    ("deepspeed", ds)) if pts]
    if not found:
        raise LogError(f"{source}: no training step lines of Megatron-LM/Megatron-Bridge ('elapsed time per "
                       "iteration (ms)'), NeMo ('train_step_timing in s'), torchtitan ('step: … tps: …') or "
                       "DeepSpeed ('CurrSamplesPerSec=')")
    if len(found) > 1:
        raise LogError(f"{source}: step lines of several frameworks ({', '.join(found)}): give one run per log")
    fw = found[0]
    args = _megatron_args(lines, source) if fw in ("megatron", "nemo") else {}
    if fw in ("megatron", "nemo"):
        value, steps = _steady(megatron or nemo, source, "step times")
        rate: Rate = "step_s"
        if fw == "megatron" and any("memory (GB)" in ln for ln in lines):
            fw = "nemo"  # Megatron-Bridge prints the Megatron iteration line and its own memory line
    elif fw == "torchtitan":
        value, steps = _steady(titan, source, "tps values")
        rate = "tokens_per_s_per_gpu"
        mem_reserved = [v for s, v in titan_mem if s in steps]
    else:
        value, steps = _steady(ds, source, "CurrSamplesPerSec values")
        rate = "samples_per_s"
        mem_allocated = mem_allocated + ds_mem_alloc
    if mem_reserved:
        peak, kind = max(mem_reserved), "max reserved"
    elif mem_allocated:
        peak, kind = max(mem_allocated), "max allocated"
    else:
        peak, kind = None, None
    compiled = (True if titan_compiled else False if titan_built else None) if fw == "torchtitan" else None
    converted = titan_linears is not None or titan_experts is not None
    low = None
    if fw == "torchtitan" and (converted or titan_built):
        low = LowPrecision(titan_linears or "none", titan_experts)
    return LogMeasurement(source=source, framework=fw, rate=rate, value=value, steps=steps,
                          peak_memory_bytes=peak, memory_kind=kind, args=args, config=ds_config, compiled=compiled,
                          low_precision=low)


def read_log(path: str | Path) -> LogMeasurement:
    """parse_log on a file (UTF-8; undecodable bytes replaced, as logs hold stray binary)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_LOG_BYTES:
            raise LogError(f"{p.name}: {size / MIB:.0f} MiB is over the {MAX_LOG_BYTES // MIB} MiB limit "
                           "(pass the tail of the log)")
        text = p.read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        raise LogError(f"{p}: cannot read the log ({err.strerror or err})") from None
    return parse_log(text, source=p.name)
