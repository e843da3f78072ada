"""Launch configurations for Megatron-LM, DeepSpeed and torchtitan, from any Plan."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LaunchFiles"]


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

    def write(self, folder: str | Path) -> list[Path]:
        """Write every file into `folder` (created if needed); returns the paths, sorted."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in sorted(self.files):
            p = out / name
            p.write_text(self.files[name])
            if name.endswith(".sh"):
                p.chmod(0o755)
            paths.append(p)
        return paths


def dump_json(data) -> str:
    """Stable JSON (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
