"""The data dir: one process at a time (a lock file), and the files memsvc owns in it.

The lock is taken before the model loads, so a second process on the same data dir fails
at once with a one-line error instead of after a minute, and two processes never write one
SQLite log or Milvus Lite file. Only memsvc's own files are made private (0600, the dir
0700); anything else a user keeps there is left as it is."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

LOCK_FILE = ".memsvc.lock"
# Names (and name prefixes) of what memsvc writes under the data dir.
OWNED_PREFIXES = ("events.sqlite", "embed_cache.sqlite", "milvus.db", ".milvus.db", LOCK_FILE)
OWNED_DIRS = ("model-cache",)


class DataDirBusy(RuntimeError):
    pass


_guard = threading.Lock()
_held: dict[Path, tuple[int, int]] = {}  # resolved path -> (fd, holders in this process)


def lock(path: Path) -> None:
    """Take the data dir for this process (re-entrant within it); DataDirBusy if another
    process has it."""
    path.mkdir(parents=True, exist_ok=True)
    key = path.resolve()
    with _guard:
        if key in _held:
            fd, holders = _held[key]
            _held[key] = (fd, holders + 1)
            return
        fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DataDirBusy(
                f"data dir {key} is in use by memsvc pid {holder}: one process per data dir"
                " (run more replicas on a shared database: MEMSVC_DATABASE_URL)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        _held[key] = (fd, 1)


def unlock(path: Path) -> None:
    key = path.resolve()
    with _guard:
        if key not in _held:
            return
        fd, holders = _held[key]
        if holders > 1:
            _held[key] = (fd, holders - 1)
            return
        del _held[key]
        os.close(fd)  # releases the flock


def owned(entry: Path) -> bool:
    return entry.name in OWNED_DIRS or entry.name.startswith(OWNED_PREFIXES)


def secure(path: Path) -> None:
    """The data dir 0700 and memsvc's files in it 0600 (dirs 0700), whatever the umask or
    an older version left: the event log holds raw conversation text. (`memsvc serve`
    also sets umask 077, so files created later, milvus-lite's included, are private.)"""
    path.mkdir(parents=True, exist_ok=True)
    try:
        path.chmod(0o700)
    except PermissionError:
        # e.g. a volume or tmpfs that came up owned by root, with memsvc running as its own
        # user (the image's uid 10001): say what to change, not just "Operation not permitted"
        owner = path.stat().st_uid
        raise PermissionError(
            f"data dir {path} is owned by uid {owner} and memsvc runs as uid {os.getuid()}:"
            f" it cannot make the dir private. Give it to uid {os.getuid()} (chown, or mount"
            f" a tmpfs with uid={os.getuid()},gid={os.getgid()},mode=0700)"
        ) from None
    for entry in path.iterdir():
        if entry.is_symlink() or not owned(entry):
            continue
        try:
            found = [entry, *entry.rglob("*")] if entry.is_dir() else [entry]
        except FileNotFoundError:
            continue
        for p in found:
            if not p.is_symlink():
                _private(p)


def _private(p: Path) -> None:
    # A file removed since it was listed (a journal that the store of a memsvc killed a
    # moment ago deletes, its milvus-lite child still closing) has nothing left to protect.
    with contextlib.suppress(FileNotFoundError):
        p.chmod(0o700 if p.is_dir() else 0o600)
