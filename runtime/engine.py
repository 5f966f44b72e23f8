"""The generation engine: tokenizer + target model + KV cache -> streamed text.

``Engine.generate`` is the embeddable Python API; the CLI's ``generate``, ``chat`` and
``bench`` are thin users of it. Bad input (over-long prompt, out-of-range ids) is
refused before any forward runs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .model import Model
from .sampling import SamplingParams, sample
from .tokenizer import StreamDecoder, load_tokenizer, render_chat

CONFIG_NAME = "speccompile-config.json"


class GenerationError(ValueError):
    pass


@dataclass
class Stats:
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens_per_s": self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0,
            "decode_tokens_per_s": self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0,
        }


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    stats: Stats = field(default_factory=Stats)

    def to_dict(self) -> dict:
        return {"prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids, "text": self.text,
                "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}


def read_model_config(model_dir: Path) -> dict:
    path = Path(model_dir) / CONFIG_NAME
    if not path.exists():
        raise GenerationError(f"{path} not found: run `speccompile gen_config SRC -o {model_dir}`")
    return json.loads(path.read_text())


class Engine:
    """Greedy/sampled generation with one compiled target model (batch 1 per call)."""

    def __init__(self, model_dir: str | Path, model_lib: str | Path, device: str = "cpu",
                 max_total_seq_len: int | None = None):
        self.model_dir = Path(model_dir)
        self.config = read_model_config(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model = Model(self.model_dir, Path(model_lib), device)
        if self.model.meta["model_type"] != self.config["model_type"]:
            raise GenerationError("model library and config disagree on the model type")
        self.context_window = int(self.config["context_window_size"])
        self.kv = self.model.create_kv_cache(max_total_seq_len or self.context_window)
        self.stop_token_ids = set(self.config.get("stop_token_ids", []))
        self._next_seq = 0

    # ----------------------------------------------------------------- prompts
    def render(self, messages: list[dict[str, str]]) -> str:
        cfg = self.config
        return render_chat(cfg["chat_template"], messages, add_generation_prompt=True,
                           bos_token=cfg.get("bos_token") or "", eos_token=cfg.get("eos_token") or "")

    def encode_prompt(self, prompt: str, raw: bool = False) -> list[int]:
        text = prompt if raw else self.render([{"role": "user", "content": prompt}])
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.config.get("bos_token_id")
        if self.config.get("add_bos_token") and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise GenerationError("the prompt is empty")
        if len(ids) >= self.context_window:
            raise GenerationError(
                f"the prompt has {len(ids)} tokens but the context window is {self.context_window}; "
                "shorten it or rebuild with gen_config --context-window-size")
        self.model.check_token_ids(np.asarray(ids))

    # --------------------------------------------------------------- generate
    def generate(self, prompt_ids: list[int], max_tokens: int = 128, sampling: SamplingParams | None = None,
                 stop: list[str] | None = None, ignore_eos: bool = False) -> GenerationResult:
        result = None
        for _, result in self.generate_stream(prompt_ids, max_tokens, sampling, stop, ignore_eos):
            pass
        return result

    def generate_stream(self, prompt_ids: list[int], max_tokens: int = 128, sampling: SamplingParams | None = None,
                        stop: list[str] | None = None, ignore_eos: bool = False) -> Iterator[tuple[str, GenerationResult]]:
        """Yields (text delta, result so far); the last result is final."""
        sampling = sampling or SamplingParams()
        if max_tokens <= 0:
            raise GenerationError("max_tokens must be positive")
        self.check_prompt(prompt_ids)
        rng = np.random.default_rng(sampling.seed)
        res = GenerationResult(prompt_token_ids=list(prompt_ids))
        decoder = StreamDecoder(self.tokenizer)
        seq = self._next_seq
        self._next_seq += 1
        self.kv.add_sequence(seq)
        try:
            t0 = time.perf_counter()
            logits = self._prefill_chunked(seq, prompt_ids)
            res.stats.prefill_tokens = len(prompt_ids)
            res.stats.prefill_seconds = time.perf_counter() - t0
            budget = min(max_tokens, self.context_window - len(prompt_ids))
            t1 = time.perf_counter()
            while True:
                tok = sample(logits, sampling, rng)
                res.token_ids.append(tok)
                if tok in self.stop_token_ids and not ignore_eos:
                    res.token_ids.pop()
                    res.finish_reason = "stop"
                    break
                delta = decoder.push([tok])
                hit = _find_stop(decoder.text, stop)
                if hit is not None:
                    cut = len(decoder.text) - hit
                    res.text = decoder.text[:hit]
                    res.finish_reason = "stop"
                    yield delta[: max(0, len(delta) - cut)], res
                    break
                res.text = decoder.text
                yield delta, res
                if len(res.token_ids) >= budget:
                    res.finish_reason = "length"
                    break
                logits = self.model.decode(self.kv, [seq], [tok])[0]
                res.stats.decode_tokens += 1
            res.stats.decode_seconds = time.perf_counter() - t1
        finally:
            self.kv.remove_sequence(seq)
        yield "", res

    def _prefill_chunked(self, seq: int, ids: list[int]) -> np.ndarray:
        chunk = self.model.prefill_chunk_size
        logits = None
        for start in range(0, len(ids), chunk):
            logits = self.model.prefill(self.kv, [seq], [ids[start:start + chunk]])[0]
        return logits


def _find_stop(text: str, stop: list[str] | None) -> int | None:
    if not stop:
        return None
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None
