"""The memory console: a web page on the HTTP port (`/console`) to see and steer what agents
remember. Static files shipped in the package (no build step, no CDN: it works offline);
the page calls the Connect API of the same origin with the user's bearer token, so roles
and tenants apply as to any client. The page keeps the token in session storage only.

Headers: a Content-Security-Policy that allows scripts, styles and calls from this origin
only (no inline script, no framing), and nothing cacheable across users. The files are a
plain ES module and a stylesheet any contributor can change without a JS toolchain; the
charts are a few SVG lines (a chart library would outweigh the page)."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

PATH = "/console"
# The files served, and their types: nothing else under /console is answered.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def _read(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


def console_routes() -> list[BaseRoute]:
    """GET /console/ (the page) and its two files, with the security headers; `/` and
    `/console` lead to it, `/favicon.ico` is empty."""
    files = {name: (_read(name), kind) for name, kind in FILES.items()}

    async def page(request: Request) -> Response:
        name = request.path_params.get("name") or "index.html"
        found = files.get(name)
        if found is None:
            return Response("not found", status_code=404, headers=SECURITY_HEADERS)
        body, kind = found
        return Response(body, media_type=kind, headers=SECURITY_HEADERS)

    async def to_page(_: Request) -> Response:
        return RedirectResponse(f"{PATH}/", headers=SECURITY_HEADERS)

    async def no_icon(_: Request) -> Response:
        # browsers ask every page for it: an empty answer, not a 404 in the console's log
        return Response(status_code=204, headers=SECURITY_HEADERS)

    return [
        Route("/", to_page, methods=["GET"]),  # the HTTP port's root: the console
        Route("/favicon.ico", no_icon, methods=["GET"]),
        Route(PATH, to_page, methods=["GET"]),
        Route(f"{PATH}/", page, methods=["GET"]),
        Route(f"{PATH}/{{name}}", page, methods=["GET"]),
    ]
