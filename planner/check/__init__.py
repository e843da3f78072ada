"""Run the frameworks' own validators on a CPU: Megatron-LM, DeepSpeed and torchtitan.

Install with the `validate` extra (torch==2.13.0 CPU first). Megatron is found through
MEGATRON_PATH (a folder holding `megatron/`: an unpacked megatron-core >= 0.17 wheel or a
Megatron-LM checkout) or the installed package. None of the frameworks' code is copied here:
these functions call it, with the few stand-ins a CPU needs (documented where they are made).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from planner.check._megatron_worker import READY, VERDICT  # its module imports the standard library only

__all__ = ["CheckResult", "check_megatron", "check_deepspeed", "check_torchtitan", "megatron_payload",
           "megatron_available", "fetch_megatron", "MEGATRON_CORE"]

MEGATRON_CORE = "megatron-core==0.19.2"


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one validation."""

    ok: bool
    stage: str
    """Where it stopped ('done' when accepted): argparse, validate_args, microbatches, model_config,
    groups, layer_split, schedule_rule, config, ..."""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """One line for humans."""
        if self.ok:
            return "OK " + " ".join(f"{k}={_shown(v)}" for k, v in sorted(self.details.items()))
        return f"ERROR [{self.stage}] {self.message}"


def _shown(value) -> str:
    """A detail as the line shows it: a list of more than eight items by its first three and its length."""
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(map(repr, value[:3]))}, ... ({len(value)} items)]"
    return str(value)


def megatron_payload(args: list[str], world_size: int, env: dict[str, str] | None = None, gpu_arch: int = 9) -> dict:
    """What the Megatron worker validates: pretrain_gpt.py arguments, world size, environment, GPU arch."""
    return {"args": list(args), "world_size": int(world_size), "env": dict(env or {}), "gpu_arch": int(gpu_arch)}


def megatron_available() -> bool:
    """Whether `megatron.training` can be imported (through MEGATRON_PATH or the installed package)."""
    import importlib.util

    path = os.environ.get("MEGATRON_PATH")
    if path:
        return os.path.isfile(os.path.join(path, "megatron", "training", "arguments.py"))
    return importlib.util.find_spec("megatron") is not None and \
        importlib.util.find_spec("megatron.training") is not None


