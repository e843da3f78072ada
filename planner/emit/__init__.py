"""Launch configurations for Megatron-LM, DeepSpeed and torchtitan, from any Plan."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.outputs import write_folder
from planner.space import LOSS_KERNELS

__all__ = ["LaunchFiles", "LAUNCH_FILE_NAMES", "dump_json", "script_word", "toml_value", "refuse_megatron_only",
           "refuse_other_engine"]


@dataclass(frozen=True)
class LaunchFiles:
    """The files of one launch configuration, written deterministically by write()."""

    framework: str
    files: dict[str, str] = field(default_factory=dict)
    """File name -> content."""
    args: tuple[str, ...] = ()
    """The training script's argument list (Megatron / torchtitan)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables the launch must export."""
    config: dict | None = None
    """The JSON config (DeepSpeed)."""

    def write(self, folder: str | Path, *, force: bool = False) -> list[Path]:
        """Write every file into `folder` (created if needed); returns the paths, sorted.

        Never writes through a symbolic link, and refuses to replace a file the planner did not
        write there (or one edited since) unless `force` (planner.outputs).
        """
        return write_folder(folder, self.files, force=force)


LAUNCH_FILE_NAMES = {
    "megatron": ("megatron_args.json", "sbatch.sh", "train.sh"),
    "deepspeed": ("ds_config.json", "launch.sh"),
    "torchtitan": ("job.toml", "train.sh", "planner_job.py"),
}
"""The files each emitter writes (checked against the output folder before any work)."""


def refuse_unemitted(plan, target: str) -> None:
    """Refuse what the plan prices and the target's config does not turn on: flash-attn's fused
    cross-entropy (no emitter), per-document attention masks (torchtitan's only)."""
    from planner.errors import PlannerError

    if plan.training.cross_entropy == "unfused" and target != "Megatron":
        raise PlannerError(f"{target}: training.cross_entropy 'unfused' is megatron-core's loss without "
                           "--cross-entropy-loss-fusion; this config runs its own")
    if plan.training.cross_entropy in LOSS_KERNELS:
        raise PlannerError(f"{target}: training.cross_entropy '{plan.training.cross_entropy}' "
                           f"({LOSS_KERNELS[plan.training.cross_entropy]}) is priced but not emitted; this config would "
                           "keep FP32 logits the plan does not count")
    if plan.training.document_tokens is not None and target != "torchtitan":  # torchtitan masks per document always
        raise PlannerError(f"{target}: training.document_tokens prices attention masked per document; this config "
                           "attends causally over the whole sequence (emit for torchtitan, or drop document_tokens)")


def refuse_other_engine(plan, target: str) -> None:
    """Refuse a plan priced with another framework's optimizer engine (TrainingSpec.optimizer_impl):
    DeepSpeed's wrapper and buckets only in DeepSpeed's config, FSDP2's bytes only in torchtitan's,
    Megatron's optimizer in Megatron's.
    Each emitter calls it after its own layout rules, which say more."""
    from planner.errors import PlannerError
    from planner.space import FRAMEWORK_ENGINES

    runs = FRAMEWORK_ENGINES.get(target.lower()) or "megatron"
    priced = plan.training.optimizer_impl or "megatron"
    if priced != runs:
        raise PlannerError(f"{target}: the plan is priced with the {priced} optimizer engine (training.optimizer_impl), "
                           f"not the {runs} one this config runs; plan with framework='{target.lower()}'")
    if plan.training.loss_chunks > 1 and target != "torchtitan":
        raise PlannerError(f"{target}: training.loss_chunks prices torchtitan's chunked loss; this config computes the "
                           "logits of the whole sequence at once (emit for torchtitan)")


def refuse_megatron_only(plan, target: str) -> None:
    """Refuse a plan whose model or workload only the Megatron emitter turns on (experts, MLA, Q/K
    norms, windows, sinks, biases, GPT-OSS's activation -- torchtitan builds the experts and Q/K norms of
    the Qwen3 MoE models in its registry; FP8 linears, BF16 Adam states): another target's config would
    drop it while the plan counts on it."""
    from planner.errors import PlannerError

    from planner.torchtitan_engine import unbuilt_features

    refuse_unemitted(plan, target)
    t, m = plan.training, plan.model
    features = unbuilt_features(m) if target == "torchtitan" else m.megatron_only
    if features:
        raise PlannerError(f"{target}: model {', '.join(features)} emitted for Megatron only; this config would build "
                           "another model (emit for Megatron)")
    if t.optimizer_states != "fp32":
        raise PlannerError(f"{target}: BF16 optimizer states (Megatron's precision-aware optimizer) are not emitted; the "
                           "plan prices memory this config would not save (emit for Megatron)")
    if t.optimizer_offload and target not in ("DeepSpeed", "torchtitan"):  # they write ZeRO-Offload / FSDP2's
        raise PlannerError(f"{target}: optimizer CPU offload is priced as Megatron's HybridDeviceOptimizer, "
                           "DeepSpeed's ZeRO-Offload or FSDP2's CPU offload; this config would keep the states on "
                           "the GPU (emit for Megatron, DeepSpeed or torchtitan)")
    from planner.space import TORCHTITAN_FP8_RECIPES

    if t.fp8 is not None and not (target == "torchtitan" and t.fp8 in TORCHTITAN_FP8_RECIPES):
        raise PlannerError(f"{target}: FP8 ('{t.fp8}') is not emitted for this target; the plan prices FP8 GEMMs "
                           "this config would not turn on (emit for Megatron, torchtitan runs fp8='rowwise')")


def dump_json(data) -> str:
    """Stable JSON (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def script_word(text: str, limit: int = 80) -> str:
    """A user-given name made safe to stand unquoted anywhere in a shell script, a SLURM directive
    or a TOML comment: every character outside [A-Za-z0-9._+-] becomes '_', and it is shortened."""
    return _SAFE.sub("_", text)[:limit] or "_"


def toml_value(value) -> str:
    """A TOML value from a str, bool, int or finite float (strings escaped as TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in ('"', "\\"):
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04X}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    raise TypeError(f"no TOML form for {type(value).__name__}")
