"""``speccompile serve``: an OpenAI-compatible HTTP server over the continuous-batching scheduler.

The HTTP layer (FastAPI on uvicorn's event loop) validates, tokenizes and submits; the
scheduler's engine thread runs every model forward (``runtime/scheduler.py``). Results
cross threads through ``loop.call_soon_threadsafe`` into one asyncio queue per request.
A request whose client disconnects is cancelled, which frees its KV pages at the next
step boundary. Every error leaves in the OpenAI schema
``{"error": {"message", "type", "param", "code"}}``: 400 for malformed or invalid input
(pydantic's 422 included), 401 for a wrong API key, 404 for an unknown model or route,
429 when the queue is full, 503 when the engine thread is down.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from speccompile import __version__
from speccompile.runtime.engine import Engine
from speccompile.runtime.grammar import GrammarError, schema_of
from speccompile.runtime.tools import call_grammar, check_tools, held_back, parse_calls, template_messages
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.scheduler import Event, QueueFull, Scheduler
from speccompile.serving.api import (APIError, ChatCompletionRequest, CompletionRequest, chat_logprobs,
                                    completion_logprobs, error_response, validation_error)
from speccompile.serving.metrics import ServerMetrics

log = logging.getLogger("speccompile.serving.app")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(scheduler: Scheduler, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app; the lifespan starts and stops the scheduler's engine thread."""
    engine: Engine = scheduler.engine
    metrics = ServerMetrics(scheduler)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if not scheduler.alive:
            scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="speccompile", version=__version__, lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics

    # ------------------------------------------------------------- errors
    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_request, exc: RequestValidationError):
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

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "Incorrect API key provided. Send it as 'Authorization: Bearer KEY'.",
                           code="invalid_api_key")

    # ------------------------------------------------------------ plain routes
    @app.get("/health")
    async def health():
        if not scheduler.alive:
            return error_response(503, "the engine thread is not running", "server_error", code="engine_unavailable")
        return {"status": "ok", **scheduler.snapshot()}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "speccompile",
                "max_model_len": min(engine.context_window, scheduler.capacity_tokens)}

    @app.get("/v1/models")
    async def list_models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        authorize(request)
        if model_id != model_name:
            raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        return model_card()

    @app.get("/")
    async def root():
        return PlainTextResponse(f"speccompile {__version__}: OpenAI-compatible API under /v1, see /docs\n")

    # -------------------------------------------------------------- generation
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, chat=False)

    def prompt_ids(req, chat: bool, functions: list[dict]) -> list[int]:
        """The prompt's tokens; ``functions``: the tools offered to the model."""
        param = "messages" if chat else "prompt"
        try:
            if chat:
                own = engine.template_has_tools
                messages = template_messages([m.for_template() for m in req.messages], functions, own)
                ids = engine.encode_prompt(engine.render(messages, functions if own else None), raw=True)
            elif isinstance(req.prompt, str):
                ids = engine.encode_prompt(req.prompt, raw=True)
            elif req.prompt and isinstance(req.prompt[0], str):
                ids = engine.encode_prompt(req.prompt[0], raw=True)
            else:
                ids = list(req.prompt)
        except TemplateError as err:
            raise APIError(400, f"the chat template rejected these messages: {err}", param=param,
                           code="invalid_value") from err
        if not ids:
            raise APIError(400, "the prompt is empty", param=param, code="invalid_value")
        limit = min(engine.context_window, scheduler.capacity_tokens)
        if len(ids) >= limit:
            raise APIError(400, f"This model's maximum context length (and KV capacity) is {limit} tokens; "
                           f"the prompt has {len(ids)}.", param=param, code="context_length_exceeded")
        return ids

    def constrain(req, offered: list[dict]):
        """The grammar of the answer: a forced tool call's, or the response format's."""
        lark = call_grammar(offered, req.tool_choice, engine.grammars.tag_token) if offered else None
        if lark is not None:
            return engine.grammars.lark_constraint(lark, "tools")
        return engine.grammars.constraint(req.response_format)

    async def _generate(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            authorize(request)
            body = await request.body()
            try:
                req = (ChatCompletionRequest if chat else CompletionRequest).model_validate_json(body)
            except ValidationError as err:
                raise validation_error(err) from err
            if req.model != model_name:
                raise APIError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
            req.check_supported()
            stop = req.stop_list()
            try:
                sampling = SamplingParams(**req.sampling_values(engine.config))
            except ValueError as err:
                raise APIError(400, str(err), code="invalid_value") from err
            try:
                functions = check_tools(req.tools, req.tool_choice) if chat else []
                offered = functions if chat and req.tool_choice != "none" else []
                if offered and schema_of(req.response_format) is not None:
                    raise GrammarError("response_format cannot apply while tools are offered (the answer may be a "
                                       "call): send tool_choice 'none' or no tools", "response_format")
                ids = prompt_ids(req, chat, offered)
                # compiled off the event loop: a bad schema is the client's 400, before any queueing
                grammar = await asyncio.to_thread(constrain, req, offered)
            except GrammarError as err:
                raise APIError(400, str(err), param=err.param, code="invalid_value") from err
            top = req.logprob_count()
            if top is not None:  # token texts come from the byte-level tokenizer, built once
                await asyncio.to_thread(engine.grammars.tokenizer)
            if not scheduler.alive:
                raise APIError(503, "the engine thread is not running", "server_error", code="engine_unavailable")
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[Event] = asyncio.Queue()

            def deliver(r, event: Event) -> None:  # engine thread
                metrics.observe(r, event)
                loop.call_soon_threadsafe(queue.put_nowait, event)

            try:
                handle = scheduler.submit(ids, req.token_limit(), sampling, stop, deliver, ignore_eos=req.ignore_eos,
                                          speculative=req.speculative, grammar=grammar, top_logprobs=top)
            except QueueFull as err:
                raise APIError(429, f"the server is busy: {err}; retry later", "rate_limit_error",
                               code="queue_full") from err
            except ValueError as err:
                raise APIError(400, str(err), param="messages" if chat else "prompt", code="invalid_value") from err
        except APIError:
            metrics.requests.labels(endpoint, "rejected").inc()
            raise

        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        now = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        async def wait_disconnect() -> None:
            # after the body, the ASGI receive channel yields nothing until the client goes away
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(wait_disconnect())

        async def next_event() -> Event | None:
            """The next engine event, or None once the client has gone away."""
            if not queue.empty():
                return queue.get_nowait()
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                return getter.result()
            getter.cancel()
            return None

        def usage(event: Event) -> dict:
            return {"prompt_tokens": len(ids), "completion_tokens": event.completion_tokens,
                    "total_tokens": len(ids) + event.completion_tokens}

        def logprobs(entries: list | None, offset: int) -> dict | None:
            if entries is None:
                return None
            if chat:
                return chat_logprobs(entries, engine.grammars.token_bytes)
            return completion_logprobs(entries, engine.grammars.token_bytes, offset)

        def finish(event: Event) -> None:
            outcome = "error" if event.error else (event.finish_reason or "stop")
            metrics.requests.labels(endpoint, outcome).inc()

        def cancel() -> None:
            scheduler.cancel(handle)
            metrics.forget(handle)
            metrics.requests.labels(endpoint, "cancelled").inc()

        if not req.stream:
            entries = [] if top is not None else None
            try:
                while True:
                    event = await next_event()
                    if event is None:
                        cancel()
                        return Response(status_code=499)
                    if entries is not None and event.logprobs:
                        entries += event.logprobs
                    if event.finished:
                        break
            except asyncio.CancelledError:
                cancel()
                raise
            finally:
                watcher.cancel()
            finish(event)
            if event.error:
                return error_response(500, event.error, "server_error", code="engine_error")
            choice = ({"index": 0, "message": {"role": "assistant", "content": event.text}} if chat
                      else {"index": 0, "text": event.text})
            reason = event.finish_reason
            content, calls = parse_calls(event.text, offered) if offered else (None, [])
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls"
            choice.update({"logprobs": logprobs(entries, 0), "finish_reason": reason})
            return JSONResponse({"id": rid, "object": obj, "created": now, "model": model_name,
                                 "system_fingerprint": None, "choices": [choice], "usage": usage(event)})

        hold = max((len(s) for s in stop), default=1) - 1  # text that may still become a stop string
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def usage_chunk(event: Event) -> dict:
            return {"id": rid, "object": chunk_obj, "created": now, "model": model_name,
                    "system_fingerprint": None, "choices": [], "usage": usage(event)}

        def chunk(text: str | None, finish_reason: str | None = None, role: bool = False,
                  lps: dict | None = None, tool_call: dict | None = None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                if tool_call is not None:
                    delta["tool_calls"] = [tool_call]
                if role:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta}
            else:
                choice = {"index": 0, "text": text or ""}
            choice.update({"logprobs": lps, "finish_reason": finish_reason})
            return {"id": rid, "object": chunk_obj, "created": now, "model": model_name,
                    "system_fingerprint": None, "choices": [choice]}

        async def stream():
            sent, done = 0, False
            pending: list = []  # logprob entries of tokens whose text is not sent yet
            try:
                if chat:
                    yield _sse(chunk("", role=True))
                while True:
                    event = await next_event()
                    if event is None:
                        return
                    if event.error:
                        done = True
                        finish(event)
                        yield _sse({"error": {"message": event.error, "type": "server_error", "param": None,
                                              "code": "engine_error"}})
                        break
                    pending += event.logprobs or []
                    safe = len(event.text) if event.finished else max(sent, len(event.text) - hold)
                    if offered:  # a tool call is sent whole, once it is complete
                        safe = min(safe, sent + held_back(event.text[sent:]))
                        if event.finished:
                            content, calls = parse_calls(event.text[sent:], offered)
                            if calls:
                                done = True
                                finish(event)
                                if content:
                                    yield _sse(chunk(content))
                                for i, call in enumerate(calls):
                                    yield _sse(chunk(None, tool_call={"index": i, **call}))
                                yield _sse(chunk(None, "tool_calls"))
                                if req.include_usage:
                                    yield _sse(usage_chunk(event))
                                break
                            safe = len(event.text)
                    if safe > sent:
                        lps = logprobs(pending, sent) if top is not None else None
                        yield _sse(chunk(event.text[sent:safe], lps=lps))
                        sent, pending = safe, []
                    if event.finished:
                        done = True
                        finish(event)
                        yield _sse(chunk(None, event.finish_reason))
                        if req.include_usage:
                            yield _sse(usage_chunk(event))
                        break
                yield "data: [DONE]\n\n"
            finally:
                watcher.cancel()
                if not done:
                    cancel()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

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
