"""Start-up steps that bring the log in line with the running model and store."""

from __future__ import annotations

from dataclasses import replace

import structlog

from memsvc.domain.model_identity import ModelIdentity, mismatch
from memsvc.domain.records import EventRow
from memsvc.domain.text import TEXT_FORM, clean_text, has_kept_punctuation
from memsvc.observability import startup
from memsvc.ports import Embedder, EmbeddingCache, EventLog

log = structlog.get_logger(__name__)

RECLEAN_PAGE = 5000  # events read at a time when the text form changed


def recount_tokens_if_tokenizer_changed(events: EventLog, embedder: Embedder) -> None:
    """Token counts in the log belong to one tokenizer; recount them after a model change."""
    tokenizer = embedder.tokenizer_id
    with events.snapshot() as r:
        if r.get_meta("tokenizer") == tokenizer:
            return
    with events.transaction() as tx:
        if tx.get_meta("tokenizer") == tokenizer:  # another process sharing the log did it
            return
        rows = tx.event_texts()
        counts = embedder.count_tokens([text for _, _, text in rows])
        tx.set_tokens((n, conv, turn) for (conv, turn, _), n in zip(rows, counts, strict=True))
        tx.set_meta("tokenizer", tokenizer)
    if rows:
        log.info("event_tokens_recounted", events=len(rows), tokenizer=tokenizer)


def reclean_turns_if_text_form_changed(events: EventLog, embedder: Embedder) -> None:
    """Turns are cleaned in one form (memsvc.domain.text.TEXT_FORM). A log written in an
    earlier one has the turns whose clean text the new form changes cleaned again (read a
    page at a time; few turns change), and their conversations rebuilt in the background,
    as after any edit."""
    with events.snapshot() as r:
        if r.get_meta("text_form") == TEXT_FORM:
            return
    startup.enter("cleaning the log's turns in a new text form (once)")
    found: list[tuple[str, int, str, str]] = []  # conversation, turn, text, its new clean text
    after: tuple[str, int] = ("", -1)
    while True:
        with events.snapshot() as r:
            page = r.event_texts_after(*after, RECLEAN_PAGE)
        for conv, turn, text, clean in page:
            if has_kept_punctuation(text) and (again := clean_text(text)) != clean:
                found.append((conv, turn, text, again))
        if len(page) < RECLEAN_PAGE:
            break
        after = (page[-1][0], page[-1][1])
    with events.transaction() as tx:
        if tx.get_meta("text_form") == TEXT_FORM:  # another process sharing the log did it
            return
        rows: list[tuple[EventRow, str]] = []
        for conv, turn, text, again in found:
            now = tx.events(conv, [turn]).get(turn)
            if now is not None and now.text == text and not now.deleted:  # as read
                rows.append((now, again))
        cleaned = [again for _, again in rows]
        counts = embedder.count_tokens(cleaned) if cleaned else []
        changed: dict[str, list[EventRow]] = {}
        for (e, text), tokens in zip(rows, counts, strict=True):
            changed.setdefault(e.conversation_id, []).append(
                replace(e, clean_text=text, tokens=tokens)
            )
        for conv, edited in changed.items():  # as an edit: a change the worker builds
            tx.put_events(edited, tx.record_change(conv, turns=len(edited)))
        tx.set_meta("text_form", TEXT_FORM)
    if cleaned:
        log.info("turns_cleaned_again", turns=len(cleaned), conversations=len(changed))


def follow_store_identity(events: EventLog, identity: str) -> None:
    """The event log outlives a vector store: pointed at a new collection (or model), it
    forgets what the old store held and records a reconcile of every conversation, which
    writes its chunks into the new one (progress in GetIndexStatus)."""
    with events.snapshot() as r:
        if r.get_meta("store_identity") == identity:
            return
    with events.transaction() as tx:
        previous = tx.get_meta("store_identity")
        if previous == identity:  # another process sharing the log did it
            return
        conversations = tx.conversation_ids() if previous is not None else []
        if previous is not None:
            tx.forget_store()
            for conv in conversations:
                tx.record_change(conv, turns=tx.live_turn_count(conv), reconcile=True)
        tx.set_meta("store_identity", identity)
    if conversations:
        log.warning(
            "store_changed_reindexing",
            conversations=len(conversations),
            was=previous,
            now=identity,
        )


def follow_cache_identity(events: EventLog, cache: EmbeddingCache, identity: ModelIdentity) -> None:
    """Cached vectors are kept by model name; the fingerprint recorded for the name says
    whether the model answering to it now writes the same vectors. If not (new weights
    under an old name, a server serving another model), the name's vectors are dropped:
    a cache never hands one model's vectors to another."""
    key = f"cache_fingerprint:{identity.cache_key}"
    with events.snapshot() as r:
        recorded = r.get_meta(key)
    if recorded == identity.fingerprint:
        return
    if recorded is not None:
        before = ModelIdentity(identity.provider, identity.model, identity.dim, recorded)
        why = mismatch(before, identity)
        if why is not None:
            dropped = cache.forget_model(identity.cache_key)
            log.warning(
                "embed_cache_model_changed",
                model=identity.cache_key,
                why=why,
                dropped_vectors=dropped,
            )
    with events.transaction() as tx:
        tx.set_meta(key, identity.fingerprint)
