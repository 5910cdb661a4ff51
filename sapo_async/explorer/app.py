"""The explorer's web app: pages, the JSON API under ``/api/`` and the live stream.

Routes:

- ``GET /``, ``/node/{address}``, ``/verify``: the page (one HTML shell; the package's own
  script draws the view the path names, from the API below);
- ``GET /api/swarm``: every node's on-chain totals, the usage graph;
- ``GET /api/node/{address}``: one node (timeline, per-round counts, reward curve,
  rejections by reason);
- ``GET /api/verify/{hash}[?node=&round=&kind=&proof=]``: the contract's inclusion answer;
- ``GET /api/events``: server-sent events, one ``swarm`` event each time the snapshot
  changes, a ``problem`` event while the chain cannot be read;
- ``GET /static/...``: the script and style sheet, from the package (never a CDN: the
  machine may be offline).

Errors: every failure of an ``/api/`` route is JSON ``{"error": {"code", "message"}}`` with
a 4xx (the visitor's input: 400 malformed, 404 unknown) or 5xx (the chain: 503 unreachable,
502 unreadable; 500 a bug, logged here, never sent as a trace).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sapo_async import limits
from sapo_async.errors import ConfigError, LedgerError, LedgerUnavailable, RejectedInput, SapoError
from sapo_async.explorer.source import Explorer
from sapo_async.logs import get_logger

__all__ = ["STATIC", "build_app", "error_status"]

STATIC = Path(__file__).parent / "static"
"""The page's files, shipped in the package."""

_log = get_logger("explorer")


def error_status(exc: Exception, chain: str) -> tuple[int, str, str]:
    """(HTTP status, code, message) for an error raised while answering."""
    if isinstance(exc, RejectedInput):
        return (404 if exc.reason == "unknown_node" else 400), exc.reason, str(exc.detail or exc)
    if isinstance(exc, ConfigError):
        return 400, "bad_value", str(exc)
    if isinstance(exc, LedgerUnavailable):
        return 503, "chain_unreachable", f"cannot reach the chain at {chain}: {exc}"
    if isinstance(exc, LedgerError):
        return 502, "ledger_unreadable", f"the ledger could not be read: {exc}"
    return 500, "internal_error", "internal error: the explorer's log has the details"


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def build_app(explorer: Explorer) -> Starlette:
    """The Starlette app serving ``explorer``.

    ``app.state.closing = True`` ends the live streams within one poll (the server sets it
    when it stops).
    """

    def fail(exc: Exception) -> JSONResponse:
        status, code, message = error_status(exc, explorer.chain)
        if status == 500:
            _log.error("explorer_failed", error=repr(exc))
        return _error(status, code, message)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def api_swarm(request: Request) -> Response:
        try:
            return JSONResponse(await explorer.swarm())
        except (SapoError, OSError) as exc:
            return fail(exc)

    async def api_node(request: Request) -> Response:
        try:
            return JSONResponse(await explorer.node(request.path_params["address"]))
        except (SapoError, OSError) as exc:
            return fail(exc)

    async def api_verify(request: Request) -> Response:
        q = request.query_params
        try:
            answer = await explorer.verify(
                request.path_params["hash"],
                node=q.get("node") or None,
                round_=q.get("round"),
                kind=q.get("kind"),
                proof=q.get("proof"),
            )
        except (SapoError, OSError) as exc:
            return fail(exc)
        return JSONResponse(answer)

    async def api_events(request: Request) -> Response:
        return StreamingResponse(
            _events(request.app, explorer),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    async def api_missing(request: Request) -> Response:
        return _error(404, "no_such_api", f"no API at {request.url.path}: see /api/swarm")

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if request.url.path.startswith("/api/"):
            return _error(status, "no_such_api", f"no API at {request.url.path}")
        return Response(f"{status}: no page at {request.url.path}", status_code=status)

    async def crashed(request: Request, exc: Exception) -> Response:
        return fail(exc)

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/node/{address}", page),
            Route("/verify", page),
            Route("/api/swarm", api_swarm),
            Route("/api/node/{address}", api_node),
            Route("/api/verify/{hash}", api_verify),
            Route("/api/events", api_events),
            Route("/api/{rest:path}", api_missing),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={404: not_found, 405: not_found, Exception: crashed},
    )
    app.state.closing = False
    return app


async def _events(app: Starlette, explorer: Explorer) -> AsyncIterator[str]:
    """The live stream: a ``swarm`` event per new snapshot, ``problem`` while failing."""
    sent: int | None = None
    problem = ""
    while not app.state.closing:
        try:
            snapshot: dict[str, Any] = await explorer.swarm()
        except (SapoError, OSError) as exc:
            status, code, message = error_status(exc, explorer.chain)
            if message != problem:
                problem = message
                body = {"status": status, "code": code, "message": message}
                yield f"event: problem\ndata: {json.dumps(body)}\n\n"
        else:
            problem = ""
            if snapshot["revision"] != sent:
                sent = snapshot["revision"]
                yield f"event: swarm\ndata: {json.dumps(snapshot)}\n\n"
        await anyio.sleep(limits.EXPLORER_POLL_S)
