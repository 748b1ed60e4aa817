"""Moving between models without losing an answer: a node that served one model's
collection and now serves another rebuilds every conversation from the event log into a
collection of the new model (the store's successor: memsvc.storage.milvus.schema), in the
background, as any new store is rebuilt (memsvc.services.bootstrap.follow_store_identity).

Meanwhile searches keep answering from the collection before, the one the log records as
served (`served_collection`), with the model that wrote it when it can be loaded (else by
keywords, which need no model): a conversation is searched where it is whole, the previous
collection until its rebuild is done, the new one after (memsvc.services.moving_search).
What the previous collection returns is judged by the log as any hit is (deleted and
edited turns never come back), and a purge deletes there too. When every conversation is
rebuilt, the log records the new collection as served and the previous one is dropped.

Progress is in GetIndexStatus (ServerInfo.model_move), `memsvc status`, the console's
banner and memsvc_model_move_conversations."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ModelMoveStatus
from memsvc.ports import EventLog

log = structlog.get_logger(__name__)

# The log's record of the collection that answered searches whole, and its model.
SERVED = "served_collection"
# How often the move's progress is read (one count over the conversations).
CHECK_S = 2.0


class PreviousStore(Protocol):
    """The collection before (memsvc.storage.milvus.previous.PreviousCollection)."""

    collection: str
    model: ModelIdentity

    def drop(self) -> None: ...

    def reopen(self) -> bool: ...

    def forget_turns(self, conversation_id: str, turn_ids: Sequence[int]) -> None: ...


def move_notice(move: ModelMoveStatus) -> str:
    """The move in a sentence or three, for ServerInfo.model_notice (the console's banner,
    `memsvc status`)."""
    how = "" if move.previous_model_serves else " by keywords (its model cannot be loaded)"
    return (
        f"Rebuilding the vectors for the new model from the event log:"
        f" {move.conversations - move.left:,} of {move.conversations:,} conversations done."
        f" Until each is, it is searched in the collection of {move.from_model}"
        f" ({move.from_collection}){how}; turns written meanwhile are searchable once"
        " their conversation is rebuilt."
    )


def served_collection(events: EventLog) -> str | None:
    with events.snapshot() as r:
        raw = r.get_meta(SERVED)
    return None if raw is None else str(json.loads(raw)["collection"])


def record_served(events: EventLog, collection: str, model: ModelIdentity) -> None:
    raw = json.dumps({"collection": collection, "model": model.describe()})
    with events.transaction() as tx:
        if tx.get_meta(SERVED) != raw:
            tx.set_meta(SERVED, raw)


def previous_collection(
    events: EventLog, target: str, base: str, holds: Callable[[str], ModelIdentity | None]
) -> tuple[str, ModelIdentity] | None:
    """The collection searches answer from while `target` is rebuilt, and the model its
    marker records: the one the log records as served (before it recorded any, the
    configured `base`), if it is another and still exists; None when there is no move."""
    source = served_collection(events) or base
    if source == target:
        return None
    model = holds(source)
    return None if model is None else (source, model)


class ModelMove:
    """A move in progress: its progress from the log, and its end (the previous collection
    dropped, searches on the new one alone). `on_done` runs once, on the move's end."""

    def __init__(
        self,
        events: EventLog,
        previous: PreviousStore,
        target: str,
        model: ModelIdentity,
        previous_model_serves: bool,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        self.events = events
        self.previous = previous
        self.target = target
        self.model = model
        self.previous_model_serves = previous_model_serves
        self._on_done = on_done
        self._done = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="model-move", daemon=True)
        log.warning(
            "model_move_started",
            previous=previous.collection,
            previous_model=previous.model.describe(),
            collection=target,
            model=model.describe(),
            searches=(
                "from the previous collection until each conversation is rebuilt"
                + ("" if previous_model_serves else ", by keywords (its model cannot load)")
            ),
        )

    @property
    def active(self) -> bool:
        return not self._done.is_set()

    def unmoved(self, conversation_ids: list[str]) -> set[str]:
        """Of these conversations, those still searched in the previous collection."""
        if not self.active:
            return set()
        with self.events.snapshot() as r:
            return set(r.unreconciled(conversation_ids))

    def progress(self) -> ModelMoveStatus | None:
        if not self.active:
            return None
        with self.events.snapshot() as r:
            total, left = r.reconcile_counts()
        return ModelMoveStatus(
            self.previous.model.model,
            self.previous.collection,
            self.target,
            total,
            left,
            self.previous_model_serves,
        )

    def forget(self, conversation_id: str, turn_ids: Sequence[int]) -> None:
        """A purge: the previous collection keeps none of the purged turns' text."""
        if self.active:
            self.previous.forget_turns(conversation_id, turn_ids)

    def check(self) -> bool:
        """End the move if every conversation is rebuilt (or another replica ended it);
        True when it has ended."""
        if not self.active:
            return True
        with self._lock:
            if not self.active:
                return True
            if served_collection(self.events) != self.target:
                with self.events.snapshot() as r:
                    if r.reconcile_counts()[1]:
                        return False
                record_served(self.events, self.target, self.model)
            self._done.set()
        try:
            self.previous.drop()
        except Exception as exc:  # another replica dropped it, or the store is down
            log.warning(
                "model_move_drop_failed", collection=self.previous.collection, error=str(exc)[:300]
            )
        log.info("model_move_done", collection=self.target, dropped=self.previous.collection)
        self._on_done()
        return True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            try:
                if self.check():
                    return
            except Exception:  # the log or store away: the next check tries again
                log.exception("model_move_check_failed")
