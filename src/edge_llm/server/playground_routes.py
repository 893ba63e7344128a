"""``GET /``: the playground page and its two assets, shipped inside the package.

The files are read once when the app is built, so a request never touches the
disk. The page holds no secret (it asks for the API key itself), so it is served
without one; everything it calls is still protected. The Content-Security-Policy
keeps it self-contained: nothing loads from, or talks to, another origin.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

PAGE_PATH = "/"
ASSET_PREFIX = "/playground/"
_ASSETS = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_playground_path(path: str) -> bool:
    return path == PAGE_PATH or path.startswith(ASSET_PREFIX)


def add_routes(app: web.Application) -> None:
    """Register ``/`` and ``/playground/{name}`` for the packaged files."""
    folder = resources.files("edge_llm.server") / "playground"
    files = {name: (folder / name).read_bytes() for name in _ASSETS}

    def serve(name: str) -> web.Response:
        return web.Response(
            body=files[name],
            content_type=_ASSETS[name],
            charset="utf-8",
            headers=_SECURITY_HEADERS,
        )

    async def page(request: web.Request) -> web.Response:
        return serve("index.html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files or name == "index.html":
            raise web.HTTPNotFound()
        return serve(name)

    app.router.add_get(PAGE_PATH, page)
    app.router.add_get(ASSET_PREFIX + "{name}", asset)
