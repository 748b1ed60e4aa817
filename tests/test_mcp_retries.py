"""Which add_turns calls without request_id the MCP gateway takes as a retry (issue 81,
item 6): bookkeeping, so a clock of the test's own."""

from __future__ import annotations

from memsvc.transports.mcp.retries import RETRY_WINDOW_S, RecentCalls


def test_the_same_turns_again_at_once_are_the_same_call() -> None:
    now = [0.0]
    recent = RecentCalls(clock=lambda: now[0])
    first = recent.key_for("caller", "c1", b"ok")
    assert recent.key_for("caller", "c1", b"ok") == first  # sent again: a retry
    now[0] += RETRY_WINDOW_S + 1
    late = recent.key_for("caller", "c1", b"ok")
    assert late != first  # later than the window: said again
    assert recent.key_for("caller", "c1", b"reply") != late
    assert recent.key_for("caller", "c1", b"ok") != late  # another call between
    assert recent.key_for("other", "c1", b"ok") != recent.key_for("caller", "c2", b"ok")
