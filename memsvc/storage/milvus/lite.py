"""Milvus Lite: a `.db` URI names a local file served by a child process (milvus_lite's
server manager). Reconnecting after that process died means releasing it first, so the
next client starts a fresh one on the same file.

Each Milvus Lite process makes `$HOME/.cache/milvus` when it starts and removes it when it
exits: two processes of one user started together (two servers, or a test run's two
workers) raced there ("create dir … failed", then "Mmap manager has not been init"), and
one stopping pulled the directory from under another. So memsvc starts it with a home of
its own beside its file.

Its manager gives the process a fixed 0.5 s and then calls it started; on a loaded machine
it had not yet opened its socket by then, and the client's first call failed at once ("No
such file or directory", in a `make test` on 2 cores). So memsvc waits for the socket."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_ENVIRONMENT = threading.Lock()
# How long a started process may take to open its socket (it is a few ms on an idle machine).
SOCKET_WAIT_SECONDS = 60.0
# The process's memory before any collection is loaded (30 MiB with 32 collections beside a
# million rows): what a memory budget counts for it besides the rows it loads.
BASE_BYTES = 32 << 20


def start(uri: str) -> None:
    """Start (or find running) the process serving `uri`, with a private home: the process
    copies the environment when it starts, so HOME is set around that start only."""
    from milvus_lite.server_manager import server_manager_instance

    home = Path(uri).absolute().parent / ".milvus-lite"
    home.mkdir(mode=0o700, exist_ok=True)
    with _ENVIRONMENT:
        before = os.environ.get("HOME")
        os.environ["HOME"] = str(home)
        try:
            started = server_manager_instance.start_and_get_uri(uri)
        finally:
            if before is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = before
    if started is None:
        raise RuntimeError(f"Milvus Lite did not start on {uri} (is another process using it?)")
    _wait_for_socket(started.removeprefix("unix:"), uri)


def _wait_for_socket(socket_path: str, uri: str) -> None:
    from milvus_lite.server_manager import server_manager_instance

    server = server_manager_instance._servers.get(str(Path(uri).absolute().resolve()))
    process = getattr(server, "_p", None)  # the manager's only handle on it
    deadline = time.monotonic() + SOCKET_WAIT_SECONDS
    while not os.path.exists(socket_path):
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            release(uri)
            why = "exited" if exited else f"opened no socket in {SOCKET_WAIT_SECONDS:.0f} s"
            raise RuntimeError(f"Milvus Lite on {uri} {why}")
        time.sleep(0.02)


def is_lite(uri: str) -> bool:
    return uri.endswith(".db")


def release(uri: str) -> None:
    """Stop (or forget) the child process serving `uri`."""
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(uri)


def vacuum(uri: str) -> None:
    """Milvus Lite keeps rows in a SQLite file; a deleted row's bytes stay in its free pages
    until the file is rewritten. Run with the process stopped (after `release`)."""
    import sqlite3

    conn = sqlite3.connect(uri, isolation_level=None)
    try:
        conn.execute("VACUUM")
    finally:
        conn.close()


def index_primary_keys(uri: str, collection: str) -> bool:
    """Milvus Lite 2.5 keeps a collection's rows in a SQLite table of that name and finds
    the rows a delete or an upsert replaces by their primary key (`milvus_id`), which it
    does not index: every delete and upsert scanned every row, ~3 ms per 1,000 held (0.1 s
    at 30,000 chunks, 3 s at a million; benchmarks/archive/2026-11-29.md). An index makes
    that a lookup; Milvus Lite's own SQL uses it unchanged. Idempotent; a file without that
    table or column (another Milvus Lite) is left alone. Returns whether the index is there.
    Safe while the process runs idle (SQLite re-prepares its statements after the schema
    change): memsvc runs this before it writes."""
    import sqlite3

    conn = sqlite3.connect(uri, timeout=60, isolation_level=None)
    try:
        columns = {row[1] for row in conn.execute(f'PRAGMA table_info("{collection}")')}
        if "milvus_id" not in columns:
            return False
        conn.execute(
            f'CREATE INDEX IF NOT EXISTS "{collection}_milvus_id" ON "{collection}" (milvus_id)'
        )
        return True
    finally:
        conn.close()
