"""Bearer-token authentication with three roles and optional conversation prefixes, as a
gRPC server interceptor.

Tokens come from a file of `ROLE TOKEN [PREFIX ...]` lines (`#` comments). Only their
SHA-256 digests are kept, and a presented token is compared with every digest in constant
time, so neither the file's order nor a prefix match leaks through timing. Tokens are never
logged.

The check runs on the call's metadata alone, before its body is decoded: a call without a
valid token, or whose role is too low for the method, never has its request parsed. What
depends on the request (the conversations it names, deleted text, every-conversation
calls) is checked by the services against the caller's `Access`, which this interceptor
hands to the handler (`current_access`).

The gRPC health service stays open (probes carry no token); reflection is the caller's
choice (memsvc.transports.grpc.server)."""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import ipaddress
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import structlog

from memsvc.domain import validation
from memsvc.domain.access import FULL, Access, Role
from memsvc.domain.errors import InvalidArgument
from memsvc.transports.grpc.status import rich_status

log = structlog.get_logger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

SERVICE_PREFIX = "/memsvc.v1.MemoryService/"

# Least role per RPC; a higher role may do everything a lower one may.
METHOD_ROLES: dict[str, Role] = {
    "EmbedDb": Role.READER,
    "EmbedChunk": Role.READER,
    "EmbedBatch": Role.READER,
    "ListChunks": Role.READER,
    "GetIndexStatus": Role.READER,
    "WaitForIndexed": Role.READER,
    "ExportEvents": Role.READER,
    "AppendEvents": Role.WRITER,
    "BuildIncrementalChunks": Role.WRITER,
    "UpsertVectorRecords": Role.WRITER,
    "LogicalDeleteBySource": Role.WRITER,
    "PopEvents": Role.WRITER,
    "PurgeDeleted": Role.ADMIN,
    "RetireChunkVersion": Role.ADMIN,
    "Reindex": Role.ADMIN,
    "SetIndexingPaused": Role.ADMIN,
}

_ACCESS: contextvars.ContextVar[Access] = contextvars.ContextVar("memsvc_access", default=FULL)


def current_access() -> Access:
    """The caller's access for the call being handled (everything without a tokens file)."""
    return _ACCESS.get()


class TokenFileError(ValueError):
    pass


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def parse_tokens(text: str, source: str) -> list[tuple[bytes, Access]]:
    """`ROLE TOKEN [PREFIX ...]` per line; errors name the line, never the token."""
    entries: list[tuple[bytes, Access]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2:
            raise TokenFileError(f"{source}:{n}: expected 'ROLE TOKEN [PREFIX ...]'")
        role_name, token, *prefixes = parts
        try:
            role = Role[role_name.upper()]
        except KeyError:
            raise TokenFileError(
                f"{source}:{n}: unknown role {role_name!r} (reader, writer or admin)"
            ) from None
        if len(token) < 16:
            raise TokenFileError(f"{source}:{n}: token shorter than 16 characters")
        try:
            normal = tuple(
                validation.conversation_id(p, f"prefix {i + 1}") for i, p in enumerate(prefixes)
            )
        except InvalidArgument as exc:
            raise TokenFileError(f"{source}:{n}: {exc}") from None
        for i, prefix in enumerate(normal):
            if "/" not in prefix:
                # keyword statistics are per first segment through its "/" (memsvc.domain.
                # bm25.tenant): ids without one all share the tenant "", so such a prefix
                # would share statistics with every other prefix without one
                raise TokenFileError(
                    f"{source}:{n}: prefix {i + 1} {prefix!r} has no '/': a tenant's ids start"
                    f" with a segment through its first '/' ({prefix + '/'!r}), whose keyword"
                    " statistics are its own"
                )
        entries.append((_digest(token), Access(role, normal)))
    if not entries:
        raise TokenFileError(f"{source}: no tokens")
    return entries


class TokenTable:
    """The tokens file, re-read on demand (SIGHUP); a bad new file keeps the old table."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries = self._read()
        self._lock = threading.Lock()

    def _read(self) -> list[tuple[bytes, Access]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenFileError(f"{self.path}: {exc.strerror}") from exc
        return parse_tokens(text, str(self.path))

    def reload(self) -> bool:
        try:
            entries = self._read()
        except TokenFileError as exc:
            log.error("auth_tokens_reload_failed", error=str(exc))
            return False
        with self._lock:
            self._entries = entries
        log.info("auth_tokens_reloaded", tokens=len(entries))
        return True

    def access_of(self, token: str) -> Access | None:
        presented = _digest(token)
        found: Access | None = None
        for digest, access in self._entries:  # every entry, match or not: constant time
            if hmac.compare_digest(presented, digest) and (
                found is None or access.role > found.role
            ):
                found = access
        return found


@dataclass(frozen=True)
class Denial:
    code: grpc.StatusCode
    message: str
    reason: str  # ErrorInfo.reason


def authenticate(table: TokenTable, method: str, metadata: Any) -> Access | Denial:
    """From the call's metadata alone: who calls, and whether its role may call `method`."""
    values = [
        value if isinstance(value, str) else value.decode("utf-8", "replace")
        for key, value in metadata or ()
        if key == "authorization"
    ]
    if len(values) > 1:
        return Denial(
            grpc.StatusCode.UNAUTHENTICATED,
            "more than one 'authorization' value: send exactly one",
            "TOKEN_AMBIGUOUS",
        )
    scheme, _, token = (values[0] if values else "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Denial(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing 'authorization: Bearer <token>'",
            "TOKEN_MISSING",
        )
    access = table.access_of(token.strip())
    if access is None:
        return Denial(grpc.StatusCode.UNAUTHENTICATED, "unknown token", "TOKEN_UNKNOWN")
    need = METHOD_ROLES.get(method, Role.ADMIN)
    if access.role < need:
        return Denial(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs role {need.name.lower()}, the token has {access.role.name.lower()}",
            "ROLE_TOO_LOW",
        )
    return access


class _NotDecoded:
    """Stands for the body of a refused call, which is never parsed (gRPC takes a request
    of None for a decoding failure)."""


_NOT_DECODED = _NotDecoded()


def _not_decoded(data: bytes) -> _NotDecoded:
    del data
    return _NOT_DECODED


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every MemoryService call from its metadata before its request is
    decoded; the handler then runs with the caller's Access."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler: Any = continuation(details)  # a namedtuple at run time (_replace)
        name: str = details.method
        if handler is None or not name.startswith(SERVICE_PREFIX) or not handler.unary_unary:
            return handler  # type: ignore[no-any-return]
        method = name[len(SERVICE_PREFIX) :]
        verdict = authenticate(self.table, method, details.invocation_metadata)
        if isinstance(verdict, Denial):
            denial = verdict

            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                log.warning("rpc_denied", method=method, code=denial.code.name)
                context.abort_with_status(
                    rich_status(denial.code, denial.message, reason=denial.reason)
                )

            refused: Handler = handler._replace(
                request_deserializer=_not_decoded, unary_unary=refuse
            )
            return refused
        access, behavior = verdict, handler.unary_unary

        def with_access(request: Any, context: grpc.ServicerContext) -> Any:
            token = _ACCESS.set(access)
            try:
                return behavior(request, context)
            finally:
                _ACCESS.reset(token)

        allowed: Handler = handler._replace(unary_unary=with_access)
        return allowed


def is_loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere
