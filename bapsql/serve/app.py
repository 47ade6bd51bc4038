"""The HTTP service: budgeted answers over registered SQLite databases (FastAPI on uvicorn).

Routes (OpenAPI docs at ``/docs``):

- ``POST /v1/ask`` — `bapsql.serve.models.AskRequest` in, `bapsql.serve.views.ask_view` out (one budgeted episode);
- ``POST /v1/ask/stream`` — the same episode as server-sent events: one ``turn`` event per turn as it is played,
  then one ``answer`` event (or one ``error`` event with the HTTP status it would have had);
- ``GET /v1/databases`` — names, tables, row counts, and the budget levels with their channels;
- ``GET /healthz`` — health: 200 while the model engine serves, 503 with the reason while it is dead or being
  restarted (`bapsql.rollout.engines.batching.EngineHealth`); ``GET /`` — the web page
  (`bapsql/serve/static/index.html`).

Safe by default: with ``api_key`` set every ``/v1`` route needs ``Authorization: Bearer KEY`` (401 otherwise);
bodies over ``max_body_bytes`` are refused (413) whether or not they announce their length; malformed JSON → 400,
a wrong or missing field → 422, an unknown database → 404, an unknown budget → 422, each with a message saying what
to send; a model engine that is down, failing or dead → 503 with the reason (the server stays up). Requests only
name registered databases. Everything else an episode can do goes through the shield.

Bounded work: at most ``concurrency`` episodes run and ``max_queue`` wait (`bapsql.serve.control.Admission`); a
request beyond that is refused at once with 429 and a ``Retry-After`` header (seconds: the expected wait). Each
request has a deadline (``request_timeout_s`` from its arrival): past it the episode stops, its turns so far are
logged as ``timed_out``, and the answer is 504 (an ``error`` event with status 504 on a stream). A stream whose
client disconnects cancels its episode (its engine request is withdrawn); its turns so far are logged as
``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from bapsql.errors import BapsqlError, DatabaseBusy, EngineError, RequestCancelled, RequestTimeout
from bapsql.serve.control import EpisodeControl
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


def _consume(future: asyncio.Future) -> None:
    """Retrieve the outcome of a future nobody awaits any more (no "exception was never retrieved" warning)."""
    if not future.cancelled():
        future.exception()


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _failure(exc: BaseException) -> tuple[int, str]:
    """HTTP status and message of an episode that failed."""
    if isinstance(exc, RequestTimeout):
        return 504, str(exc)
    if isinstance(exc, RequestCancelled):
        return 499, str(exc)  # nobody reads it: the client is gone
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

    @app.get("/healthz", summary="Health: 200 while the engine serves, 503 with the reason when it does not")
    async def healthz() -> Any:
        health = asker.health()
        body = {"status": "ok" if health.ok else f"engine {health.state}", "databases": len(registry),
                "engine": engine_label, "engine_state": health.state, "engine_restarts": health.restarts,
                "condition": asker.options.condition, "episodes_logged": asker.logged,
                "requests_in": asker.admission.inside, "engine_batch_peak": getattr(asker.turns, "peak_batch", None),
                "auth": api_key is not None}
        if health.ok:
            return body
        return JSONResponse({**body, "reason": health.reason}, status_code=503)

    @app.get("/v1/databases", summary="Registered databases and budget levels", dependencies=[Depends(authorized)])
    async def databases() -> dict:
        return {"databases": registry.to_json(), "default_budget": asker.options.default_budget,
                "budgets": {lv: asker.ladder[lv].as_dict() for lv in asker.ladder.levels},
                "condition": asker.options.condition}

    def _start(req: AskRequest, on_turn: Any = None) -> tuple[Future, EpisodeControl] | JSONResponse:
        """Admit the request and start its episode, or the 4xx / 429 / 503 answer."""
        level = _check(req)
        if isinstance(level, JSONResponse):
            return level
        health = asker.health()
        if not health.ok:
            return _error(503, f"the model engine is unavailable ({health.state}: {health.reason}); try again later")
        control = asker.control()
        future = asker.submit(req.db, req.question, level, control, on_turn=on_turn)
        if future is None:
            wait = asker.admission.retry_after_s()
            return JSONResponse({"error": f"the service is at capacity ({asker.options.concurrency} episodes running, "
                                          f"{asker.options.max_queue} waiting); retry after {wait} s",
                                 "retry_after_s": wait}, status_code=429, headers={"Retry-After": str(wait)})
        return future, control

    def _expire(future: Future, control: EpisodeControl) -> tuple[int, str]:
        """The deadline passed while the client waited: stop the episode; the 504 answer."""
        control.expire()
        future.cancel()
        return _failure(control.error())

    @app.post("/v1/ask", summary="Answer a question under a budget", dependencies=[Depends(authorized)])
    async def ask(req: AskRequest) -> Any:
        started = _start(req)
        if isinstance(started, JSONResponse):
            return started
        future, control = started
        waiting = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), timeout=control.remaining())
        except asyncio.TimeoutError:
            waiting.add_done_callback(_consume)
            return _error(*_expire(future, control))
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer; the server stays up
            status, message = _failure(exc)
            return _error(status, message)

    @app.post("/v1/ask/stream", summary="The same, as server-sent events (turn..., answer | error)",
              dependencies=[Depends(authorized)])
    async def ask_stream(req: AskRequest) -> Any:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: tuple) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody listens any more
                loop.call_soon_threadsafe(queue.put_nowait, item)

        started = _start(req, on_turn=lambda view: put(("turn", view)))
        if isinstance(started, JSONResponse):
            return started
        future, control = started
        future.add_done_callback(lambda f: put(("done", f)))

        def error_event(status: int, message: str) -> str:
            return f"event: error\ndata: {json.dumps({'status': status, 'error': message})}\n\n"

        async def events():
            over = False
            try:
                while True:
                    try:
                        kind, item = await asyncio.wait_for(queue.get(), timeout=control.remaining())
                    except asyncio.TimeoutError:
                        over = True
                        yield error_event(*_expire(future, control))
                        return
                    if kind == "turn":
                        yield f"event: turn\ndata: {json.dumps(item)}\n\n"
                        continue
                    over = True
                    if item.cancelled():
                        yield error_event(*_failure(RequestCancelled("the episode was withdrawn")))
                        return
                    exc = item.exception()
                    if exc is None:
                        yield f"event: answer\ndata: {json.dumps(item.result())}\n\n"
                    else:
                        yield error_event(*_failure(exc))
                    return
            finally:
                if not over:  # the client went away (the response task was cancelled): stop its episode
                    control.cancel()
                    future.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return app
