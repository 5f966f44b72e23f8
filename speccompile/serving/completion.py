"""The generation endpoints (``/v1/chat/completions``, ``/v1/completions``): one request's
way from the HTTP body to the scheduler and back.

``complete`` is the whole story in order. ``_prepare`` checks the request, tokenizes its
prompt and compiles its grammar, so every client error is answered (400, 401, 404) before
anything is queued. A ``CompletionRun`` then submits it: from that moment the engine thread
calls the run's ``_deliver`` with each step's ``Event``, and ``_deliver`` hands the event to
the event loop with ``loop.call_soon_threadsafe`` (an asyncio queue may only be touched from
its own loop's thread). The run answers with one JSON body (``answer``) or streams
Server-Sent Events as the text grows (``stream``). A client that goes away cancels its
request, which frees its KV pages at the scheduler's next step boundary.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from pydantic import ValidationError

from speccompile.runtime.engine import Engine
from speccompile.runtime.grammar import GrammarError, schema_of
from speccompile.runtime.penalties import check_ids
from speccompile.runtime.metrics import prediction_usage
from speccompile.runtime.prediction import check_prediction
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.scheduler import Event, QueueFull
from speccompile.runtime.sequence import GenerationError
from speccompile.runtime.tools import call_grammar, check_tools, held_back, parse_calls, template_messages
from speccompile.serving.api import (APIError, ChatCompletionRequest, CompletionRequest, chat_logprobs,
                                    completion_logprobs, error_body, error_response, validation_error)
from speccompile.serving.state import ServingState


def sse_line(obj: dict) -> str:
    """One Server-Sent Event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def complete(server: ServingState, request: Request, chat: bool, choices=None) -> Response:
    """Serve one generation request: the chat endpoint's when ``chat``, else the completions one.
    A request refused before it reaches the engine counts as "rejected" in the metrics.
    ``choices``: what answers a request for ``n`` > 1 (serving/choices.py's ``Choices``)."""
    try:
        job = await _prepare(server, request, chat)
        if not server.scheduler.alive:
            raise APIError(503, "the engine thread is not running", "server_error", code="engine_unavailable")
        if (job.req.n or 1) > 1 and choices is not None:  # several choices, one sequence each
            multi = choices(server, request, chat, job)
        else:
            run = CompletionRun(server, request, chat, job)
    except APIError:
        server.metrics.requests.labels("chat" if chat else "completions", "rejected").inc()
        raise
    if (job.req.n or 1) > 1 and choices is not None:
        return await multi.respond()
    return run.stream() if job.req.stream else await run.answer()


