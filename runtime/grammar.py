"""Structured output: a grammar every emitted token obeys, applied inside verification.

A request's ``response_format`` (OpenAI's ``json_object`` / ``json_schema``) becomes a
matcher of llguidance (the structured-generation library llama.cpp, vLLM and SGLang use;
no Python dependencies, imported only when a request asks for structure). Speculation
stays lossless under it because the grammar acts where the target's tokens are chosen:

- before the verify forward, ``Constraint.plan`` walks a sequence's draft: a node whose
  token the grammar forbids after its parent's prefix is dropped with its subtree (it could
  never be accepted, so it is not worth a row), and every kept row gets the token mask of
  the grammar state after the prefix it follows (row 0: after the committed text);
- the verification routine runs on logits masked by those rows (forbidden tokens at -inf),
  so greedy acceptance picks each row's masked argmax and rejection sampling runs on the
  masked distributions -- the very tokens plain decoding under the grammar would choose;
- the matcher then consumes only what was emitted. Drafts are never fed to it (the masks
  of deeper rows are computed by consuming a path and rolling it back), so after a step it
  stands exactly where plain decoding would leave it.

Masks are bit sets, 32 tokens per int32 word, as llguidance writes them.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .acceptance import Draft
from .sequence import GenerationError

# JSON whitespace between items: at most a line break and an indent. llguidance's default
# allows any run, and a small model under greedy decoding can pad a value with newlines
# until its budget ends.
JSON_OPTIONS = {"whitespace_pattern": r"[\n]?[ ]{0,16}"}


class GrammarError(GenerationError):
    """A response format that cannot be honoured (bad schema, unsupported type)."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message)
        self.param = param


def schema_of(response_format: dict | None) -> dict | None:
    """The JSON schema an OpenAI ``response_format`` asks for; None for free text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise GrammarError("response_format must be an object such as {\"type\": \"json_object\"}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise GrammarError("response_format.json_schema must be an object with a 'name' and a 'schema' object",
                               "response_format.json_schema")
        schema = spec.get("schema", {})
        return schema if schema else {"type": "object"}
    raise GrammarError(f"response_format.type {kind!r} is not supported: use 'text', 'json_object' or "
                       "'json_schema'", "response_format.type")


def load_response_format(value: str) -> dict:
    """``--response-format``: ``json`` (any JSON object), or a JSON file holding a JSON
    schema or a whole OpenAI ``response_format`` object."""
    if value == "json":
        return {"type": "json_object"}
    path = Path(value)
    if not path.is_file():
        raise GrammarError(f"--response-format {value!r}: give 'json' or the path of a JSON schema file")
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise GrammarError(f"--response-format {value}: not a JSON file ({err})") from err
    if isinstance(obj, dict) and obj.get("type") in ("text", "json_object", "json_schema"):
        return obj
    return {"type": "json_schema", "json_schema": {"name": path.stem, "schema": obj, "strict": True}}


class Grammars:
    """Compiles response formats into per-sequence constraints for one tokenizer. The
    llguidance tokenizer is built on first use (~0.4 s for a 150k vocabulary)."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: list[int]):
        self.tokenizer_json, self.vocab_size, self.eos_ids = Path(tokenizer_json), vocab_size, sorted(eos_ids)
        self._tok = None

    @property
    def words(self) -> int:
        return (self.vocab_size + 31) // 32

    def tokenizer(self):
        if self._tok is None:
            from llguidance import LLTokenizer
            self._tok = LLTokenizer(str(self.tokenizer_json), n_vocab=self.vocab_size,
                                    eos_token=self.eos_ids or None)
        return self._tok

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (a byte-level piece may be part of a UTF-8 character)."""
        return self.tokenizer().decode_bytes([token])

    def constraint(self, response_format: dict | None) -> "Constraint | None":
        """A fresh matcher for one sequence, or None for free text. Raises GrammarError
        naming what is wrong before any forward runs."""
        grammar = compile_format(response_format, self.tokenizer)
        return None if grammar is None else self._constraint(grammar, "response_format.json_schema.schema")

    def lark_constraint(self, lark: str, param: str) -> "Constraint":
        """A matcher of an llguidance Lark grammar (tool calls: runtime/tools.py)."""
        from llguidance import LLMatcher
        grammar = LLMatcher.grammar_from_lark(lark)
        problem = LLMatcher.validate_grammar(grammar, self.tokenizer())
        if problem:
            raise GrammarError(f"cannot be compiled into a grammar: {problem}", param)
        return self._constraint(grammar, param)

    def _constraint(self, grammar: str, param: str) -> "Constraint":
        from llguidance import LLMatcher
        matcher = LLMatcher(self.tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"cannot be compiled into a grammar: {matcher.get_error()}", param)
        return Constraint(matcher, self.words)

    def tag_token(self, text: str) -> int | None:
        """The id of ``text`` when it is one special token of the tokenizer (Qwen's
        ``<tool_call>``), else None."""
        tok = self.tokenizer()
        ids = tok.tokenize_str(text)
        return ids[0] if len(ids) == 1 and tok.is_special_token(ids[0]) else None


def compile_format(response_format: dict | None, tokenizer=None) -> str | None:
    """The llguidance grammar of a response format (None for free text), checked -- against
    ``tokenizer()`` when given, else on its own (what a CLI can do before a model loads)."""
    schema = schema_of(response_format)
    if schema is None:
        return None
    from llguidance import LLMatcher
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as err:
        raise GrammarError(f"the JSON schema is not valid: {err}", "response_format.json_schema.schema") from err
    problem = LLMatcher.validate_grammar(grammar, tokenizer() if tokenizer else None)
    if problem:
        raise GrammarError(f"the JSON schema cannot be compiled: {problem}", "response_format.json_schema.schema")
    return grammar


class Constraint:
    """One sequence's grammar state: the matcher stands after the emitted tokens."""

    def __init__(self, matcher, words: int):
        self.matcher, self.words = matcher, words

    def _mask(self) -> np.ndarray:
        return np.frombuffer(self.matcher.compute_bitmask(), np.int32, count=self.words)

    def root_mask(self) -> np.ndarray:
        """[words] the tokens allowed next."""
        return self._mask()

    def plan(self, draft: Draft) -> tuple[Draft, np.ndarray]:
        """(the draft without the nodes the grammar forbids, masks [kept + 1, words] of the
        rows ``[last] + kept nodes``). Parents come before their children in a draft."""
        parents = draft.parent_list()
        masks = [self._mask()]
        row_of: dict[int, int] = {-1: 0}  # node -> its row among the kept ones
        path: dict[int, list[int]] = {-1: []}
        kept, ended = [], ({-1} if self.matcher.is_stopped() else set())
        for j, p in enumerate(parents):
            if p not in row_of or p in ended or not _allowed(masks[row_of[p]], draft.tokens[j]):
                continue  # its parent was dropped or ended the text, or the grammar forbids it there
            tokens = path[p] + [draft.tokens[j]]
            if not self.matcher.consume_tokens(tokens):  # each was allowed after its prefix
                raise GenerationError(f"internal: the grammar refused a draft path it allowed: "
                                      f"{self.matcher.get_error()}")
            masks.append(self._mask())
            if self.matcher.is_stopped():  # an EOS (or the grammar's end): nothing may follow
                ended.add(j)
            self.matcher.rollback(len(tokens))
            row_of[j], path[j] = len(kept) + 1, tokens
            kept.append(j)
        return draft.subset(kept), np.stack(masks)

    def until_complete(self, tokens: list[int]) -> int:
        """How many of a step's tokens come before the grammar is complete (all of them, or
        up to the one that completes it): a step may verify past the end, plain decoding never
        does. The matcher is left as it was."""
        n = 0
        for tok in tokens:
            if self.matcher.is_stopped() or not self.matcher.consume_token(tok):
                break
            n += 1
        self.matcher.rollback(n)
        return n

    def commit(self, tokens: list[int]) -> bool:
        """The tokens a step emitted (the sequence's EOS excluded, unless it ignores EOS);
        whether the grammar is now complete: nothing may follow."""
        if tokens and not self.matcher.consume_tokens(tokens):
            raise GenerationError(f"internal: the grammar refused emitted tokens {tokens}: "
                                  f"{self.matcher.get_error()}")
        return self.matcher.is_stopped()


def _allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def apply_masks(logits: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """logits [n, vocab] with every token a row's mask [n, words] forbids set to -inf (in place)."""
    bits = np.unpackbits(np.ascontiguousarray(masks).view(np.uint8), axis=-1, bitorder="little")
    logits[bits[:, : logits.shape[1]] == 0] = -np.inf
    return logits


def constrain_drafts(seqs: list, drafts: list[Draft]) -> tuple[list[Draft], list | None]:
    """A step's drafts less what each sequence's grammar forbids, and per sequence the masks
    of its verify rows (None for free text); masks None when no sequence has a grammar."""
    if all(s.grammar is None for s in seqs):
        return drafts, None
    t = time.perf_counter()
    planned = [s.grammar.plan(d) if s.grammar is not None else (d, None) for s, d in zip(seqs, drafts)]
    _charge(seqs, time.perf_counter() - t, step=True)
    return [d for d, _ in planned], [m for _, m in planned]


def mask_rows(logits: np.ndarray, seqs: list, drafts: list[Draft], masks: list) -> np.ndarray:
    """The step's host logits [rows, vocab] with every sequence's masks applied (in place). A
    draft dropped since planning (no KV room for it) leaves row 0, whose mask is the first."""
    t = time.perf_counter()
    words = next(m.shape[1] for m in masks if m is not None)
    rows = [m[: len(d) + 1] if m is not None else np.full((len(d) + 1, words), -1, np.int32)
            for m, d in zip(masks, drafts)]
    apply_masks(logits, np.concatenate(rows))
    _charge(seqs, time.perf_counter() - t, step=False)
    return logits


def _charge(seqs: list, seconds: float, step: bool) -> None:
    """The grammar's time in a step, counted for every sequence under a grammar in it."""
    for s in seqs:
        if s.grammar is not None:
            s.result.stats.grammar_steps += int(step)
            s.result.stats.grammar_seconds += seconds
