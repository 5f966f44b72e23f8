"""``n`` > 1: several choices for one prompt, one sequence each, decoded together.

Each choice is a ``CompletionRun`` of its own (serving/completion.py) with its index, and,
when the request has a ``seed``, the seed ``seed + index``: a choice is reproducible on its
own, and choices differ from each other. The scheduler batches them like any concurrent
requests, so a step verifies every choice's drafts in one forward. The answer holds the
choices in index order; ``usage`` counts the prompt once and every choice's tokens. Streamed,
each choice's chunks carry its index and arrive as they are decoded, then one usage chunk
(if asked) and ``[DONE]``. The prompt is prefilled once: the other choices copy the first
choice's KV rows and last logits row (runtime/shared_prefill.py).
"""
from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from speccompile.serving.api import APIError, error_response
from speccompile.serving.completion import CompletionRun, sse_line, wait_disconnect
from speccompile.serving.state import ServingState


class Choices:
    def __init__(self, server: ServingState, request: Request, chat: bool, job):
        self.job = job
        self.watcher = asyncio.ensure_future(wait_disconnect(request))
        self.runs: list[CompletionRun] = []
        try:
            for i in range(job.req.n):
                self.runs.append(CompletionRun(server, request, chat, job, index=i, watcher=self.watcher,
                                               share_with=self.runs[0] if self.runs else None))
        except APIError:  # a later choice did not fit the queue: the earlier ones stop too
            for run in self.runs:
                run._cancel()
            self.watcher.cancel()
            raise
        for run in self.runs[1:]:  # one completion object: one id
            run.id, run.created = self.runs[0].id, self.runs[0].created

    async def respond(self) -> Response:
        return self.stream() if self.job.req.stream else await self.answer()

    def usage(self, events: list) -> dict:
        usage = self.runs[0]._usage(events[0])
        for run, event in zip(self.runs[1:], events[1:]):
            more = run._usage(event)
            usage["completion_tokens"] += more["completion_tokens"]
            usage["total_tokens"] += more["completion_tokens"]
            for key, value in more.get("completion_tokens_details", {}).items():
                usage["completion_tokens_details"][key] += value
        return usage

    async def answer(self) -> Response:
        try:
            results = await asyncio.gather(*(run.collect() for run in self.runs))
        finally:
            self.watcher.cancel()
        if any(event is None for event, _ in results):  # the client went away (every run cancelled itself)
            return Response(status_code=499)
        failed = next((event.error for event, _ in results if event.error), None)
        if failed:
            return error_response(500, failed, "server_error", code="engine_error")
        bodies = [run._answer_body(event, entries) for run, (event, entries) in zip(self.runs, results)]
        body = bodies[0]
        body["choices"] = [b["choices"][0] for b in bodies]
        body["usage"] = self.usage([event for event, _ in results])
        return JSONResponse(body)

    def stream(self) -> StreamingResponse:
        return StreamingResponse(self._events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _events(self):
        lines: asyncio.Queue = asyncio.Queue()

        async def pump(run: CompletionRun) -> None:
            try:
                async for line in run._events(closing=False):
                    await lines.put(line)
            finally:
                await lines.put(None)

        tasks = [asyncio.ensure_future(pump(run)) for run in self.runs]
        try:
            running = len(tasks)
            while running:
                line = await lines.get()
                if line is None:
                    running -= 1
                else:
                    yield line
            finals = [run.final for run in self.runs]
            if self.job.req.include_usage and all(e is not None for e in finals):
                yield sse_line(self.runs[0]._chunk_base() | {"choices": [], "usage": self.usage(finals)})
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            self.watcher.cancel()
