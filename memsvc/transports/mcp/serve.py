"""`memsvc mcp`: the MCP tools over stdio (an agent host's subprocess) or over streamable
HTTP at `/mcp`.

Over stdio every call carries the token the command was started with. Over HTTP every
request carries its caller's own `Authorization: Bearer` token, which memsvc checks: a
request memsvc would refuse as unauthenticated gets 401 here before MCP sees it, and each
tool call is made with that token, so roles and tenants apply to MCP callers exactly as to
gRPC ones (the gateway holds no privilege of its own)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from memsvc.transports.mcp.gateway import MemoryGateway
from memsvc.transports.mcp.tools import build_mcp

MCP_PATH = "/mcp"


@dataclass(frozen=True)
class HttpListen:
    host: str
    port: int
    tls_cert_file: str = ""
    tls_key_file: str = ""


def bearer(headers: Mapping[str, str] | None) -> str:
    value = (headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def serve_stdio(gateway: MemoryGateway, token: str) -> None:
    build_mcp(gateway, lambda _headers: token).run("stdio")


class BearerCheck:
    """ASGI middleware: 401 for a request whose token memsvc does not accept, 503 when
    memsvc cannot be asked. Everything else (lifespan included) passes through."""

    def __init__(self, app: ASGIApp, gateway: MemoryGateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
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


def http_app(gateway: MemoryGateway, host: str) -> ASGIApp:
    server = build_mcp(gateway, bearer)
    # Stateless: any request may reach any gateway process, and nothing is lost with one.
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True, host=host
    )
    return BearerCheck(app, gateway)


def serve_http(gateway: MemoryGateway, listen: HttpListen) -> None:
    import uvicorn

    config = uvicorn.Config(
        http_app(gateway, listen.host),
        host=listen.host,
        port=listen.port,
        log_level="warning",
        ssl_certfile=listen.tls_cert_file or None,
        ssl_keyfile=listen.tls_key_file or None,
    )
    uvicorn.Server(config).run()