async def wait_disconnect(request: Request) -> None:
    """Returns when the client goes away: after the body, the ASGI receive channel yields
    nothing until then."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ------------------------------------------------------------------ preparation
@dataclass
class _Job:
    """A checked request, ready to submit: what ``_prepare`` derived from the body."""

    req: ChatCompletionRequest | CompletionRequest
    stop: list[str]
    sampling: SamplingParams
    offered: list[dict]  # the tools the model may call: none without tools or with tool_choice "none"
    ids: list[int]  # the prompt's tokens
    grammar: object  # the answer's constraint (engine.grammars), or None
    top: int | None  # how many top logprobs each token reports; None: no logprobs asked
    prediction: list[int] | None = None  # Predicted Outputs: the prediction's tokens (runtime/prediction.py)


async def _prepare(server: ServingState, request: Request, chat: bool) -> _Job:
    """Authorize, parse and check the request; tokenize its prompt and compile its grammar.
    Raises ``APIError`` for anything the client got wrong."""
    engine = server.engine
    server.authorize(request)
    body = await request.body()
    try:
        req = (ChatCompletionRequest if chat else CompletionRequest).model_validate_json(body)
    except ValidationError as err:
        raise validation_error(err) from err
    if req.model != server.model_name:
        raise APIError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
    req.check_supported()
    limit = server.scheduler.max_num_sequence
    if (req.n or 1) > limit:
        raise APIError(400, f"n={req.n} exceeds the {limit} sequences this server decodes at once "
                            "(serve --max-num-sequence)", param="n", code="invalid_value")
    stop = req.stop_list()
    values = req.sampling_values(engine.config)
    try:
        sampling = SamplingParams(**values)
        check_ids(sampling, engine.model.vocab_size)
    except ValueError as err:  # the field the message names (logit_bias, a penalty ...)
        param = next((k for k in values if k in str(err)), None)
        raise APIError(400, str(err), param=param, code="invalid_value") from err
    try:
        functions = check_tools(req.tools, req.tool_choice) if chat else []
        offered = functions if chat and req.tool_choice != "none" else []
        if offered and schema_of(req.response_format) is not None:
            raise GrammarError("response_format cannot apply while tools are offered (the answer may be a "
                               "call): send tool_choice 'none' or no tools", "response_format")
        ids = prompt_ids(engine, server.max_model_len(), req, chat, offered)
        # compiled off the event loop: a bad schema is the client's 400, before any queueing
        grammar = await asyncio.to_thread(constrain, engine, req, offered)
    except GrammarError as err:
        raise APIError(400, str(err), param=err.param, code="invalid_value") from err
    top = req.logprob_count()
    if top is not None:  # token texts come from the byte-level tokenizer, built once
        await asyncio.to_thread(engine.grammars.tokenizer)
    text = req.prediction_text()
    predicted = engine.tokenizer.encode(text, add_special_tokens=False).ids if text else None
    try:
        check_prediction(engine, predicted)
    except GenerationError as err:
        raise APIError(400, str(err), param="prediction", code="invalid_value") from err
    return _Job(req, stop, sampling, offered, ids, grammar, top, predicted)


def prompt_ids(engine: Engine, limit: int, req, chat: bool, functions: list[dict]) -> list[int]:
    """The prompt's tokens; ``functions``: the tools offered to the model; ``limit``: the
    longest sequence a request may have (the prompt must leave room for one token)."""
    param = "messages" if chat else "prompt"
    try:
        if chat:
            own = engine.template_has_tools  # else the tools are described in a system message
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
    if len(ids) >= limit:
        raise APIError(400, f"This model's maximum context length (and KV capacity) is {limit} tokens; "
                       f"the prompt has {len(ids)}.", param=param, code="context_length_exceeded")
    return ids


def constrain(engine: Engine, req, offered: list[dict]):
    """The grammar of the answer: a forced tool call's, or the response format's."""
    lark = call_grammar(offered, req.tool_choice, engine.grammars.tag_token) if offered else None
    if lark is not None:
        return engine.grammars.lark_constraint(lark, "tools")
    return engine.grammars.constraint(req.response_format)


# ------------------------------------------------------------------- one request
class CompletionRun:
    """One submitted request, from its submission to its last event.

    Created on the event loop; submitting happens in ``__init__`` (``QueueFull`` and the
    scheduler's own rejections become 429 and 400). Events arrive through ``_deliver`` on the
    engine thread and wait in ``_queue`` for ``answer`` or ``stream`` to take them. A task
    (``_watcher``) notices the client going away, which cancels the request."""

    def __init__(self, server: ServingState, request: Request, chat: bool, job: _Job, index: int = 0,
                 watcher: asyncio.Future | None = None, share_with: "CompletionRun | None" = None):
        """``index``: the choice this run answers (``n`` > 1: serving/choices.py runs one per
        choice, sharing one ``watcher`` of the client's connection, and copying the first
        choice's prefill, ``share_with``)."""
        self.share_with = share_with
        self.server, self.request, self.chat, self.job, self.index = server, request, chat, job, index
        self.endpoint = "chat" if chat else "completions"  # the metrics' label
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.sampling = job.sampling if job.sampling.seed is None or not index else \
            dataclasses.replace(job.sampling, seed=(job.sampling.seed + index) % (1 << 64))  # a seed per choice
        self.handle = self._submit()
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._owns_watcher = watcher is None
        self._watcher = watcher if watcher is not None else asyncio.ensure_future(self._wait_disconnect())
        self.final: Event | None = None  # the last event, once in
        self.closing = True  # a stream ends with the usage and [DONE] (not one choice of several)

    def _submit(self):
        job = self.job
        try:
            return self.server.scheduler.submit(job.ids, job.req.token_limit(), self.sampling, job.stop, self._deliver,
                                                ignore_eos=job.req.ignore_eos, speculative=job.req.speculative,
                                                grammar=job.grammar, top_logprobs=job.top,
                                                tenant=self.server.tenant(self.request), prediction=job.prediction,
                                                prefill_from=self.share_with.handle if self.share_with else None)
        except QueueFull as err:
            raise APIError(429, f"the server is busy: {err}; retry later", "rate_limit_error",
                           code="queue_full") from err
        except ValueError as err:
            raise APIError(400, str(err), param="messages" if self.chat else "prompt", code="invalid_value") from err

    def _deliver(self, r, event: Event) -> None:
        """The scheduler's callback, run on the engine thread: hand the event to the loop."""
        self.server.metrics.observe(r, event)
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def _wait_disconnect(self) -> None:
        await wait_disconnect(self.request)

    async def _next_event(self) -> Event | None:
        """The next engine event, or None once the client has gone away."""
        if not self._queue.empty():
            return self._queue.get_nowait()
        getter = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({getter, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        return None

    def _finish(self, event: Event) -> None:
        """Count the request's outcome, once its last event is in."""
        outcome = "error" if event.error else (event.finish_reason or "stop")
        self.server.metrics.requests.labels(self.endpoint, outcome).inc()

    def _cancel(self) -> None:
        """Stop generating for a client that went away (or whose handler was cancelled)."""
        self.server.scheduler.cancel(self.handle)
        self.server.metrics.forget(self.handle)
        self.server.metrics.requests.labels(self.endpoint, "cancelled").inc()

    def _usage(self, event: Event) -> dict:
        prompt = len(self.job.ids)
        usage = {"prompt_tokens": prompt, "completion_tokens": event.completion_tokens,
                 "total_tokens": prompt + event.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": event.cached_tokens}}
        if self.job.prediction and event.finished:  # the result is the engine thread's until the end
            usage["completion_tokens_details"] = prediction_usage(self.job.prediction, self.handle.seq.result.token_ids)
        return usage

    def _logprobs(self, entries: list | None, offset: int) -> dict | None:
        """The OpenAI ``logprobs`` of these entries (``offset``: where their text starts)."""
        if entries is None:
            return None
        token_bytes = self.server.engine.grammars.token_bytes
        if self.chat:
            return chat_logprobs(entries, token_bytes)
        return completion_logprobs(entries, token_bytes, offset)

    # ------------------------------------------------------------ one JSON answer
    async def answer(self) -> Response:
        """Wait for the last event and answer with the whole completion; 499 (and a
        cancelled request) when the client goes away first."""
        event, entries = await self.collect()
        if event is None:
            return Response(status_code=499)
        if event.error:
            return error_response(500, event.error, "server_error", code="engine_error")
        return JSONResponse(self._answer_body(event, entries))

    async def collect(self) -> tuple[Event | None, list | None]:
        """(the last event, the logprob entries if asked for); (None, _) when the client went
        away first (the request is then cancelled)."""
        entries = [] if self.job.top is not None else None
        try:
            while True:
                event = await self._next_event()
                if event is None:
                    self._cancel()
                    return None, entries
                if entries is not None and event.logprobs:
                    entries += event.logprobs
                if event.finished:
                    break
        except asyncio.CancelledError:
            self._cancel()
            raise
        finally:
            if self._owns_watcher:
                self._watcher.cancel()
        self._finish(event)
        return event, entries

    def _answer_body(self, event: Event, entries: list | None) -> dict:
        """The completion object of a finished request; an answer that parses as tool calls
        becomes a message with ``tool_calls`` and finish reason "tool_calls"."""
        choice = ({"index": self.index, "message": {"role": "assistant", "content": event.text}} if self.chat
                  else {"index": self.index, "text": event.text})
        reason = event.finish_reason
        offered = self.job.offered
        content, calls = parse_calls(event.text, offered) if offered else (None, [])
        if calls:
            choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
            reason = "tool_calls"
        choice.update({"logprobs": self._logprobs(entries, 0), "finish_reason": reason})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.server.model_name, "system_fingerprint": None,
                "choices": [choice], "usage": self._usage(event)}

    # ------------------------------------------------------------------ SSE stream
    def stream(self) -> StreamingResponse:
        return StreamingResponse(self._events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _events(self, closing: bool = True):
        """The SSE body: text as soon as it can no longer become part of a stop string, tool
        calls whole once complete, then the finish reason, the usage (if asked) and [DONE]
        (without ``closing``, neither: one choice of several). Ends silently when the client
        goes away; a request it did not finish is cancelled."""
        self.closing = closing
        stop, offered = self.job.stop, self.job.offered
        hold = max((len(s) for s in stop), default=1) - 1  # text that may still become a stop string
        sent, done = 0, False
        pending: list = []  # logprob entries of tokens whose text is not sent yet
        try:
            if self.chat:
                yield sse_line(self._chunk("", role=True))
            while True:
                event = await self._next_event()
                if event is None:
                    return
                if event.error:
                    done = True
                    self._finish(event)
                    yield sse_line(error_body(event.error, "server_error", code="engine_error"))
                    break
                pending += event.logprobs or []
                safe = len(event.text) if event.finished else max(sent, len(event.text) - hold)
                if offered:  # a tool call is sent whole, once it is complete
                    safe = min(safe, sent + held_back(event.text[sent:]))
                    if event.finished:
                        content, calls = parse_calls(event.text[sent:], offered)
                        if calls:
                            done = True
                            self._finish(event)
                            for line in self._tool_call_lines(event, content, calls):
                                yield line
                            break
                        safe = len(event.text)
                if safe > sent:
                    lps = self._logprobs(pending, sent) if self.job.top is not None else None
                    yield sse_line(self._chunk(event.text[sent:safe], lps=lps))
                    sent, pending = safe, []
                if event.finished:
                    done = True
                    self._finish(event)
                    for line in self._closing_lines(event, event.finish_reason):
                        yield line
                    break
            if closing:
                yield "data: [DONE]\n\n"
        finally:
            if self._owns_watcher:
                self._watcher.cancel()
            if not done:
                self._cancel()

    def _tool_call_lines(self, event: Event, content: str | None, calls: list[dict]) -> list[str]:
        """The last events of an answer that ends in tool calls: the text before them, each
        call in its own chunk, then the "tool_calls" finish (and usage)."""
        lines = [sse_line(self._chunk(content))] if content else []
        lines += [sse_line(self._chunk(None, tool_call={"index": i, **call})) for i, call in enumerate(calls)]
        return lines + self._closing_lines(event, "tool_calls")

    def _closing_lines(self, event: Event, finish_reason: str | None) -> list[str]:
        """The finish-reason chunk, then the usage chunk when the client asked for it."""
        self.final = event
        lines = [sse_line(self._chunk(None, finish_reason))]
        if self.job.req.include_usage and self.closing:
            lines.append(sse_line(self._chunk_base() | {"choices": [], "usage": self._usage(event)}))
        return lines

    def _chunk_base(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.server.model_name, "system_fingerprint": None}

    def _chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
               lps: dict | None = None, tool_call: dict | None = None) -> dict:
        """One streamed chunk: a chat ``delta`` (content, tool call, role) or a completion's text."""
        if self.chat:
            delta = {} if text is None else {"content": text}
            if tool_call is not None:
                delta["tool_calls"] = [tool_call]
            if role:
                delta["role"] = "assistant"
            choice = {"index": self.index, "delta": delta}
        else:
            choice = {"index": self.index, "text": text or ""}
        choice.update({"logprobs": lps, "finish_reason": finish_reason})
        return self._chunk_base() | {"choices": [choice]}
