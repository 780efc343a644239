"""The operator console: ``GET /console``, one page (plain HTML, one script, one style sheet,
no build step, nothing fetched from elsewhere) that logs in with an admin key and redraws once
a second from ``GET /admin/stats`` (``gateway/telemetry/stats_snapshot.py``).

The page is a shell without data; the browser keeps the admin key in ``sessionStorage`` and
sends it as a Bearer header to ``/admin/stats`` only, never in a URL. ``AuthMiddleware`` serves
the shell to a request without a key and refuses one that presents a non-admin key.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

STATIC = Path(__file__).with_name("static")
FILES = {"console.html": "text/html; charset=utf-8",
         "console.js": "text/javascript; charset=utf-8",
         "console.css": "text/css; charset=utf-8"}
# the page loads nothing from elsewhere and cannot be framed
HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
           "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def _file(name: str) -> Response:
    return FileResponse(STATIC / name, media_type=FILES[name], headers=HEADERS)


async def console_page(request: Request) -> Response:
    return _file("console.html")


async def console_asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES or name == "console.html":
        return Response("not found\n", status_code=404, media_type="text/plain")
    return _file(name)


CONSOLE_ROUTES = [
    Route("/console", console_page, methods=["GET"]),
    Route("/console/{name}", console_asset, methods=["GET"]),
]
