"""What a starting server is doing: a first start on a machine exports the model and times
its runtimes, and can take half a minute or more, so a caller that asks before the server
serves is told the phase and how long the start has run (UNAVAILABLE's message, `/readyz`,
the console), not only "starting". One server per process: the phase is process-wide."""

from __future__ import annotations

import threading
import time

import structlog

log = structlog.get_logger()

_lock = threading.Lock()
_started = time.monotonic()
_phase = "starting"
_done = False


def enter(phase: str) -> None:
    """The start has reached `phase` (said as it is: "loading the model")."""
    global _phase
    with _lock:
        _phase = phase
    log.info("startup_phase", phase=phase, elapsed_s=round(time.monotonic() - _started, 1))


def done() -> None:
    """The server serves: what is not ready from now on is not the start."""
    global _done
    with _lock:
        _done = True


def said() -> str:
    """The phase and the start's age: "loading the model (12 s into the start)"."""
    with _lock:
        return f"{_phase} ({time.monotonic() - _started:.0f} s into the start)"


def starting() -> str | None:
    """`said()` while the server starts; None once it has served."""
    with _lock:
        if _done:
            return None
    return said()
