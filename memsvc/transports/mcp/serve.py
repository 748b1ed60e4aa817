"""`memsvc mcp`: the MCP tools over stdio (an agent host's subprocess) or over streamable
HTTP at `/mcp`.

Over stdio every call carries the token the command was started with. Over HTTP every
request carries its caller's own `Authorization: Bearer` token, which memsvc checks: a
request memsvc would refuse as unauthenticated gets 401 here before MCP sees it, and each
tool call is made with that token, so roles and tenants apply to MCP callers exactly as to
gRPC ones (the gateway holds no privilege of its own).

The HTTP listener follows memsvc's own exposure policy and the MCP transport's rule on
origins: a request whose `Origin` is neither a loopback origin nor in the allow-list
(`--allowed-origins`) is 403, so a web page on another site cannot drive the tools from a
user's browser (DNS rebinding included); and a non-loopback listen in front of a memsvc
that requires no token is refused (it would serve anyone), unless `--allow-insecure`."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from memsvc.transports.grpc.auth import is_loopback
from memsvc.transports.http.hosts import origin_allowed
from memsvc.transports.mcp.gateway import MemoryGateway
from memsvc.transports.mcp.tools import build_mcp

MCP_PATH = "/mcp"


@dataclass(frozen=True)
class HttpListen:
    host: str
    port: int
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # Origins (scheme://host[:port]) allowed besides loopback ones.
    allowed_origins: tuple[str, ...] = ()
    allow_insecure: bool = False

    @property
    def loopback(self) -> bool:
        return is_loopback(f"{self.host}:{self.port}")


INSECURE = (
    "memsvc accepts calls without a token, so this gateway would serve anyone who can reach"
    " {listen}: refused on a non-loopback listen. Set MEMSVC_AUTH_TOKENS_FILE on memsvc,"
    " listen on 127.0.0.1, or pass --allow-insecure (MEMSVC_ALLOW_INSECURE=true) if a"
    " network policy protects it."
)


def bearer(headers: Mapping[str, str] | None) -> str:
    value = (headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def serve_stdio(gateway: MemoryGateway, token: str) -> None:
    build_mcp(gateway, lambda _headers: token).run("stdio")


class BearerCheck:
    """ASGI middleware: 403 for a foreign Origin, or for any request when memsvc requires
    no token and the listen is not loopback (unless allowed); 401 for a request whose
    token memsvc does not accept; 503 when memsvc cannot be asked. Everything else
    (lifespan included) passes through."""

    def __init__(self, app: ASGIApp, gateway: MemoryGateway, listen: HttpListen) -> None:
        self.app = app
        self.gateway = gateway
        self.listen = listen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, self.listen.allowed_origins):
            await _reply(
                send,
                403,
                "permission_denied",
                f"origin {origin!r} is not allowed: loopback origins and --allowed-origins"
                " (MEMSVC_MCP_ALLOWED_ORIGINS) only",
                [],
            )
            return
        try:
            exposed = not (self.listen.loopback or self.listen.allow_insecure)
            if exposed and await anyio.to_thread.run_sync(self.gateway.token_accepted, ""):
                message = INSECURE.format(listen=f"{self.listen.host}:{self.listen.port}")
                await _reply(send, 403, "permission_denied", message, [])
                return
            accepted = await anyio.to_thread.run_sync(self.gateway.token_accepted, bearer(headers))
        except ToolError as exc:
            await _reply(send, 503, "unavailable", str(exc), [(b"retry-after", b"5")])
            return
        if not accepted:
            await _reply(
                send,
                401,
                "unauthenticated",
                "a valid memsvc token is required: Authorization: Bearer <token>",
                [(b"www-authenticate", b'Bearer realm="memsvc"')],
            )
            return
        await self.app(scope, receive, send)


async def _reply(
    send: Send, status: int, code: str, message: str, extra: list[tuple[bytes, bytes]]
) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})


def http_app(gateway: MemoryGateway, listen: HttpListen) -> ASGIApp:
    server = build_mcp(gateway, bearer)
    # On loopback the SDK also checks the Host header (DNS rebinding); its origin list must
    # then hold ours too. Beyond loopback the host names are the operator's: BearerCheck
    # checks the origin.
    security = None
    if listen.loopback:
        loopback = ["127.0.0.1", "localhost", "[::1]"]
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{h}:*" for h in loopback],
            allowed_origins=[
                *(f"{scheme}://{h}:*" for scheme in ("http", "https") for h in loopback),
                *(f"{scheme}://{h}" for scheme in ("http", "https") for h in loopback),
                *listen.allowed_origins,
            ],
        )
    # Stateless: any request may reach any gateway process, and nothing is lost with one.
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        host=listen.host,
        transport_security=security,
    )
    return BearerCheck(app, gateway, listen)


def exposure_refusal(gateway: MemoryGateway, listen: HttpListen) -> str | None:
    """At start: why this listen must not serve (memsvc requires no token and the listen is
    not loopback), or None. A memsvc that cannot be asked yet is checked per request."""
    if listen.loopback or listen.allow_insecure:
        return None
    try:
        tokenless = gateway.token_accepted("")
    except ToolError:
        return None
    return INSECURE.format(listen=f"{listen.host}:{listen.port}") if tokenless else None


def serve_http(gateway: MemoryGateway, listen: HttpListen) -> None:
    import uvicorn

    config = uvicorn.Config(
        http_app(gateway, listen),
        host=listen.host,
        port=listen.port,
        log_level="warning",
        ssl_certfile=listen.tls_cert_file or None,
        ssl_keyfile=listen.tls_key_file or None,
    )
    uvicorn.Server(config).run()


def host_config(target: str, ca_file: str, token: str) -> dict[str, Any]:
    """The `mcpServers` entry that starts `memsvc mcp` over stdio. The command is this
    interpreter's absolute path: an agent host spawns it without the venv on its PATH
    (a bare `memsvc` fails there with ENOENT)."""
    args = ["-m", "memsvc", "mcp", "--target", target]
    if ca_file:
        args += ["--ca-file", str(Path(ca_file).resolve())]
    entry: dict[str, Any] = {"command": sys.executable, "args": args}
    if token:
        entry["env"] = {"MEMSVC_TOKEN": token}
    return {"mcpServers": {"memory": entry}}
