"""Milvus Lite: a `.db` URI names a local file served by a child process that pymilvus
starts (milvus_lite's server manager). Reconnecting after that process died means releasing
it first, so the next client starts a fresh one on the same file."""

from __future__ import annotations


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