def fetch_megatron(folder: str) -> str:
    """Download the megatron-core 0.19.2 wheel and unpack it into `folder`; returns a MEGATRON_PATH.

    Its wheels since 0.17 (the first to ship megatron/training) are cp312-only, and pip on Python
    3.11 silently falls back to 0.16.1, which lacks megatron/training (launch-configs.md §0). The
    wheel is pure Python for everything validation touches, so it is unpacked, not installed.
    """
    import glob
    import shutil
    import tempfile
    import zipfile

    from planner.errors import PlannerError

    target = os.path.join(folder, "megatron-core")
    if os.path.isfile(os.path.join(target, "megatron", "training", "arguments.py")):
        return target
    os.makedirs(folder, exist_ok=True)
    wheels = tempfile.mkdtemp(prefix="wheels.", dir=folder)  # per process, as the unpacking below
    try:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "-d", wheels, MEGATRON_CORE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = glob.glob(os.path.join(wheels, "megatron_core-0.19.2-*.whl"))
        if done.returncode != 0 or not found:
            raise PlannerError(f"could not download {MEGATRON_CORE}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        # unpacked beside the target and renamed into place (atomic): a second process fetching into
        # the same folder at once (parallel test workers) never sees a half-written tree
        staging = tempfile.mkdtemp(prefix="megatron-core.", dir=folder)
        with zipfile.ZipFile(found[0]) as z:
            z.extractall(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process put a complete tree there first
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
    return target


_WORKERS: dict[tuple, tuple[subprocess.Popen, Any]] = {}
"""One Megatron worker per interpreter, folder and import path (MEGATRON_PATH, PYTHONPATH), started
on first use and kept for the process's later checks (importing Megatron and torch is most of a
check's time); it exits when its stdin closes."""


def _read_lines(proc: subprocess.Popen, count: int, deadline: float) -> list[str] | None:
    """`count` verdict lines from the worker's stdout (without their prefix; other lines are
    Megatron's prints) before `deadline` (time.monotonic), None if it closes or the deadline passes
    first. Reads the raw pipe: a buffered reader could hold lines that select() no longer sees."""
    fd, buf, lines = proc.stdout.fileno(), b"", []
    while len(lines) < count:
        while b"\n" in buf and len(lines) < count:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(VERDICT.encode()):
                lines.append(line[len(VERDICT):].decode())
        if len(lines) == count:
            break
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    return lines  # the worker prints nothing after a batch's last verdict, so no bytes are left over


def _worker_failed(key: tuple, what: str):
    from planner.errors import PlannerError

    proc, err = _WORKERS.pop(key)
    proc.kill()
    proc.wait()
    err.seek(0)
    tail = (err.read().decode(errors="replace").strip().splitlines() or [what])[-1]
    err.close()
    return PlannerError(f"the Megatron validator could not run: {tail}")


def check_megatron(payloads: list[dict], *, timeout_s: float = 600.0) -> list[CheckResult]:
    """Validate Megatron configurations with Megatron's own code (parse_args, validate_args, the
    micro-batch calculator, TransformerConfig, process groups on torch's fake backend, the layer
    split per pipeline rank and virtual stage). One worker process imports Megatron once and forks
    a child per configuration, in this process's environment; it serves this process's later calls too.

    Raises:
        PlannerError: Megatron cannot be imported (with what to install), or the worker dies or
            runs past timeout_s.
    """
    if not payloads:
        return []
    deadline = time.monotonic() + timeout_s
    env = os.environ.copy()
    # what the import sees; each check runs in the caller's environment of the moment (the batch's env)
    key = (sys.executable, os.getcwd(), env.get("MEGATRON_PATH"), env.get("PYTHONPATH"))
    if key not in _WORKERS:
        err = tempfile.TemporaryFile()  # a file, not a pipe: a worker's warnings over many checks never fill it
        _WORKERS[key] = subprocess.Popen([sys.executable, "-m", "planner.check._megatron_worker"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         bufsize=0), err
        if _read_lines(_WORKERS[key][0], 1, deadline) != [READY]:
            raise _worker_failed(key, "no output")
    proc = _WORKERS[key][0]
    try:
        proc.stdin.write((json.dumps({"env": env, "payloads": payloads}) + "\n").encode())
    except (BrokenPipeError, OSError):
        raise _worker_failed(key, "the worker exited") from None
    lines = _read_lines(proc, len(payloads), deadline)
    if lines is None or not all(ln.startswith("{") for ln in lines):
        raise _worker_failed(key, f"no verdict within {timeout_s:.0f} s" if lines is None else "unexpected output")
    return [CheckResult(**json.loads(ln)) for ln in lines]


def check_deepspeed(config: dict | str, world_size: int, *, tp: int = 1, pp: int = 1, sp: int = 1,
                    num_layers: int | None = None) -> CheckResult:
    """Validate a ds_config with DeepSpeed's own DeepSpeedConfig, at the real world size; with
    num_layers (and pp > 1), details['stage_layers'] is the split DeepSpeed's own partitioner makes
    of Megatron-DeepSpeed's GPT model, to compare with the plan's.

    DeepSpeedConfig silently falls back to world size 1 and ignores the mpu when no process group
    exists (launch-configs.md §3.4), so its `dist` module is given a stand-in (rank 0 of
    world_size) for the call, with an mpu whose data-parallel size is world/(tp*pp*sp). The
    pipeline engine's rule (ZeRO-2/3 are rejected with PP > 1, pipe/engine.py) is re-stated.
    """
    from planner.check._deepspeed import validate

    return validate(config, world_size, tp=tp, pp=pp, sp=sp, num_layers=num_layers)


def check_torchtitan(overrides: list[str], world_size: int, *, module: str = "llama3", config: str = "llama3_8b",
                     num_layers: int | None = None, folder: str | None = None) -> CheckResult:
    """Validate torchtitan 0.3 overrides with its ConfigManager, ParallelDims and its pipeline
    stage derivation (checked against `num_layers` when the registry model has that depth); with
    `folder`, the emitted planner_job.py there can be the --module (FP8 plans), and details name the
    linears it runs in float8 and in high precision."""
    from planner.check._torchtitan import validate

    return validate(overrides, world_size, module=module, config=config, num_layers=num_layers, folder=folder)
