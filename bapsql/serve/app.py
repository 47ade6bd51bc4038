"""The HTTP service: budgeted answers over registered SQLite databases (FastAPI on uvicorn).

Routes (OpenAPI docs at ``/docs``):

- ``POST /v1/ask`` — `bapsql.serve.models.AskRequest` in, `bapsql.serve.views.ask_view` out (one budgeted episode);
- ``POST /v1/ask/stream`` — the same episode as server-sent events: one ``turn`` event per turn as it is played,
  then one ``answer`` event (or one ``error`` event with the HTTP status it would have had);
- ``GET /v1/databases`` — names, tables, row counts, and the budget levels with their channels;
- ``GET /healthz`` — liveness; ``GET /`` — the web page (`bapsql/serve/static/index.html`).

Safe by default: with ``api_key`` set every ``/v1`` route needs ``Authorization: Bearer KEY`` (401 otherwise);
bodies over ``max_body_bytes`` are refused (413) whether or not they announce their length; malformed JSON → 400,
a wrong or missing field → 422, an unknown database → 404, an unknown budget → 422, each with a message saying what
to send; a model engine that is down or failing → 503 with the reason (the server stays up). Requests only name
registered databases. Everything else an episode can do goes through the shield.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from bapsql.errors import BapsqlError, DatabaseBusy, EngineError
from bapsql.serve.models import EXPECTED, MAX_BODY_BYTES, AskRequest
from bapsql.serve.session import Asker

log = logging.getLogger(__name__)
PAGE = Path(__file__).resolve().parent / "static" / "index.html"


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with 413, whether announced (Content-Length) or
    streamed (chunked): the body is read in full — at most ``limit`` bytes — before the route sees it."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refuse = JSONResponse({"error": f"request body over {self.limit} bytes; send a JSON object like "
                                        f"{json.dumps(EXPECTED)}"}, status_code=413)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await refuse(scope, receive, send)
        chunks, seen, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            chunks.append(msg.get("body", b""))
            seen += len(chunks[-1])
            more = msg.get("more_body", False)
            if seen > self.limit:
                return await refuse(scope, receive, send)
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _failure(exc: BaseException) -> tuple[int, str]:
    """HTTP status and message of an episode that failed."""
    if isinstance(exc, EngineError):
        return 503, f"the model engine is unavailable: {exc}; try again later"
    if isinstance(exc, DatabaseBusy):
        return 503, f"the database is busy: {exc}; try again later"
    if isinstance(exc, BapsqlError):
        return 500, f"{type(exc).__name__}: {exc}"
    log.exception("served episode failed", exc_info=exc)
    return 500, f"internal error ({type(exc).__name__}); see the server log"


def create_app(asker: Asker, *, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               engine_label: str = "") -> FastAPI:
    """The service over ``asker`` (see the module docstring)."""
    registry = asker.registry

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def flush_loop() -> None:
            while True:
                await asyncio.sleep(asker.options.flush_s)
                await asyncio.get_running_loop().run_in_executor(None, asker.flush)

        task = asyncio.create_task(flush_loop())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.get_running_loop().run_in_executor(None, asker.flush)

    app = FastAPI(title="bapsql serve", version="1", lifespan=lifespan,
                  description="Budgeted question answering over registered SQLite databases: every request is one "
                              "budgeted episode (estimator, shield, ledger, evidence), logged to Parquet.")
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise _Unauthorized()

    class _Unauthorized(Exception):
        pass

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_request: Request, _exc: _Unauthorized) -> JSONResponse:
        return JSONResponse({"error": "missing or wrong API key; send the header 'Authorization: Bearer KEY' "
                                      "(the key is in the server's --api-key-env variable)"},
                            status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") in ("json_invalid", "model_attributes_type") for e in errors) or not errors:
            return _error(400, "the body is not a JSON object; send one like "
                               '{"db": "NAME", "question": "TEXT", "budget": "S"}', expected=EXPECTED)
        problems = []
        for e in errors:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {e.get('msg')}")
        return _error(422, "; ".join(problems), expected=EXPECTED)

    def _check(req: AskRequest) -> JSONResponse | str:
        """The budget level to play, or the 4xx answer."""
        if req.db not in registry:
            return _error(404, f"unknown database {req.db!r}; registered: {list(registry.names)} "
                               "(GET /v1/databases lists them)", databases=list(registry.names))
        level = req.budget or asker.options.default_budget
        if level not in asker.ladder.levels:
            return _error(422, f"unknown budget {level!r}; send one of {list(asker.ladder.levels)}",
                          budgets=list(asker.ladder.levels))
        return level

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict:
        return {"status": "ok", "databases": len(registry), "engine": engine_label, "condition":
                asker.options.condition, "episodes_logged": asker.logged, "auth": api_key is not None}

    @app.get("/v1/databases", summary="Registered databases and budget levels", dependencies=[Depends(authorized)])
    async def databases() -> dict:
        return {"databases": registry.to_json(), "default_budget": asker.options.default_budget,
                "budgets": {lv: asker.ladder[lv].as_dict() for lv in asker.ladder.levels},
                "condition": asker.options.condition}

    @app.post("/v1/ask", summary="Answer a question under a budget", dependencies=[Depends(authorized)])
    async def ask(req: AskRequest) -> Any:
        level = _check(req)
        if isinstance(level, JSONResponse):
            return level
        loop = asyncio.get_running_loop()
        call = functools.partial(asker.ask, req.db, req.question, level, submitted=time.perf_counter())
        try:
            return await loop.run_in_executor(asker.pool, call)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer; the server stays up
            status, message = _failure(exc)
            return _error(status, message)

    @app.post("/v1/ask/stream", summary="The same, as server-sent events (turn..., answer | error)",
              dependencies=[Depends(authorized)])
    async def ask_stream(req: AskRequest) -> Any:
        level = _check(req)
        if isinstance(level, JSONResponse):
            return level
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_turn(view: dict) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ("turn", view))

        call = functools.partial(asker.ask, req.db, req.question, level, submitted=time.perf_counter(),
                                 on_turn=on_turn)
        future = loop.run_in_executor(asker.pool, call)
        future.add_done_callback(lambda f: queue.put_nowait(("done", f)))

        async def events():
            while True:
                kind, item = await queue.get()
                if kind == "turn":
                    yield f"event: turn\ndata: {json.dumps(item)}\n\n"
                    continue
                exc = item.exception()
                if exc is None:
                    yield f"event: answer\ndata: {json.dumps(item.result())}\n\n"
                else:
                    status, message = _failure(exc)
                    yield f"event: error\ndata: {json.dumps({'status': status, 'error': message})}\n\n"
                return

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return app
