"""Domain errors; the gRPC layer maps each to a status code."""

from __future__ import annotations


class MemsvcError(Exception):
    """Base class of errors the service reports to callers."""


class InvalidArgument(MemsvcError):
    """Bad input; `field` names the offending request field (e.g. ``events[2].timestamp``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class FailedPrecondition(MemsvcError):
    """The request is valid but the system is not in a state to serve it."""


class NotFound(MemsvcError):
    """A named entity does not exist."""


class Unavailable(MemsvcError):
    """A dependency (model, store) is not ready or failed transiently."""


class EmbedderError(Unavailable):
    """The model failed to encode (the caller's batch is not written)."""
