"""Writing output files safely: never through a symbolic link, never over a file the planner did
not write (unless forced), atomically, and checked before the work so a bad target fails first.

Launch folders carry a manifest (MANIFEST: file name -> SHA-256 of what the planner wrote), so a
file the planner wrote and nobody edited may be rewritten, and anything else is left alone.
Single files (a report, a sweep CSV or plot) are recognised by a marker the planner puts in them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from planner.errors import PlannerError

__all__ = ["MANIFEST", "check_folder", "write_folder", "check_file", "write_file", "shown_path"]

MANIFEST = ".planner-files.json"
"""The manifest of a launch folder: which files the planner wrote there, with their digests."""


def shown_path(path: Path | str) -> str:
    """A path for a one-line message: shortened, and quoted when it holds odd characters."""
    text = str(path)
    if len(text) > 120:
        text = text[:60] + "..." + text[-40:]
    return text if text.isprintable() else repr(text)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fail(path: Path, what: str) -> PlannerError:
    return PlannerError(f"{shown_path(path)}: {what}")


def _read_manifest(folder: Path) -> dict[str, str]:
    p = folder / MANIFEST
    if p.is_symlink():
        raise _fail(p, "is a symbolic link; refusing to read or write through it")
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # an unreadable manifest vouches for nothing
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def _existing_ok(p: Path, force: bool, ours: Callable[[Path], bool]) -> None:
    """Refuse a target that is a link, not a regular file, or (unless forced) not the planner's."""
    try:
        if p.is_symlink():
            raise _fail(p, "is a symbolic link; refusing to write through it (remove it first)")
        if not p.exists():
            return
        if not p.is_file():
            raise _fail(p, "exists and is not a regular file")
        if not force and not ours(p):
            raise _fail(p, "exists and was not written by planner (or was edited since); pass --force to overwrite")
    except OSError as err:
        raise _fail(p, f"cannot inspect ({err.strerror or err})") from None


def check_folder(folder: str | Path, names: Iterable[str], *, force: bool = False) -> Path:
    """Make sure `folder` can receive `names` (creating it if needed); returns it as a Path.

    Raises:
        PlannerError: the folder is a file or cannot be created or written, or a target is a link,
            not a regular file, or a file the planner did not write (without force).
    """
    out = Path(folder)
    try:
        if out.exists():
            if not out.is_dir():
                raise _fail(out, "exists and is not a folder")
        else:
            out.mkdir(parents=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise _fail(out, "the folder is not writable")
    except OSError as err:
        raise _fail(out, f"cannot create the folder ({err.strerror or err})") from None
    manifest = _read_manifest(out)
    for name in names:
        _existing_ok(out / name, force, lambda p: manifest.get(p.name) == _digest(p.read_bytes()))
    return out


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write a temporary file beside `path`, then rename it over `path` (a link there is replaced,
    never followed)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".planner-", dir=path.parent)
    except OSError as err:
        raise _fail(path.parent, f"cannot write ({err.strerror or err})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _fail(path, f"cannot write ({err.strerror or err})") from None


def write_folder(folder: str | Path, files: dict[str, str], *, force: bool = False) -> list[Path]:
    """Write `files` (name -> text) into `folder`; scripts (*.sh) are made executable.

    Returns the written paths, sorted by name. The folder's manifest records each file's digest.
    """
    out = check_folder(folder, files, force=force)
    manifest = _read_manifest(out)
    paths = []
    for name in sorted(files):
        data = files[name].encode("utf-8")
        _atomic_write(out / name, data, 0o755 if name.endswith(".sh") else 0o644)
        manifest[name] = _digest(data)
        paths.append(out / name)
    _existing_ok(out / MANIFEST, True, lambda p: True)
    _atomic_write(out / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    return paths


def check_file(path: str | Path, marker: bytes, *, force: bool = False) -> Path:
    """Make sure `path` can be written: its folder exists and is writable, and it is absent, or a
    regular file holding `marker` (the planner's own), or `force` is given.

    Raises:
        PlannerError: one line naming the path and the reason.
    """
    p = Path(path)
    parent = p.parent
    try:
        if p.name in ("", ".", ".."):
            raise _fail(p, "is a folder; give a file name")
        if not parent.is_dir():
            raise _fail(parent, "no such folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise _fail(parent, "the folder is not writable")
    except OSError as err:
        raise _fail(p, f"cannot use this path ({err.strerror or err})") from None

    def ours(q: Path) -> bool:
        with open(q, "rb") as f:
            return marker in f.read(1 << 16)

    _existing_ok(p, force, ours)
    return p


def write_file(path: str | Path, data: bytes, marker: bytes, *, force: bool = False) -> Path:
    """Write one file atomically after check_file; `data` must contain `marker`."""
    if marker not in data[: 1 << 16]:
        raise PlannerError("internal: output written without the planner's marker; please report this")
    p = check_file(path, marker, force=force)
    _atomic_write(p, data, 0o644)
    return p
