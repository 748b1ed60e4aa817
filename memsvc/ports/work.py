"""The index queue, the writer locks and the notifier: how work on conversations is shared
between calls, workers and replicas."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from memsvc.domain.records import QueueGauges, QueueItem


class IndexQueue(Protocol):
    """Conversations with projection work, leased by workers with expiry and fencing."""

    def lease(
        self, now: float | None, lease_s: float, limit: int, owner: str = ""
    ) -> list[QueueItem]:
        """`now`: the caller's clock, or None for the database's. Nothing while paused:
        the flag is read in the lease's own transaction, so no lease begins after a
        pause has committed, in any process sharing the log."""
        ...

    def paused(self) -> bool: ...

    def set_paused(self, paused: bool) -> None:
        """Durable and shared by every process on the log; a pause waits for a lease
        being taken to commit, so `leased()` right after it sees every step in flight."""
        ...

    def renew(
        self, items: Sequence[QueueItem], lease_s: float, now: float | None = None
    ) -> int: ...

    def complete(
        self, item: QueueItem, retry_in_s: float = 0.0, now: float | None = None
    ) -> str | None:
        """Returns the new state, None if the lease was lost."""
        ...

    def fail(
        self,
        item: QueueItem,
        error: str,
        max_attempts: int,
        backoff_s: float,
        now: float | None = None,
    ) -> None: ...

    def release(self, item: QueueItem) -> None:
        """Hand a lease back untouched: pending again, no attempt counted."""
        ...

    def release_owned(self, owner: str) -> int: ...

    def release_stale_leases(self) -> int:
        """Leases held by a process that is gone go back to pending."""
        ...

    def status(
        self, conversation_ids: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> list[QueueItem]: ...

    def status_page(
        self,
        after: str,
        limit: int,
        prefixes: Sequence[str] = (),
        within: str = "",
        states: Sequence[str] = (),
    ) -> list[QueueItem]:
        """A page of conversations after `after`, in id order (keyset)."""
        ...

    def counts(self, prefixes: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
        """By state: (conversations, backlog)."""
        ...

    def gauges(self) -> QueueGauges: ...

    def leased(self) -> int:
        """Conversations under a live lease, by any process sharing the log."""
        ...


class WriterLocks(Protocol):
    """One writer per conversation, across every process sharing the log: every change
    to a conversation's layout or stored chunks runs while holding its lock (re-entrant
    within a thread). No lock outlives a stuck holder, and no waiter waits past its
    bound: ConversationBusy then."""

    def hold(
        self, conversation_id: str, wait_s: float | None = None
    ) -> AbstractContextManager[None]:
        """Wait at most `wait_s` (None: the lock's default wait, MEMSVC_WRITER_WAIT_S),
        and never past the current call's deadline; then ConversationBusy."""
        ...

    def ensure(self, conversation_id: str) -> None:
        """Raise if this holder has lost the lock (its database connection died): called
        just before each store write, so a writer that lost it stops writing."""
        ...


class Notifier(Protocol):
    """Wakes idle index workers and WaitForIndexed callers when work arrives or ends."""

    @property
    def generation(self) -> int:
        """How many notifications this process has seen: a waiter reads it before it looks
        for work and passes it to `wait`."""
        ...

    def notify(self) -> None: ...

    def wait(self, timeout_s: float, since: int | None = None) -> None:
        """Until a notification or `timeout_s`; at once if one came after `since`."""
        ...
