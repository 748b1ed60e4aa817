"""Which `Host` and `Origin` an HTTP listener answers: the defence against DNS rebinding.

A web page on `attacker.example` can re-point its own name at 127.0.0.1 after loading: the
browser then sends the page's requests to a loopback listener as same-origin ones, so CORS
never applies, and only the `Host` header (still `attacker.example`) tells them apart. A
listener that answers without a token (every loopback listener by default) would hand the
page every conversation. So, before any handler runs:

- `Host` must name the listener: a loopback name, an IP address (a page cannot be served
  from the listener's own address by anyone else), or a name in the allow-list
  (MEMSVC_HTTP_ALLOWED_HOSTS, `*` = any). Checked on a loopback listen and on any listen that
  accepts calls without a token; on a non-loopback listen that requires tokens the names are
  the operator's, and the token is what a rebinding page lacks.
- `Origin`, when a browser sends one, must be the listener's own (the console), a loopback
  origin, an origin whose host is in the allow-list, or one of the CORS origins.

The MCP gateway's HTTP listener applies the same rule on origins (`origin_allowed`)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _hostname(authority: str) -> str | None:
    """The host of `host[:port]` or `[v6][:port]`, lower case; None when malformed."""
    try:
        parts = urlsplit(f"//{authority}")
        _ = parts.port  # a port that is not a number is malformed
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str, allowed: Sequence[str]) -> bool:
    """A browser's Origin: a loopback origin (http or https, any port) or one listed."""
    if origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOOPBACK_NAMES


@dataclass(frozen=True)
class HostPolicy:
    """What a listener answers (see the module's docstring)."""

    # host names allowed besides loopback names and IP addresses; "*" = any
    allowed_hosts: frozenset[str] = frozenset()
    # check Host at all: a loopback listen, or one that accepts calls without a token
    check_host: bool = True
    # browser origins allowed to call across origins (CORS); "*" = any
    cors_origins: tuple[str, ...] = ()

    def host_refusal(self, host: str | None) -> str | None:
        """Why a request with this Host header is refused, or None."""
        if not self.check_host or host is None or "*" in self.allowed_hosts:
            return None
        name = _hostname(host)
        if name is not None and (
            name in LOOPBACK_NAMES or _is_ip(name) or name in self.allowed_hosts
        ):
            return None
        return (
            f"host {host!r} is not allowed: loopback names, IP addresses and"
            " MEMSVC_HTTP_ALLOWED_HOSTS only (a page whose name points here, DNS rebinding)"
        )

    def origin_refusal(self, origin: str | None, host: str | None) -> str | None:
        """Why a request with this Origin header is refused, or None."""
        if origin is None or "*" in self.cors_origins:
            return None
        parts = urlsplit(origin)
        same_origin = host is not None and parts.netloc.lower() == host.lower()
        listed = (parts.hostname or "") in self.allowed_hosts or "*" in self.allowed_hosts
        if parts.scheme in ("http", "https") and (same_origin or listed):
            return None
        if origin_allowed(origin, self.cors_origins):
            return None
        return (
            f"origin {origin!r} is not allowed: this listener's own, loopback origins,"
            " MEMSVC_HTTP_ALLOWED_HOSTS and MEMSVC_HTTP_CORS_ORIGINS only"
        )


class HostCheck:
    """ASGI middleware: 403 for a request whose Host or Origin the policy refuses, before
    any handler (API, console or OpenAPI) runs."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        refusal = self.policy.host_refusal(host) or self.policy.origin_refusal(
            headers.get("origin"), host
        )
        if refusal is None:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"code": "permission_denied", "message": refusal}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
