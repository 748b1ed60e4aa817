"""The backlog during a backfill (issue 27: `memsvc_index_backlog_turns` and `memsvc status`
showed 5 while ~1,850 appended turns were not yet searchable). Invariant, read in one
snapshot at any moment: a conversation's backlog is exactly its turns not yet findable
(appended - indexed, for contiguous turns), and the total is their sum."""

from __future__ import annotations

import time

from memsvc.app import Services
from tests.support.conversations import generate


def test_backlog_counts_every_turn_not_yet_searchable(services: Services) -> None:
    control = services.control
    control.set_paused(True)
    # 380 turns in appends of 50: several steps of the worker, each checked mid-way
    conversations = {f"backfill-{n}": generate(f"backfill-{n}", n, sessions=8) for n in range(3)}
    appended = 0
    for events in conversations.values():
        for i in range(0, len(events), 50):  # many small appends, as a client backfills
            result = services.ingest.append(events[i : i + 50])
            assert not result.errors
            appended += result.accepted
    items = control.status(list(conversations))
    assert control.totals().backlog == appended > 300
    assert all(i.dirty == i.last_appended_turn + 1 for i in items)

    control.set_paused(False)
    seen_partial = False
    deadline = time.monotonic() + 600
    while True:
        items = control.status(list(conversations))
        for item in items:
            assert item.dirty == item.last_appended_turn - item.last_indexed_turn, item
            seen_partial |= 0 < item.dirty < item.last_appended_turn + 1
        if control.totals().backlog == 0:
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.05)
    assert seen_partial  # the invariant was checked mid-way, not only at both ends


def full_count(services: Services, prefix: str = "") -> dict[str, tuple[int, int]]:
    """By state: (conversations, backlog), from every conversation's row (one snapshot)."""
    out: dict[str, tuple[int, int]] = {}
    for item in services.queue.status():
        if item.conversation_id.startswith(prefix):
            n, backlog = out.get(item.state, (0, 0))
            out[item.state] = (n + 1, backlog + item.dirty)
    return out


def test_totals_read_only_conversations_with_work(services_on_both: Services) -> None:
    # issue 65: totals read every conversation's row with each status call (34 ms at
    # 100,000 conversations); now only those with work, through the state index, and idle
    # ones as the rest of a count. They agree with every row's state, paused (pending),
    # idle, and the two mixed, over all conversations and within a prefix.
    services = services_on_both
    control, queue = services.control, services.queue
    assert queue.counts() == {} and control.totals().conversations == 0
    control.set_paused(True)
    for n in range(4):
        conv = f"{'t1/' if n % 2 else 't2/'}totals-{n}"
        events = generate(conv, n, sessions=1, turns_per_session=(4, 6))
        assert services.ingest.append(events).accepted
    for prefix in ("", "t1/"):
        assert queue.counts([prefix] if prefix else []) == full_count(services, prefix)
    assert set(queue.counts()) == {"pending"}
    control.set_paused(False)
    deadline = time.monotonic() + 300
    while control.totals().backlog:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    control.set_paused(True)
    late = generate("t1/totals-late", 9, sessions=1, turns_per_session=(4, 6))
    assert services.ingest.append(late).accepted
    for prefix in ("", "t1/"):
        assert queue.counts([prefix] if prefix else []) == full_count(services, prefix)
    assert queue.counts()["idle"] == (4, 0) and queue.counts()["pending"][0] == 1
    gauges = queue.gauges()
    assert gauges.by_state == {s: n for s, (n, _) in full_count(services).items()}
    assert gauges.backlog == control.totals().backlog > 0
    assert gauges.oldest_pending_since is not None
    control.set_paused(False)
