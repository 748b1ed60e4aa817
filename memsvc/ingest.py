"""The write path: events into the log, chunks out of it, records into the store."""

from __future__ import annotations

import base64
import binascii
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from memsvc import validation
from memsvc.chunking import ChunkPolicy, ChunkRenderer, plan_windows
from memsvc.embedder import Embedder, EmbeddingCache, embed_passages_cached, text_hash
from memsvc.errors import InvalidArgument
from memsvc.eventlog import EventLog, EventRow, IndexQueue, LayoutRow
from memsvc.filters import in_expr, quote
from memsvc.store import ChunkStore, StoredChunk, content_hash
from memsvc.text import clean_text
from memsvc.types import (
    AppendResult,
    BuildResult,
    ChunkRecord,
    DeleteResult,
    MemoryEvent,
    RecordError,
    TurnRange,
    UpsertResult,
)

log = structlog.get_logger(__name__)

# Tokens the model adds around every text ([CLS] ... [SEP]).
SPECIAL_TOKENS = 2
MAX_MODEL_TOKENS = 512


@dataclass(frozen=True)
class ChunkPage:
    chunks: list[ChunkRecord]
    next_page_token: str


class IngestService:
    """Builds chunks incrementally from the event log and keeps the vector store in step."""

    def __init__(
        self,
        events: EventLog,
        store: ChunkStore,
        embedder: Embedder,
        cache: EmbeddingCache,
        renderer: ChunkRenderer,
        default_version: int,
    ) -> None:
        self.events = events
        self.queue = IndexQueue(events)
        self.store = store
        self.embedder = embedder
        self.cache = cache
        self.renderer = renderer
        self.policy: ChunkPolicy = renderer.policy
        self.default_version = default_version
        self._recount_tokens_if_tokenizer_changed()

    def _recount_tokens_if_tokenizer_changed(self) -> None:
        """Token counts in the log belong to one tokenizer; recount them after a model change."""
        tokenizer = self.embedder.tokenizer_id
        if self.events.get_meta("tokenizer") == tokenizer:
            return
        with self.events.transaction() as db:
            rows = self.events.all_event_texts(db)
            counts = self.embedder.count_tokens([text for _, _, text in rows])
            self.events.set_tokens(
                db, [(n, conv, turn) for (conv, turn, _), n in zip(rows, counts, strict=True)]
            )
            self.events.set_meta(db, "tokenizer", tokenizer)
        if rows:
            log.info("event_tokens_recounted", events=len(rows), tokenizer=tokenizer)

    # -- BuildIncrementalChunks ---------------------------------------------------------
    def build(
        self,
        events: Sequence[MemoryEvent],
        chunk_version: int = 0,
        allow_gaps: bool = False,
        conversation_id: str = "",
    ) -> BuildResult:
        if chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = server default)")
        version = chunk_version or self.default_version
        if events:
            conv = validation.events(events)
            if conversation_id and conversation_id != conv:
                raise InvalidArgument("conversation_id", "differs from the events' conversation_id")
        else:
            conv = validation.conversation_id(conversation_id, "events")
        rows = self._event_rows(events)
        with self.events.transaction() as db:
            self._store_events(db, conv, rows, allow_gaps)
            result = self._rebuild(db, conv, version)
        self._retire_unreplaced(result)
        return result

    def build_for_index(self, conversation_id: str, chunk_version: int) -> BuildResult:
        """The worker's build: also re-renders chunks a crash left out of the store."""
        with self.events.transaction() as db:
            result = self._rebuild(db, conversation_id, chunk_version, include_unindexed=True)
        self._retire_unreplaced(result)
        return result

    def _retire_unreplaced(self, result: BuildResult) -> None:
        """Superseded chunks with nothing replacing them get no upsert to retire them on:
        retire them now."""
        if result.superseded_chunk_ids and not result.chunks:
            self._retire_superseded([result.conversation_id])

    def _store_events(
        self, db: sqlite3.Connection, conv: str, rows: list[EventRow], allow_gaps: bool
    ) -> list[EventRow]:
        """Write new and edited turns; identical re-sends are no-ops and deleted turns stay
        deleted until purged. Returns the rows written."""
        stored = self.events.get_events(db, conv, (r.turn_id for r in rows))
        changed = [
            r
            for r in rows
            if r.turn_id not in stored
            or (not stored[r.turn_id].deleted and not stored[r.turn_id].same_content(r))
        ]
        new_ids = sorted(r.turn_id for r in rows if r.turn_id not in stored)
        if not allow_gaps and new_ids:
            self._check_no_gap(db, conv, new_ids)
        self.events.put_events(db, changed)
        return changed

    # -- AppendEvents ---------------------------------------------------------------------
    def append(self, events: Sequence[MemoryEvent], allow_gaps: bool = False) -> AppendResult:
        """Durably log events of any number of conversations and queue them for indexing.
        A conversation with a bad event is rejected whole (its events are listed in
        `errors`); the others are written."""
        validation.event_count(events)
        by_conv: dict[str, list[tuple[int, MemoryEvent]]] = {}
        for i, e in enumerate(events):
            by_conv.setdefault(e.conversation_id, []).append((i, e))
        errors: list[RecordError] = []
        good: dict[str, list[EventRow]] = {}
        for conv, items in by_conv.items():
            try:
                validation.conversation_events(items, conv)
            except InvalidArgument as exc:
                errors += [RecordError(_event_ref(e), str(exc)) for _, e in items]
                continue
            good[conv] = self._event_rows([e for _, e in items])
        accepted = duplicates = 0
        with self.events.transaction() as db:
            for conv, rows in good.items():
                savepoint = f"sp_{accepted}_{duplicates}"
                db.execute(f"SAVEPOINT {savepoint}")
                try:
                    changed = self._store_events(db, conv, rows, allow_gaps)
                except InvalidArgument as exc:
                    db.execute(f"ROLLBACK TO {savepoint}")
                    errors += [RecordError(_event_ref(r), str(exc)) for r in rows]
                    continue
                db.execute(f"RELEASE {savepoint}")
                accepted += len(changed)
                duplicates += len(rows) - len(changed)
                if changed:
                    version = self.queue.version_of(db, conv) or self.default_version
                    self.queue.enqueue(db, conv, len(changed), version)
        return AppendResult(accepted, duplicates, errors)

    def _event_rows(self, events: Sequence[MemoryEvent]) -> list[EventRow]:
        cleaned = [clean_text(e.text) for e in events]
        tokens = self.embedder.count_tokens(cleaned)
        return [
            EventRow(
                conversation_id=e.conversation_id,
                turn_id=e.turn_id,
                speaker=e.speaker,
                speaker_name=clean_text(e.speaker_name),
                text=e.text,
                clean_text=c,
                timestamp=e.timestamp,
                participants=tuple(clean_text(p) for p in e.participants),
                tokens=n,
            )
            for e, c, n in zip(events, cleaned, tokens, strict=True)
        ]

    def _check_no_gap(self, db: sqlite3.Connection, conv: str, new_ids: list[int]) -> None:
        lo, hi, count = self.events.turn_stats(db, conv)
        all_lo = min([*new_ids, lo] if count else new_ids)
        all_hi = max([*new_ids, hi] if count else new_ids)
        if all_hi - all_lo + 1 != count + len(new_ids):
            have = f"turns {lo}..{hi}" if count else "no turns"
            raise InvalidArgument(
                "events.turn_id",
                f"turn ids {new_ids[0]}..{new_ids[-1]} leave a gap (conversation has {have});"
                " send the missing turns or set allow_gaps",
            )

    def _rebuild(
        self, db: sqlite3.Connection, conv: str, version: int, include_unindexed: bool = False
    ) -> BuildResult:
        """Diff the layout of the live turns against the last build's; render what changed."""
        ev = self.events
        turns = ev.live_turns(db, conv)
        windows = plan_windows(turns, self.policy, self.embedder.count_tokens)
        old = ev.get_layout(db, conv, version)
        chunks: list[ChunkRecord] = []
        fresh: list[LayoutRow] = []
        current: set[str] = set()
        for w in windows:
            cid = w.chunk_id(conv, version)
            current.add(cid)
            source = w.source_hash(version, self.policy)
            previous = old.get(cid)
            if (
                previous is not None
                and previous.source_hash == source
                and (previous.indexed or previous.deleted or not include_unindexed)
            ):
                continue
            record = self.renderer.render(conv, w, version)
            chunks.append(record)
            fresh.append(
                LayoutRow(
                    cid, conv, version, w.start_turn, w.end_turn, source, text_hash(record.text)
                )
            )
        superseded = sorted(cid for cid in old if cid not in current)
        ev.drop_layout(db, superseded)
        ev.put_layout(db, fresh)
        ev.add_superseded(db, conv, superseded)
        ev.clear_superseded(db, (c.chunk_id for c in chunks))
        lo, hi, count = ev.turn_stats(db, conv)
        return BuildResult(conv, TurnRange(lo, hi) if count else None, chunks, superseded)

    # -- UpsertVectorRecords --------------------------------------------------------------
    def upsert(
        self, records: Sequence[ChunkRecord], register_versions: bool = True
    ) -> UpsertResult:
        """Embed and store records. `register_versions=False` (a reindex in progress) keeps
        searches on the conversation's previous version until the worker completes it."""
        errors: list[RecordError] = []
        valid: list[ChunkRecord] = []
        seen: set[str] = set()
        for i, r in enumerate(records):
            try:
                validation.record(r, f"records[{i}]")
                if r.chunk_id in seen:
                    raise InvalidArgument(f"records[{i}].chunk_id", "duplicate in this batch")
            except InvalidArgument as exc:
                errors.append(RecordError(r.chunk_id or f"records[{i}]", str(exc)))
                continue
            seen.add(r.chunk_id)
            valid.append(r)
        superseded = self.events.superseded_among([r.chunk_id for r in valid])
        for r in valid:
            if r.chunk_id in superseded:
                errors.append(
                    RecordError(r.chunk_id, "superseded by a later build of its conversation")
                )
        valid = [r for r in valid if r.chunk_id not in superseded]
        if not valid:
            return UpsertResult(errors=errors)

        ids = [r.chunk_id for r in valid]
        hashes = {r.chunk_id: content_hash(r) for r in valid}
        # Scalar fields only: an identical replay needs nothing more, so it stays cheap.
        existing = self.store.get(ids)
        fresh = [
            r
            for r in valid
            if r.chunk_id not in existing or existing[r.chunk_id].record.text != r.text
        ]
        ok = self._drop_too_long(fresh, errors)
        too_long = {r.chunk_id for r in fresh} - {r.chunk_id for r in ok}
        valid = [r for r in valid if r.chunk_id not in too_long]
        need_text = [r.text for r in ok]
        # Embed outside the write lock: the model is the slow part.
        vectors = dict(
            zip(need_text, embed_passages_cached(self.embedder, self.cache, need_text), strict=True)
        )
        with self.store.write_lock:
            # Re-read under the lock: a delete may have landed while we embedded.
            existing = self.store.get([r.chunk_id for r in valid])
            layout = self.events.layout_rows([r.chunk_id for r in valid])
            writes: list[StoredChunk] = []
            stored_ok: list[ChunkRecord] = []
            reuse: list[ChunkRecord] = []  # same text, new metadata: keep the stored vector
            upserted = updated = unchanged = 0
            for r in valid:
                old = existing.get(r.chunk_id)
                if old is not None and old.record.metadata.deleted and not r.metadata.deleted:
                    entry = layout.get(r.chunk_id)
                    if entry is None or entry.deleted or entry.text_hash != text_hash(r.text):
                        errors.append(
                            RecordError(
                                r.chunk_id,
                                "logically deleted; not restored (rebuild its turns or purge it)",
                            )
                        )
                        continue
                if (
                    old is not None
                    and old.content_hash == hashes[r.chunk_id]
                    and old.record.metadata.deleted == r.metadata.deleted
                ):
                    unchanged += 1
                    stored_ok.append(r)
                    continue
                if r.text in vectors:
                    writes.append(StoredChunk(r, hashes[r.chunk_id], vectors[r.text]))
                else:
                    reuse.append(r)
                if old is None:
                    upserted += 1
                else:
                    updated += 1
            if reuse:
                old_vectors = self.store.get([r.chunk_id for r in reuse], with_vectors=True)
                writes += [
                    StoredChunk(r, hashes[r.chunk_id], old_vectors[r.chunk_id].vector)
                    for r in reuse
                ]
            self.store.upsert(writes)
        # Crash repair bookkeeping: only layout rows not yet known to be in the store.
        now_stored = []
        for r in [*stored_ok, *(w.record for w in writes)]:
            entry = layout.get(r.chunk_id)
            th = text_hash(r.text)
            if entry is not None and (not entry.indexed or entry.text_hash != th):
                now_stored.append((r.chunk_id, th))
        self.events.mark_indexed(now_stored)
        if writes:
            self.events.add_store_versions(
                {
                    (w.record.metadata.conversation_id, w.record.metadata.chunk_version)
                    for w in writes
                },
                complete=register_versions,
            )
        retired = self._retire_superseded(sorted({r.metadata.conversation_id for r in valid}))
        return UpsertResult(upserted, updated, unchanged, retired, errors)

    def _drop_too_long(
        self, records: list[ChunkRecord], errors: list[RecordError]
    ) -> list[ChunkRecord]:
        """The model reads 512 tokens; a longer text would be silently truncated: refuse it."""
        counts = self.embedder.count_tokens([r.text for r in records])
        keep = []
        for r, n in zip(records, counts, strict=True):
            if n + SPECIAL_TOKENS > MAX_MODEL_TOKENS:
                errors.append(
                    RecordError(
                        r.chunk_id,
                        f"text: {n} tokens; the model reads at most"
                        f" {MAX_MODEL_TOKENS - SPECIAL_TOKENS} (split it into several chunks)",
                    )
                )
            else:
                keep.append(r)
        return keep

    def _retire_superseded(self, conversation_ids: Sequence[str]) -> int:
        """Remove live superseded tail chunks of these conversations from the store."""
        retired = 0
        for conv in conversation_ids:
            pending = self.events.pending_superseded(conv)
            if not pending:
                continue
            with self.store.write_lock:
                live = [
                    cid
                    for cid, c in self.store.get(pending).items()
                    if not c.record.metadata.deleted
                ]
                self.store.delete(live)
            self.events.superseded_done(pending)
            retired += len(live)
        return retired

    # -- LogicalDeleteBySource ------------------------------------------------------------
    def delete(
        self, conversation_id: str, turn_range: TurnRange | None, chunk_ids: Sequence[str]
    ) -> DeleteResult:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if turn_range is not None:
            validation.turn_range(turn_range, "turn_range")
        errors: list[RecordError] = []
        with self.store.write_lock:
            if chunk_ids:
                found = self.store.get(list(dict.fromkeys(chunk_ids)), with_vectors=True)
                for cid in dict.fromkeys(chunk_ids):
                    chunk = found.get(cid)
                    if chunk is None or chunk.record.metadata.conversation_id != conv:
                        errors.append(RecordError(cid, f"no such chunk in conversation {conv!r}"))
                targets = [
                    c
                    for c in found.values()
                    if c.record.metadata.conversation_id == conv and not c.record.metadata.deleted
                ]
                with self.events.transaction() as db:
                    self.events.mark_layout_deleted(
                        db, conv, chunk_ids=[c.record.chunk_id for c in targets]
                    )
                events_deleted = 0
            else:
                expr = f"conversation_id == {quote(conv)} and deleted == false"
                span = None
                if turn_range is not None:
                    span = (turn_range.start, turn_range.end)
                    expr += f" and start_turn <= {span[1]} and end_turn >= {span[0]}"
                # The log first: once it says deleted, no rebuild can bring the turns back.
                with self.events.transaction() as db:
                    events_deleted = self.events.mark_events_deleted(
                        db, conv, *(span if span else (None, None))
                    )
                    self.events.mark_layout_deleted(db, conv, turn_range=span)
                targets = self.store.query(expr, with_vectors=True)
            self.store.set_deleted(targets)
        return DeleteResult(len(targets), events_deleted, errors)

    # -- ListChunks / RetireChunkVersion / PurgeDeleted -------------------------------------
    def list_chunks(
        self,
        conversation_id: str,
        include_deleted: bool,
        page_size: int,
        page_token: str,
        chunk_version: int = 0,
    ) -> ChunkPage:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", "must be 0 (= 100) to 1000")
        size = page_size or 100
        offset = _decode_page_token(page_token)
        expr = f"conversation_id == {quote(conv)}"
        if not include_deleted:
            expr += " and deleted == false"
        if chunk_version:
            expr += f" and chunk_version == {int(chunk_version)}"
        rows = sorted(
            (c.record for c in self.store.query(expr)),
            key=lambda r: (
                r.metadata.turn_range.start,
                r.metadata.chunk_version,
                r.metadata.part_index,
                r.metadata.turn_range.end,
            ),
        )
        page = rows[offset : offset + size]
        more = offset + size < len(rows)
        return ChunkPage(page, _encode_page_token(offset + size) if more else "")

    def retire_version(self, conversation_id: str, chunk_version: int) -> int:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if chunk_version < 1:
            raise InvalidArgument("chunk_version", "must be >= 1")
        with self.store.write_lock:
            ids = [
                c.record.chunk_id
                for c in self.store.query(
                    f"conversation_id == {quote(conv)} and chunk_version == {chunk_version}"
                )
            ]
            self.store.delete(ids)
            with self.events.transaction() as db:
                self.events.drop_layout_version(db, conv, chunk_version)
                self.events.remove_store_version(db, conv, chunk_version)
        return len(ids)

    def purge_deleted(self, conversation_id: str) -> tuple[int, int]:
        expr = "deleted == true"
        if conversation_id:
            validation.conversation_id(conversation_id, "conversation_id")
            expr = f"{in_expr('conversation_id', [conversation_id])} and {expr}"
        with self.store.write_lock:
            ids = [c.record.chunk_id for c in self.store.query(expr)]
            self.store.delete(ids)
            with self.events.transaction() as db:
                events = self.events.purge_events(db, conversation_id or None)
        return len(ids), events


def _event_ref(e: MemoryEvent | EventRow) -> str:
    return f"{e.conversation_id}#{e.turn_id}"


def _encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def _decode_page_token(token: str) -> int:
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        if raw.startswith("o:") and raw[2:].isdigit():
            return int(raw[2:])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidArgument("page_token", "not a token from a previous ListChunks response")
