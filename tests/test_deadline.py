"""The call deadline below the transport (memsvc.domain.deadline)."""

from __future__ import annotations

from memsvc.domain import deadline


def test_a_call_without_a_deadline_has_none() -> None:
    """Regression: gRPC's time_remaining() for a call without a deadline is ~10^11 s; taken
    literally it overflowed the query batcher's wait (OverflowError, INTERNAL)."""
    token = deadline.set_remaining(1.0e11)
    try:
        assert deadline.remaining() is None
    finally:
        deadline.reset(token)
    token = deadline.set_remaining(5.0)
    try:
        left = deadline.remaining()
        assert left is not None and 0 < left <= 5.0
    finally:
        deadline.reset(token)
    assert deadline.remaining() is None
