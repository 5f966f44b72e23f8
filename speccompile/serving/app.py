"""``speccompile serve``: an OpenAI-compatible HTTP server over the continuous-batching scheduler.

The HTTP layer (FastAPI on uvicorn's event loop) validates, tokenizes and submits; the
scheduler's engine thread runs every model forward (``runtime/scheduler.py``). Results
cross threads through ``loop.call_soon_threadsafe`` into one asyncio queue per request.
A request whose client disconnects is cancelled, which frees its KV pages at the next
step boundary. Every error leaves in the OpenAI schema
``{"error": {"message", "type", "param", "code"}}``: 400 for malformed or invalid input
(pydantic's 422 included), 401 for a wrong API key, 404 for an unknown model or route,
429 when the queue is full, 503 when the engine thread is down.

This module holds the app itself: its routes and error handlers. The state the routes share
is ``serving/state.py``'s ``ServingState``; the generation endpoints' per-request work
(validation, submission, the JSON answer and the SSE stream) is ``serving/completion.py``.
"""
from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from speccompile import __version__
from speccompile.runtime.engine import Engine
from speccompile.runtime.scheduler import Scheduler
from speccompile.serving.api import APIError, error_response
from speccompile.serving.choices import Choices
from speccompile.serving.completion import complete
from speccompile.serving.state import ServingState

log = logging.getLogger("speccompile.serving.app")


def _install_error_handlers(app: FastAPI) -> None:
    """Make every error leave in the OpenAI schema, whoever raised it."""

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_request, exc: RequestValidationError):
        # pydantic's 422 becomes OpenAI's 400, naming the first offending field
        first = (exc.errors() or [{}])[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(400, first.get("msg", "invalid request"), param=loc or None, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request, exc: StarletteHTTPException):
        codes = {404: "not_found", 405: "method_not_allowed"}
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(exc.status_code, str(exc.detail), kind, code=codes.get(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(_request, exc: Exception):
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error", code="internal_error")


def create_app(scheduler: Scheduler, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app; the lifespan starts and stops the scheduler's engine thread."""
    server = ServingState(scheduler, model_name, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if not scheduler.alive:
            scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="speccompile", version=__version__, lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, server.metrics
    _install_error_handlers(app)

    @app.get("/health")
    async def health():
        if not scheduler.alive:
            return error_response(503, "the engine thread is not running", "server_error", code="engine_unavailable")
        return {"status": "ok", **scheduler.snapshot()}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request):
        server.authorize(request)
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        server.authorize(request)
        if model_id != model_name:
            raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        return server.model_card()

    @app.get("/")
    async def root():
        return PlainTextResponse(f"speccompile {__version__}: OpenAI-compatible API under /v1, see /docs\n")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(server, request, chat=True, choices=Choices)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(server, request, chat=False, choices=Choices)

    return app


def run_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               max_num_sequence: int | None = None, prefill_tokens_per_step: int = 256, max_queue: int = 1024,
               served_model_name: str | None = None, log_level: str = "info") -> None:
    import uvicorn

    engine.warm_up()  # before the scheduler thread owns the engine
    scheduler = Scheduler(engine, max_num_sequence, prefill_tokens_per_step, max_queue)
    name = served_model_name or engine.model_dir.name
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("serving on %s without --api-key: anyone who can reach this port can use the model", host)
    app = create_app(scheduler, name, api_key)
    print(f"speccompile serve: model '{name}' on http://{host}:{port}/v1 "
          f"(speculative mode {engine.spec.speculative_mode}, {engine.kv.num_pages} KV pages)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
