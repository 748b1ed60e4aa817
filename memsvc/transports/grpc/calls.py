"""What every MemoryService call goes through, around its handler: a span continuing the
caller's trace (when tracing is on), the deadline, domain errors mapped to status codes, one
log line and one metric sample (method, code, duration, counts: never conversation text),
and the count of handlers in flight that shutdown waits for."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from memsvc.app import Services
from memsvc.domain import deadline
from memsvc.observability import metrics, tracing
from memsvc.transports.grpc.status import code_of, status_of
from memsvc.v1 import memory_pb2 as pb

log = structlog.get_logger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["MemoryService"].full_name


def transport_of(context: grpc.ServicerContext) -> str:
    """`http` for a call the HTTP bridge forwarded (a label only: it grants nothing)."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-memsvc-transport" and value == "http":
            return "http"
    return "grpc"


def rpc(summary: Callable[[Any], dict[str, Any]]) -> Callable[[F], F]:
    """Maps domain errors to status codes and logs method, code, duration and counts
    (never conversation text)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Handlers, request: Any, context: grpc.ServicerContext) -> Any:
            if not tracing.on():
                return call(self, request, context, None)
            with tracing.server_span(
                f"{SERVICE_NAME}/{fn.__name__}",
                context.invocation_metadata() or (),
                {"memsvc.transport": transport_of(context)},
            ) as span:
                return call(self, request, context, span)

        def call(self: Handlers, request: Any, context: grpc.ServicerContext, span: Any) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            counts: dict[str, Any] = {}
            self.in_flight.enter()
            metrics.RPC_IN_FLIGHT.inc()
            call_deadline = deadline.set_remaining(context.time_remaining())
            try:
                response = fn(self, request, context)
                counts = summary(response)
                return response
            except Exception as exc:
                code, message = code_of(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log.exception("rpc_internal_error", method=fn.__name__)
                if self._services is not None:
                    self._services.health.observe(exc)
                context.abort_with_status(status_of(code, message, exc))
            finally:
                deadline.reset(call_deadline)
                self.in_flight.leave()
                metrics.RPC_IN_FLIGHT.dec()
                elapsed = time.perf_counter() - start
                metrics.RPC_DURATION.labels(fn.__name__, code.name, transport_of(context)).observe(
                    elapsed, exemplar=None if span is None else tracing.exemplar(span)
                )
                log.info(
                    "rpc",
                    method=fn.__name__,
                    code=code.name,
                    duration_ms=round(elapsed * 1000, 2),
                    **counts,
                )
                if span is not None:
                    tracing.finish(span, code.name, counts)

        return wrapper  # type: ignore[return-value]

    return decorate


class InFlight:
    """Counts RPC handlers running, so shutdown closes the store only after the last one
    (gRPC's stop(grace) cancels calls at the deadline but cannot stop their threads)."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def enter(self) -> None:
        with self._idle:
            self._count += 1

    def leave(self) -> None:
        with self._idle:
            self._count -= 1
            if self._count == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout_s)


class Handlers(Protocol):
    """The servicer, as the call wrapper sees it."""

    in_flight: InFlight
    _services: Services | None
