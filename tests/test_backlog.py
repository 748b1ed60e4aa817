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
    conversations = {f"backfill-{n}": generate(f"backfill-{n}", n, sessions=20) for n in range(3)}
    appended = 0
    for events in conversations.values():
        for i in range(0, len(events), 50):  # many small appends, as a client backfills
            result = services.ingest.append(events[i : i + 50])
            assert not result.errors
            appended += result.accepted
    items = control.status(list(conversations))
    assert control.totals().backlog == appended > 600
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
