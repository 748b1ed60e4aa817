"""Pages cut by bytes, not only by counts: a page of 1,000 long turns is tens of MiB, over
what a client with gRPC's defaults can receive (4 MiB). So every page of a list the server
returns (ExportEvents, ListChunks, GetIndexStatus) stops before it would pass PAGE_BYTES,
holding at least one item: a single item larger than that comes alone, within the server's
send limit (64 MiB; the largest event allowed is about 8 MB of UTF-8)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import TypeVar

from memsvc.domain.errors import InvalidArgument

T = TypeVar("T")

# Under gRPC's default receive limit (4 MiB), with room for the rest of the response.
PAGE_BYTES = 3 * 1024 * 1024
# What a field's tag, length and the message around it add, at most, per item.
ITEM_OVERHEAD_BYTES = 64


def page_token(kind: str, position: str) -> str:
    """An opaque token for the page after `position` (a turn id, an offset, a conversation
    id), of a list of `kind` (one letter)."""
    return base64.urlsafe_b64encode(f"{kind}:{position}".encode()).decode()


def token_position(token: str, kind: str, method: str) -> str | None:
    """The position a previous response's token holds (None: no token, the first page);
    INVALID_ARGUMENT naming `page_token` for anything else."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        if raw.startswith(f"{kind}:"):
            return raw[len(kind) + 1 :]
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidArgument("page_token", f"not a token from a previous {method} response")


def utf8_size(*texts: str) -> int:
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def cut(
    items: Iterable[T], size_of: Callable[[T], int], count: int, budget: int = PAGE_BYTES
) -> tuple[list[T], bool]:
    """The longest head of `items` of at most `count` items whose sizes sum to at most
    `budget`, never empty when `items` is not (an item over the budget comes alone); and
    whether any item is left. Reads one item past the page, no more: `items` may be lazy."""
    page: list[T] = []
    used = 0
    for item in items:
        cost = size_of(item) + ITEM_OVERHEAD_BYTES
        if len(page) == count or (page and used + cost > budget):
            return page, True
        page.append(item)
        used += cost
    return page, False
