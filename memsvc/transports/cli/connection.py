"""What every client command shares: the consoles, the connection to the server with the
caller's token, tables, and progress bars (on a terminal only)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from memsvc.transports.channel import client_channel
from memsvc.v1 import memory_pb2_grpc as pb_grpc

out = Console()
# One message, one line: scripts grep stderr, and rich would otherwise wrap at 80 columns
# when stderr is not a terminal, splitting the words they look for.
err = Console(stderr=True, soft_wrap=True)


class Stub:
    """The generated stub with the token attached to every call."""

    def __init__(self, stub: pb_grpc.MemoryServiceStub, token: str) -> None:
        self._stub = stub
        self._metadata = [("authorization", f"Bearer {token}")] if token else []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        return lambda request, **kw: method(request, metadata=self._metadata, **kw)


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[Stub]:
    with client_channel(args.target, args.ca_file) as channel:
        yield Stub(pb_grpc.MemoryServiceStub(channel), args.token)  # type: ignore[no-untyped-call]


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
    )


def print_table(columns: list[str], rows: list[list[str]], lines: bool = False) -> None:
    """Rows as a drawn table on a terminal; otherwise plain text a script can cut: a header
    line, then one line per row, fields between tabs (a field's own tabs and newlines become
    spaces)."""
    if out.is_terminal:
        table = Table(*columns, show_lines=lines)
        for cells in rows:
            table.add_row(*cells)
        out.print(table)
        return
    for cells in [columns, *rows]:
        print("\t".join(" ".join(c.split()) for c in cells))


def turn_or_none(turn: int) -> str:
    """A turn id for people: -1 (nothing yet) is '-', not a turn."""
    return "-" if turn < 0 else str(turn)
