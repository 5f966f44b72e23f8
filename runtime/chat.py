"""A multi-turn chat session over an Engine (history re-rendered with the chat template)."""
from __future__ import annotations

from typing import Iterator

from .engine import Engine
from .sampling import SamplingParams


class ChatSession:
    def __init__(self, engine: Engine, sampling: SamplingParams, max_tokens: int = 512,
                 response_format: dict | None = None):
        """``response_format``: every answer obeys it (OpenAI's json_object / json_schema)."""
        self.engine, self.sampling, self.max_tokens = engine, sampling, max_tokens
        self.response_format = response_format
        self.messages: list[dict[str, str]] = []
        self.last_stats: dict = {}

    def reset(self) -> None:
        self.messages.clear()
        self.last_stats = {}

    def send(self, text: str) -> Iterator[str]:
        self.messages.append({"role": "user", "content": text})
        ids = self.engine.tokenizer.encode(self.engine.render(self.messages), add_special_tokens=False).ids
        result = None
        try:
            for delta, result in self.engine.generate_stream(ids, self.max_tokens, self.sampling,
                                                             response_format=self.response_format):
                yield delta
        except Exception:
            self.messages.pop()
            raise
        self.messages.append({"role": "assistant", "content": result.text})
        self.last_stats = result.stats.to_dict()
