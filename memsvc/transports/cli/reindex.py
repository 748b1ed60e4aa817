"""`memsvc reindex`: rebuild conversations from the event log (or cancel rebuilds), and with
--wait follow them to their end on a progress bar."""

from __future__ import annotations

import argparse
import time

from memsvc.transports.cli.connection import Stub, err, out, progress
from memsvc.v1 import memory_pb2 as pb

# States of a conversation the worker has yet to finish.
_BUSY = ("pending", "indexing")
MAX_SHOWN = 20


def cmd_reindex(stub: Stub, args: argparse.Namespace) -> int:
    reply = stub.Reindex(
        pb.ReindexRequest(
            conversation_ids=args.conversation or [],
            all=args.all,
            chunk_version=args.chunk_version,
            cancel=args.cancel,
        ),
        timeout=300,
    )
    out.print(f"{'cancelled' if args.cancel else 'queued'} {reply.queued}")
    if not args.wait or args.cancel or not reply.queued:
        return 0
    return _follow_reindex(stub, args.conversation or [], reply.queued, args.wait_timeout)


def _follow_reindex(stub: Stub, named: list[str], queued: int, timeout_s: float) -> int:
    """Wait until the conversations rebuilt (the named ones, or all) have settled: none
    rebuilding, none waiting for the worker. A paused worker is said at once."""
    request = pb.GetIndexStatusRequest(conversation_ids=named)
    deadline = time.monotonic() + timeout_s
    with progress() as bars:
        task = bars.add_task("rebuilding", total=queued)
        while True:
            status = stub.GetIndexStatus(request, timeout=60)
            if status.paused:
                err.print("indexing is paused (memsvc resume starts it): not waiting")
                return 1
            busy = [c for c in status.conversations if c.reindexing or c.state in _BUSY]
            bars.update(task, completed=max(0, queued - len(busy)))
            if not busy:
                break
            if time.monotonic() > deadline:
                err.print(f"{len(busy)} conversations still rebuilding after {timeout_s:g} s")
                return 1
            time.sleep(0.5)
    failed = [c.conversation_id for c in status.conversations if c.state == "failed"]
    out.print(f"rebuilt {queued - len(failed)}, failed {len(failed)}")
    for conv in failed[:MAX_SHOWN]:
        err.print(f"{conv}: failed (memsvc status --conversation {conv})", markup=False)
    return 1 if failed else 0
