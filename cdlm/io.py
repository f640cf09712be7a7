"""Safe file writes: atomic replacement, and a lock that keeps two runs out of one folder.

An atomic write goes to a temporary file in the same folder, is flushed to disk, then renamed over
the target, so a crash, a kill or an error never leaves half a file (or destroys the previous
one), and two writers of one path leave one whole file: the last to finish.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:  # POSIX; elsewhere folder locks are not enforced
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from other users
    try:
        yield Path(tmp)
        _fsync(tmp)  # the rename must not reach the disk before the data
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _fsync(path: str | Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Removes the temporaries that killed atomic writes left under ``folder`` (hidden names
    ending ``.tmp``: ``atomic_path``'s files, the tokenizer's folder) and returns them. Only for a
    folder its caller holds the lock of: a live writer's temporary would go too."""
    found = sorted(Path(folder).rglob(".*.tmp"), key=lambda p: len(p.parts), reverse=True)
    for path in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return found


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


class FolderInUse(ValueError):
    """Another process holds the folder's lock (bad input: choose another folder)."""


_held: dict[Path, tuple[int, int]] = {}  # folder -> (fd, depth): re-entrant within a process


@contextmanager
def folder_lock(folder: str | Path, name: str = ".cdlm.lock") -> Iterator[None]:
    """Holds an exclusive lock on ``folder`` (created if missing) for the block, or raises
    ``FolderInUse`` at once. The lock is ``flock`` on ``folder/name``: the kernel drops it when
    the holder exits, even by SIGKILL, so a killed run never blocks its own resumption. The
    same process may take it again (nested), which a second open file would not allow."""
    folder = Path(folder).resolve()
    if fcntl is None:
        yield
        return
    if folder in _held:
        fd, depth = _held[folder]
        _held[folder] = (fd, depth + 1)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise FolderInUse(
                f"{folder} is in use by another run (pid {holder or '?'}); two runs cannot share "
                "one output folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[folder] = (fd, 1)
    try:
        yield
    finally:
        fd, depth = _held[folder]
        if depth > 1:
            _held[folder] = (fd, depth - 1)
        else:
            del _held[folder]
            os.close(fd)  # releases the lock; the file stays (unlinking it would race)
