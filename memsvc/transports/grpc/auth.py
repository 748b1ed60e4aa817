"""Bearer-token authentication with three roles, as a gRPC server interceptor.

Tokens come from a file of `ROLE TOKEN` lines (`#` comments). Only their SHA-256 digests are
kept, and a presented token is compared with every digest in constant time, so neither the
file's order nor a prefix match leaks through timing. Tokens are never logged.

The gRPC health service stays open (probes carry no token); reflection is the caller's
choice (memsvc.transports.grpc.server)."""

from __future__ import annotations

import enum
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

from memsvc.transports.grpc.status import rich_status

log = structlog.get_logger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

SERVICE_PREFIX = "/memsvc.v1.MemoryService/"


class Role(enum.IntEnum):
    READER = 1
    WRITER = 2
    ADMIN = 3


# Least role per RPC; a higher role may do everything a lower one may.
METHOD_ROLES: dict[str, Role] = {
    "EmbedDb": Role.READER,
    "EmbedChunk": Role.READER,
    "EmbedBatch": Role.READER,
    "ListChunks": Role.READER,
    "GetIndexStatus": Role.READER,
    "WaitForIndexed": Role.READER,
    "AppendEvents": Role.WRITER,
    "BuildIncrementalChunks": Role.WRITER,
    "UpsertVectorRecords": Role.WRITER,
    "LogicalDeleteBySource": Role.WRITER,
    "PurgeDeleted": Role.ADMIN,
    "RetireChunkVersion": Role.ADMIN,
    "Reindex": Role.ADMIN,
    "SetIndexingPaused": Role.ADMIN,
}


def unscoped(method: str, request: Any) -> bool:
    """Calls over every conversation at once, admin-only whatever the method's role."""
    if method == "GetIndexStatus":
        return not request.conversation_ids
    if method == "EmbedDb":
        return not request.filters.conversation_ids
    return False


class TokenFileError(ValueError):
    pass


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def parse_tokens(text: str, source: str) -> list[tuple[bytes, Role]]:
    """`ROLE TOKEN` per line; errors name the line, never the token."""
    entries: list[tuple[bytes, Role]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{source}:{n}: expected 'ROLE TOKEN'")
        role_name, token = parts
        try:
            role = Role[role_name.upper()]
        except KeyError:
            raise TokenFileError(
                f"{source}:{n}: unknown role {role_name!r} (reader, writer or admin)"
            ) from None
        if len(token) < 16:
            raise TokenFileError(f"{source}:{n}: token shorter than 16 characters")
        entries.append((_digest(token), role))
    if not entries:
        raise TokenFileError(f"{source}: no tokens")
    return entries


class TokenTable:
    """The tokens file, re-read on demand (SIGHUP); a bad new file keeps the old table."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries = self._read()
        self._lock = threading.Lock()

    def _read(self) -> list[tuple[bytes, Role]]:
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

    def role_of(self, token: str) -> Role | None:
        presented = _digest(token)
        found: Role | None = None
        for digest, role in self._entries:  # every entry, match or not: constant time
            if hmac.compare_digest(presented, digest) and (found is None or role > found):
                found = role
        return found


@dataclass(frozen=True)
class Denial:
    code: grpc.StatusCode
    message: str
    reason: str  # ErrorInfo.reason


def check(table: TokenTable, method: str, metadata: Any, request: Any) -> Denial | None:
    """None when the call may proceed."""
    header = ""
    for key, value in metadata or ():
        if key == "authorization":
            header = value if isinstance(value, str) else value.decode("utf-8", "replace")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Denial(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing 'authorization: Bearer <token>'",
            "TOKEN_MISSING",
        )
    role = table.role_of(token.strip())
    if role is None:
        return Denial(grpc.StatusCode.UNAUTHENTICATED, "unknown token", "TOKEN_UNKNOWN")
    need = METHOD_ROLES.get(method, Role.ADMIN)
    if role < need:
        return Denial(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs role {need.name.lower()}, the token has {role.name.lower()}",
            "ROLE_TOO_LOW",
        )
    if unscoped(method, request) and role < Role.ADMIN:
        return Denial(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} over every conversation needs role admin; name conversations in"
            " the request to use role " + need.name.lower(),
            "ADMIN_REQUIRED",
        )
    return None


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Checks every MemoryService call after its request is decoded (some rules look at
    the request: unscoped calls are admin-only)."""

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
        metadata = details.invocation_metadata
        behavior = handler.unary_unary
        table = self.table

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            denial = check(table, method, metadata, request)
            if denial is not None:
                log.warning("rpc_denied", method=method, code=denial.code.name)
                context.abort_with_status(
                    rich_status(denial.code, denial.message, reason=denial.reason)
                )
            return behavior(request, context)

        replaced: Handler = handler._replace(unary_unary=guarded)
        return replaced


def is_loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere
