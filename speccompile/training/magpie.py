"""Magpie: let the target write the user turns itself.

Why: a draft head predicts what *this* target says in reply to what *its* users ask. Magpie
(Xu et al., 2024) gets user turns from an aligned model alone: render the chat template up
to the opening of a user turn (system prompt + ``<|im_start|>user\\n`` for Qwen) and sample;
the model, trained to answer such turns, writes a plausible one and closes it with its
end-of-turn token. The prompts then follow the target's own idea of its users, with no data
set (none is reachable from these machines).

The prefix is derived from the model's own chat template (``magpie_prefix``), never
hard-coded, so the same code serves Qwen, SmolLM2 and any template that renders a user
message's content verbatim. An optional opener (the first words of the user turn, e.g.
"How do I" or "```python") steers the sample toward a register; with Qwen2.5-Coder,
unseeded samples often came out as quizzes, Chinese or the model answering itself,
while seeded ones read like real requests.

``MagpieSampler`` runs the samples through our engine with continuous refill: the engine's
step primitives (``new_sequence``, ``attach``, ``prefill``, ``step``, ``detach``) keep up
to ``batch`` sequences decoding, and a finished one is replaced at once, instead of a whole
batch waiting for its longest member as ``generate_batch`` does. Each job carries its own
sampling seed, and the engine's logits do not depend on the batch, so a job's text depends
only on (prefix, seed): a resumed run regenerates an interrupted job identically.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.tokenizer import render_chat

SENTINEL = "\x00Magpie user turn\x00"  # mixed case: a template that changes case is caught
# An answer leaking into the sampled user turn: the model asked, then started answering.
# Generation stops there (saving the tokens of an answer that would often run past the
# length cap), and what came before is the user turn. A stop can cut a user's own
# "Here's a snippet:" too; what remains is still a request. ``cut_answer_leak`` catches
# the leaks these literal strings cannot express.
ANSWER_LEAKS = ["\nTo ", "\nSure", "\nCertainly", "\nAnswer:", "\nSolution:", "\nA:", "\nAssistant:", "\nassistant\n",
                "\n**Answer", "\n### Solution", "\n### Answer", "\n\nHere is a ", "\n\nHere's a ", "\n\nHere is an ",
                "\n\nHere's an ", "\n\nYes,", "\n\nIn terms of", "\n\n**Created", "\n\nBelow is", "\n\nOne way",
                "\nAssistant ", "\n\nAssistant"]


_ANSWER_PARAGRAPH = re.compile(
    r"^(?:Sure|Certainly|Of course|Yes[,.!]|No[,.!]|To (?:achieve|solve|do|determine|accomplish|create|implement|fix)|"
    r"In terms of|You can |One way|The answer|There are (?:several|many|a few)|Below is|This (?:code|function|program|"
    r"query|script|solution)|\*\*(?:Created )?(?:Answer|Solution|Question|Response)|#+ (?:Answer|Solution)|"
    r"(?:Answer|Solution|Response|Output|Explanation)\s*:|Assistant\b)")
# after a question, a paragraph opening like these is the answer ("...?\n\nThe book has ...")
_AFTER_QUESTION = re.compile(r"^(?:The|There|It|This|These|Yes|No|You|To)\b")
_HERE_IS_CODE = re.compile(r"^Here(?: is|'s) (?:a|an|the) (?:[\w+#-]+ ){0,3}(?:program|script|function|query|code|"
                           r"implementation|solution|class|method|version|approach)\b")
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|my|me|we|our)\b")


def cut_answer_leak(text: str) -> tuple[str, bool]:
    """The user turn without an answer the model went on to write after it (paragraphs from
    the first that reads like the assistant: "Yes, you can ...", "Here is a SQL query that
    ...", "**Answer**"), and whether anything was cut. "Here is my code:" is the user's,
    and so is "Here's an example of the input:": "Here is/Here's" starts an answer only when
    it presents a program, function, query ... and has no first-person word. After a
    paragraph ending in "?", one opening with "The", "It", "Yes", "You" ... is an answer."""
    paras = re.split(r"\n\s*\n", text)
    for i in range(1, len(paras)):
        p = paras[i].lstrip()
        if (_ANSWER_PARAGRAPH.match(p) or (_HERE_IS_CODE.match(p) and not _FIRST_PERSON.search(p.split("\n", 1)[0]))
                or (paras[i - 1].rstrip().endswith("?") and _AFTER_QUESTION.match(p))):
            return "\n\n".join(paras[:i]).rstrip(), True
    return text, False


class MagpieError(ValueError):
    """A chat template that cannot open a user turn for sampling."""


def magpie_prefix(chat_template: str, system: str | None = None, bos_token: str = "", eos_token: str = "") -> str:
    """The rendered conversation up to where the user's text begins.

    Rendered with a sentinel as the user's message and cut there: whatever the template
    puts before a user message (BOS, a default or given system prompt, role markers) is
    the prefix. Refused when the template does not render the content verbatim or drops
    the given system prompt, since sampling from a wrong prefix yields no user turns."""
    if not chat_template:
        raise MagpieError("the model has no chat template: Magpie needs one to open a user turn")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": SENTINEL}]
    try:
        text = render_chat(chat_template, messages, add_generation_prompt=False, bos_token=bos_token,
                           eos_token=eos_token)
    except Exception as err:  # noqa: BLE001 - jinja raises many kinds; all mean the same here
        raise MagpieError(f"the chat template cannot render a user turn: {err}") from err
    if text.count(SENTINEL) != 1:
        raise MagpieError("the chat template does not render the user's message verbatim, so the opening of a "
                          "user turn cannot be located")
    prefix = text[:text.index(SENTINEL)]
    if system and system not in prefix:
        raise MagpieError("the chat template drops the system prompt given to it")
    if not prefix.strip():
        raise MagpieError("the chat template puts nothing before a user message: there is no turn opening to "
                          "sample from")
    return prefix


@dataclass(frozen=True)
class Job:
    """One user turn to sample: the prompt's key, the full prompt ids (prefix + opener), its seed."""

    key: str
    prompt_ids: tuple[int, ...]
    seed: int
    stop: tuple[str, ...] | None = None  # None: the sampler's (the answer leaks of a user turn)


@dataclass(frozen=True)
class Sample:
    key: str
    text: str  # the sampled continuation (cut at an answer leak, if any)
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (end of turn or an answer leak) or "length"
    leak: bool = False  # generation stopped at an answer leak (ANSWER_LEAKS), the text before it kept


class MagpieSampler:
    """Samples user turns with an Engine, ``batch`` sequences at a time, refilled continuously."""

    def __init__(self, engine: Engine, batch: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 0.95, stop: list[str] | None = None):
        if not 1 <= batch <= engine.max_num_sequence:
            raise ValueError(f"Magpie batch {batch} must be in 1..{engine.max_num_sequence} (the engine's "
                             "max_num_sequence)")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be positive")
        SamplingParams(temperature, top_p)  # validates both
        if temperature == 0:
            raise ValueError("Magpie needs sampling (temperature > 0): greedy decoding gives one user turn per prefix")
        self.engine, self.batch, self.max_new_tokens = engine, batch, max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.stop = ANSWER_LEAKS if stop is None else stop
        self.generated_tokens = 0

    def encode(self, text: str) -> list[int]:
        return self.engine.encode_prompt(text, raw=True)

    def run(self, jobs: Iterator[Job], on_sample: Callable[[Sample], None]) -> None:
        """Sample every job, calling ``on_sample`` as each finishes (completion order).
        ``jobs`` is pulled lazily, so the caller can decide the next job from what came back."""
        eng = self.engine
        active = []
        exhausted = False
        try:
            while True:
                while not exhausted and len(active) < self.batch:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    seq = eng.new_sequence(list(job.prompt_ids), self.max_new_tokens,
                                           SamplingParams(self.temperature, self.top_p, seed=job.seed),
                                           self.stop if job.stop is None else list(job.stop))
                    eng.attach(seq)
                    active.append((job, seq))
                    while seq.prefilling:
                        eng.prefill([seq], eng.model.prefill_chunk_size)
                running = [s for _, s in active if not s.done]
                if running:
                    eng.step(running)
                still = []
                for job, seq in active:
                    if seq.done:
                        eng.detach(seq)
                        res = seq.result
                        self.generated_tokens += len(res.token_ids)
                        leak = len(seq.decoder.text) > len(res.text)  # a stop string cut the text
                        on_sample(Sample(job.key, res.text, tuple(res.token_ids), res.finish_reason, leak))
                    else:
                        still.append((job, seq))
                active = still
                if exhausted and not active:
                    return
        finally:
            for _, seq in active:
                eng.detach(seq)
