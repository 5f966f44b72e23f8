"""``speccompile train-prompts``: the prompt set a draft head is trained on (the first stage of
training an EAGLE-3 or Medusa head; answer generation with feature capture and training
read what it writes).

Two sources of user turns, mixed slot by slot (``--magpie-share``):
- **written**: prompt families that look like real use of a coder model -- code writing,
  debugging, explaining, refactoring, tests, shell, SQL, data munging
  (speccompile/training/prompts_code.py) -- and general chat: writing, questions, math,
  summarization, translation, role-play (speccompile/training/prompts.py);
- **Magpie**: the target samples the user turn itself after the chat template's opening
  of a user turn (speccompile/training/magpie.py), under the default system prompt or a
  coding-assistant one, free or after an opener ("How do I", "```python");
- **grounded**: the target writes a document (a news article, retrieved passages, a
  paragraph, a memo), which the slot wraps into a request about it: summarize, answer from
  the passages, translate, extract (speccompile/training/prompts_grounded.py).

Two mixes of these. The *coder* mix (plan 1: a little over half code, as a coder model's
traffic is) made the first 10,000 training prompts; the *wide* mix (plan 2) is mostly not
code: half grounded requests, then math, short questions, translation and general chat,
and a little code. A set keeps the slots it decided: ``settings.json``'s ``wide_from`` names
the first slot of each split planned with the wide mix (a plan-1 set is upgraded to plan 2
with ``wide_from`` just past its decided slots; a new set is wide from slot 0).

Every candidate goes through the filters of speccompile/training/prompt_filters.py: length bounds
in tokens, degenerate samples, n-gram overlap with the benchmark prompts (never trained
on), exact and near duplicates across both splits. A **held-out** set (``--held-out``) of
other styles -- other templates, other snippets and tasks, other Magpie openers and system
prompt -- is built beside it, for choosing checkpoints; no held-out prompt duplicates a
training one.

Resumable at any interruption. Layout (``--work-dir``, default
``$SPECCOMPILE_CACHE/train/<model dir name>-eagle3``), under ``prompts/``:
- ``settings.json``: what decides each slot (seed, shares, sampling); a resumed run must
  match it, only the targets (``--num-prompts``, ``--held-out``) and ``--batch`` may change;
- ``train.jsonl``, ``held_out.jsonl``: accepted prompts, one JSON object a line, append-only;
- ``rejected.jsonl``: what the filters dropped and why;
- ``summary.json``: counts, code share, rejection reasons, throughput (rewritten as it runs).

Slot k of a split ("t" for train, "h" for held-out) is a pure function of (seed, split, k):
its source, family, opener, system prompt and sampling seed. A slot's id (``t000123``) is
written to exactly one of the three JSONL files, so a rerun skips every slot already
decided and regenerates an interrupted Magpie slot identically (the engine's output
depends only on the prefix and the seed). The next stage should read the accepted prompts
with ``read_prompts`` and key its own progress by ``id``; it should render each ``prompt``
with the model's default chat template (the Magpie system prompt was only a means).
"""
from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from speccompile.training.magpie import Job, Sample, cut_answer_leak, magpie_prefix
from speccompile.training.prompt_filters import (BenchmarkGuard, NearDupIndex, benchmark_texts, clean_user_turn, degenerate,
                             looks_like_code)
from speccompile.training.prompts import GENERAL_FAMILIES, HELD_OUT_GENERAL_FAMILIES, general_prompt
from speccompile.training.prompts_code import CODE_FAMILIES, FOCUS_FAMILIES, HELD_OUT_CODE_FAMILIES
from speccompile.training.prompts_grounded import (DOC, GROUNDED_FAMILIES, clean_document, complete_paragraphs,
                                                   document_problem, grounded_slot)
from speccompile.runtime.tokenizer import render_messages
from speccompile.training.settings import PLAN_VERSION, PromptSetSettings as Settings  # noqa: F401 (re-exported)

REPO = Path(__file__).resolve().parents[2]
# the benchmark sets (and the unseen evaluation prompts of bench/unseen_*.jsonl): never trained on
BENCHMARKS = [REPO / "bench" / "mt_bench.jsonl", REPO / "bench" / "prompts.jsonl",
              *sorted((REPO / "bench").glob("unseen_*.jsonl"))]
SPLITS = {"t": "train", "h": "held_out"}

CODER_SYSTEM = ("You are a coding assistant. Your users are programmers who ask for help with code: writing functions, "
                "fixing bugs, explaining errors and code, writing tests, shell commands and SQL.")
HELD_OUT_SYSTEM = "You are a helpful assistant."
CODE_OPENERS = ["Write a Python", "Write a function", "How do I", "How can I", "I'm getting an error", "Can you help "
                "me debug", "Explain this code", "In JavaScript,", "Write a SQL query", "Refactor", "What does this",
                "I have a pandas DataFrame", "Implement", "Fix", "Here is my code", "Write a bash script", "Create a",
                "Why does my", "Convert", "Optimize", "Write unit tests", "What is the difference between", "```python\n",
                "Given a list", "I'm building", "My React", "In Java,", "Using Go,", "In C++,", "Is there a way to"]
GENERAL_OPENERS = ["How", "What", "Why", "Can you", "Could you", "Write", "Explain", "I'm", "I have", "I need",
                   "Help me", "Tell me", "Give me", "Describe", "Summarize", "Translate", "Compare", "Suggest", "Is it",
                   "What are", "Please", "My", "Create", "List", "If", "When", "Which", "Should I", "Imagine"]
HELD_OUT_OPENERS = ["Hey,", "Hi! I'm", "Quick question:", "So I", "Hello, I", "ok so", "Hi there, could", "Help!",
                    "Good morning.", "Dear assistant,"]
WRITTEN_WEIGHTS = {  # training families: a little over half about code, as a coder model's traffic is
    "code_write": 10, "code_app": 4, "code_debug": 7, "code_error": 5, "code_explain": 6, "code_refactor": 5,
    "code_tests": 4, "shell": 5, "sql": 4, "data": 5, "topics": 8, "writing": 6, "roleplay": 4, "extraction": 4,
    "math": 6, "reasoning": 3, "translation": 4, "summarization": 4, "qa": 3, "advice": 3}
HELD_OUT_WEIGHTS = {"code_review": 3, "code_terse": 3, "code_traceback": 2, "shell_explain": 2, "constrained": 3,
                    "socratic": 2, "terse_chat": 2, "versus": 2}
WIDE_WRITTEN_WEIGHTS = {  # the wide mix's written families: mostly not code
    "math": 6, "qa": 4, "translation": 3, "summarization": 2, "extraction": 2, "topics": 4, "writing": 3, "reasoning": 2,
    "advice": 2, "roleplay": 1, "code_write": 3, "code_explain": 2, "code_debug": 2, "sql": 1, "shell": 1}
GROUNDED_WEIGHTS = {"doc_summary": 3, "doc_rag": 3, "doc_translate": 2, "doc_extract": 2}
QUESTION_OPENERS = ["Why does", "Why do", "What causes", "How does", "How do", "What is the difference between",
                    "Who invented", "When did", "Where does", "What happens when", "Is it true that", "How long does",
                    "Why is", "How many", "What makes"]
assert set(WRITTEN_WEIGHTS) == set(CODE_FAMILIES) | set(GENERAL_FAMILIES)
assert set(HELD_OUT_WEIGHTS) == set(HELD_OUT_CODE_FAMILIES) | set(HELD_OUT_GENERAL_FAMILIES)
assert set(WIDE_WRITTEN_WEIGHTS) <= set(WRITTEN_WEIGHTS) and set(GROUNDED_WEIGHTS) == set(GROUNDED_FAMILIES)


@dataclass(frozen=True)
class Slot:
    """What slot k of a split is: written (``text`` given) or Magpie (``system``/``opener``/``seed``)."""

    key: str
    split: str
    source: str
    family: str
    text: str | None = None
    system: str | None = None
    opener: str = ""
    seed: int = 0
    request: str | None = None  # grounded: what the target is asked to write (the document)
    wrap: str | None = None  # grounded: the user turn, with {doc} where the document goes


def plan_slot(settings: Settings, split: str, k: int, wide_from: dict[str, int] | None = None,
              focus: list[dict] | None = None) -> Slot:
    """Slot k of split "t" or "h": a pure function of (seed, split, k), the set's ``wide_from``
    (the first slot of each split planned with the wide mix; None: wide from slot 0) and its
    ``focus`` stretches (slots given to one focused family by ``--focus``), so a rerun makes the
    same."""
    rng = random.Random(f"{settings.seed}:{split}:{k}")
    key = f"{split}{k:06d}"
    held = split == "h"
    for f in focus or ():
        if f["split"] == split and f["from"] <= k < f["to"]:
            return _written_slot(rng, key, split, {f["family"]: 1})
    if k >= (wide_from or {}).get(split, 0):
        return _wide_slot(rng, key, split, settings.magpie_share)
    if rng.random() >= settings.magpie_share:
        return _written_slot(rng, key, split, HELD_OUT_WEIGHTS if held else WRITTEN_WEIGHTS)
    seed = rng.getrandbits(63)
    if held:
        return _held_out_magpie(rng, key, split, seed)
    r = rng.random()
    if r < 0.25:  # a coding-assistant system prompt: the model writes a programmer's request
        return Slot(key, split, "magpie", "magpie_coder_system", system=CODER_SYSTEM,
                    opener=rng.choice([""] + CODE_OPENERS), seed=seed)
    if r < 0.33:  # pure Magpie: the model's own idea of its users (many come out as quizzes or self-talk)
        return Slot(key, split, "magpie", "magpie_free", seed=seed)
    if r < 0.66:
        return Slot(key, split, "magpie", "magpie_code_opener", opener=rng.choice(CODE_OPENERS), seed=seed)
    return Slot(key, split, "magpie", "magpie_general_opener", opener=rng.choice(GENERAL_OPENERS), seed=seed)


def _wide_slot(rng: random.Random, key: str, split: str, magpie_share: float) -> Slot:
    """A slot of the wide mix: half grounded requests about a document the target writes; of the
    other half, ``0.8 * magpie_share`` Magpie questions and general requests (a fifth of all slots
    at the default 0.5), the rest written families (mostly not code)."""
    held = split == "h"
    r = rng.random()
    if r < 0.5:
        family = rng.choices(list(GROUNDED_WEIGHTS), list(GROUNDED_WEIGHTS.values()))[0]
        request, wrap = grounded_slot(family, rng, held)
        return Slot(key, split, "grounded", family, request=request, wrap=wrap, seed=rng.getrandbits(63))
    if r < 1.0 - 0.4 * magpie_share:
        return _written_slot(rng, key, split, HELD_OUT_WEIGHTS if held else WIDE_WRITTEN_WEIGHTS)
    seed = rng.getrandbits(63)
    if held:
        return _held_out_magpie(rng, key, split, seed)
    if r < 1.0 - 0.1 * magpie_share:  # short factual questions in the model's own words (3/4 of the Magpie slots)
        return Slot(key, split, "magpie", "magpie_question", opener=rng.choice(QUESTION_OPENERS), seed=seed)
    return Slot(key, split, "magpie", "magpie_general_opener", opener=rng.choice(GENERAL_OPENERS), seed=seed)


def _written_slot(rng: random.Random, key: str, split: str, weights: dict[str, int]) -> Slot:
    """A written prompt of a family drawn by ``weights`` (both mixes, both splits)."""
    family = rng.choices(list(weights), list(weights.values()))[0]
    if family in CODE_FAMILIES or family in HELD_OUT_CODE_FAMILIES or family in FOCUS_FAMILIES:
        text = {**CODE_FAMILIES, **HELD_OUT_CODE_FAMILIES, **FOCUS_FAMILIES}[family](rng, split == "h")
    else:
        text = general_prompt(family, rng, split == "h")
    return Slot(key, split, "written", family, text=text)


def _held_out_magpie(rng: random.Random, key: str, split: str, seed: int) -> Slot:
    return Slot(key, split, "magpie", "magpie_held_out", system=rng.choice([None, HELD_OUT_SYSTEM]),
                opener=rng.choice(HELD_OUT_OPENERS), seed=seed)


# ------------------------------------------------------------------ files
def _read_jsonl(path: Path) -> list[dict]:
    """Rows of an append-only JSONL file; a torn last line (an interrupted write) is cut off."""
    if not path.exists():
        return []
    rows, good = [], 0
    data = path.read_bytes()
    for line in data.splitlines(keepends=True):
        try:
            rows.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            break
        if not line.endswith(b"\n"):
            rows.pop()  # complete JSON but no newline: rewrite it with one below
            break
        good += len(line)
    if good != len(data):
        with path.open("r+b") as f:
            f.truncate(good)
    return rows


def read_prompts(prompts_dir: Path, split: str = "train") -> list[dict]:
    """The accepted prompts of a split ("train" or "held_out"), in the order they were accepted.
    Each has ``id`` (stable across resumes: key the next stage's progress by it), ``prompt``
    (the user turn), ``source`` ("written" or "magpie"), ``family``, ``code`` (looks like a
    programming request) and ``tokens`` (the user turn's length)."""
    if split not in SPLITS.values():
        raise ValueError(f"split {split!r}: choose train or held_out")
    path = Path(prompts_dir) / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `speccompile train-prompts` first")
    return _read_jsonl(path)


def default_work_dir(model_dir: Path) -> Path:
    from speccompile.compiler.fetch import cache_root

    return cache_root() / "train" / f"{Path(model_dir).name}-eagle3"


# ------------------------------------------------------------------ the stage
class PromptSet:
    """The prompt files of one work dir, the filters' state rebuilt from them, and the slot loop."""

    def __init__(self, out_dir: Path, settings: Settings, count_tokens: Callable[[str], int],
                 benchmarks: list[Path] | None = None, max_non_latin: float = 0.1):
        self.dir, self.settings, self.count_tokens = Path(out_dir), settings, count_tokens
        self.max_non_latin = max_non_latin
        self.guard = BenchmarkGuard(benchmark_texts(BENCHMARKS if benchmarks is None else benchmarks))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows = {s: _read_jsonl(self.dir / f"{s}.jsonl") for s in SPLITS.values()}
        self.rejected = _read_jsonl(self.dir / "rejected.jsonl")
        self.done = {r["id"] for rows in self.rows.values() for r in rows} | {r["id"] for r in self.rejected}
        saved = self.dir / "settings.json"
        old = json.loads(saved.read_text()) if saved.exists() else None
        if old is not None and old.get("plan_version") == 1 and settings.plan_version == 2:
            # plan 1 made every slot with the coder mix: its decided slots stay as they are, the wide mix
            # starts just past them (an interrupted Magpie slot is regenerated as plan 1 made it)
            old = {**old, "plan_version": 2, "wide_from": {s: 1 + max((int(i[1:]) for i in self.done if i[0] == s),
                                                                        default=-1) for s in SPLITS}}
            saved.write_text(json.dumps(old, indent=1))
        if old is not None:
            given = {**asdict(settings), "wide_from": old.get("wide_from")} | ({"focus": old["focus"]} if "focus" in old
                                                                                else {})
            if old != given:
                diff = {k: (old.get(k), v) for k, v in given.items() if old.get(k) != v}
                raise ValueError(f"{self.dir} was started with other settings {diff} (saved, given): resume with the "
                                 "saved values, or choose another --work-dir")
        else:
            old = {**asdict(settings), "wide_from": {s: 0 for s in SPLITS}}
            saved.write_text(json.dumps(old, indent=1))
        self.wide_from: dict[str, int] = old["wide_from"]
        self.saved, self.focus = old, list(old.get("focus", []))
        self.index = {split: NearDupIndex() for split in SPLITS}
        for split, name in SPLITS.items():
            for r in self.rows[name]:
                self.index[split].add(r["id"], r["prompt"])
        self.reasons = Counter(r["reason"].split(":")[0] for r in self.rejected)
        self.inflight = {s: 0 for s in SPLITS}
        self.next_k = {s: 0 for s in SPLITS}
        self.files = {name: (self.dir / f"{name}.jsonl").open("a") for name in ("train", "held_out", "rejected")}
        self.since_accept = 0
        self.t0, self.samples, self.session_accepted = time.time(), 0, 0

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def accepted(self, split: str) -> int:
        return len(self.rows[SPLITS[split]])

    # ---- filters
    def duplicate(self, slot: Slot, text: str) -> str | None:
        """Magpie samples are checked for every kind of duplicate against both splits. Written
        prompts only for exact copies in their own split -- their families vary one slot at a
        time on purpose ("... in Python" / "... in Go" are two requests with two answers,
        which shingles would call near duplicates) -- but for any kind in the other split, so
        that no held-out prompt is a rewording of a training one."""
        for split, index in self.index.items():
            hit = index.find(text)
            if hit and (slot.source == "magpie" or split != slot.split or hit[0] == "exact"):
                return f"duplicate_{hit[0]}"
        return None

    def judge(self, slot: Slot, text: str, finish_reason: str = "stop") -> tuple[str | None, str]:
        """(why it is rejected or None, the cleaned user turn)."""
        if finish_reason == "length":
            return "truncated", text
        text = clean_user_turn(text)
        n = self.count_tokens(text)
        if n < self.settings.min_tokens or len(text) < 12:
            return "too_short", text
        if n > self.settings.max_tokens:
            return "too_long", text
        why = degenerate(text, self.max_non_latin)
        if why:
            return why, text
        hit = self.guard.overlap(text)
        if hit:
            return f"benchmark:{hit}", text
        return self.duplicate(slot, text), text

    def offer(self, slot: Slot, text: str, finish_reason: str = "stop", leak: bool = False,
              problem: str | None = None) -> bool:
        """File one candidate under its slot id: accepted into its split, or rejected with a reason
        (``problem``: one the caller found, such as a grounded slot's unusable document)."""
        why, text = self.judge(slot, text, finish_reason)
        why = problem or why
        base = {"id": slot.key, "source": slot.source, "family": slot.family}
        if why:
            row = {**base, "reason": why, "prompt": text[:400]}
            self.files["rejected"].write(json.dumps(row, ensure_ascii=False) + "\n")
            self.files["rejected"].flush()
            self.rejected.append(row)
            self.reasons[why.split(":")[0]] += 1
            self.since_accept += 1
        else:
            split = SPLITS[slot.split]
            row = {**base, "split": split, "prompt": text, "code": looks_like_code(text),
                   "tokens": self.count_tokens(text)}
            if slot.source == "magpie":
                row.update(system=slot.system, opener=slot.opener, seed=slot.seed, answer_leak_cut=leak)
            elif slot.source == "grounded":
                row.update(request=slot.request, seed=slot.seed)
            self.files[split].write(json.dumps(row, ensure_ascii=False) + "\n")
            self.files[split].flush()
            self.rows[split].append(row)
            self.index[slot.split].add(slot.key, text)
            self.since_accept = 0
            self.session_accepted += 1
        self.done.add(slot.key)
        return why is None

    # ---- slots
    def pick_split(self, targets: dict[str, int]) -> str | None:
        """The split furthest behind its target (counting samples in flight), or None when both are covered."""
        best, frac = None, None
        for s, target in targets.items():
            have = self.accepted(s) + self.inflight[s]
            if have < target and (frac is None or have / target < frac):
                best, frac = s, have / target
        return best

    def next_slot(self, split: str, focus: tuple[str, int] | None = None) -> Slot:
        """The split's first slot not decided yet; with ``focus`` (family, prompts wanted), the first of
        that family's stretches, which grow by as many slots as were rejected (exact duplicates)."""
        if focus is not None:
            if not self._pending(focus[0], split):
                self.add_focus(*focus)
            return plan_slot(self.settings, split, self._pending(focus[0], split)[0], self.wide_from, self.focus)
        k = self.next_k[split]
        while f"{split}{k:06d}" in self.done:
            k += 1
        self.next_k[split] = k + 1
        return plan_slot(self.settings, split, k, self.wide_from, self.focus)

    def add_focus(self, family: str, num_prompts: int) -> dict[str, int]:
        """Make the set hold ``num_prompts`` training prompts of focused ``family`` (and a
        twenty-fifth as many held-out ones, at least one): the slots still missing become a
        stretch of that family just past every slot decided or planned so far (saved in
        settings.json, so the plan stays a pure function of the file). Returns the targets
        that stop the run when both splits hold their share; asked again, it adds nothing."""
        if family not in FOCUS_FAMILIES:
            raise ValueError(f"--focus {family!r}: choose one of {', '.join(FOCUS_FAMILIES)}")
        targets = {}
        for split, want in (("t", num_prompts), ("h", max(1, -(-num_prompts // 25)))):
            have = sum(r["family"] == family for r in self.rows[SPLITS[split]])
            missing = want - have - len(self._pending(family, split))  # a rejected slot is made up by a new one
            if missing > 0:
                start = 1 + max([int(i[1:]) for i in self.done if i[0] == split and i[1:].isdigit()] +
                                [f["to"] - 1 for f in self.focus if f["split"] == split] + [self.wide_from[split] - 1])
                self.focus.append({"family": family, "split": split, "from": start, "to": start + missing})
            targets[split] = self.accepted(split) + max(0, want - have)
        if self.focus != self.saved.get("focus", []):
            self.saved = {**self.saved, "focus": self.focus}
            (self.dir / "settings.json").write_text(json.dumps(self.saved, indent=1))
        return targets

    def _pending(self, family: str, split: str) -> list[int]:
        """The slots of ``family``'s stretches in ``split`` not decided yet, in order."""
        return [k for f in self.focus if f["family"] == family and f["split"] == split
                for k in range(f["from"], f["to"]) if f"{split}{k:06d}" not in self.done]

    def summary(self, generated_tokens: int = 0) -> dict:
        out = {"settings": asdict(self.settings), "rejected": len(self.rejected), "reasons": dict(self.reasons)}
        for split in SPLITS.values():
            rows = self.rows[split]
            by_source = Counter(r["source"] for r in rows)
            out[split] = {
                "prompts": len(rows), "by_source": dict(by_source), "by_family": dict(Counter(r["family"] for r in rows)),
                "code_share": round(sum(r["code"] for r in rows) / max(1, len(rows)), 3),
                "code_share_by_source": {s: round(sum(r["code"] for r in rows if r["source"] == s) / n, 3)
                                         for s, n in by_source.items()},
                "code_share_by_family": {f: round(sum(r["code"] for r in rows if r["family"] == f) / n, 3)
                                         for f, n in Counter(r["family"] for r in rows).items()},
                "mean_tokens": round(sum(r["tokens"] for r in rows) / max(1, len(rows)), 1)}
        minutes = (time.time() - self.t0) / 60
        out["this_run"] = {"minutes": round(minutes, 2), "accepted": self.session_accepted,
                           "magpie_samples": self.samples, "generated_tokens": generated_tokens,
                           "accepted_per_min": round(self.session_accepted / max(minutes, 1e-9), 2),
                           "magpie_samples_per_min": round(self.samples / max(minutes, 1e-9), 2),
                           "generated_tokens_per_s": round(generated_tokens / max(minutes * 60, 1e-9), 1)}
        return out

    def write_summary(self, generated_tokens: int = 0) -> dict:
        s = self.summary(generated_tokens)
        tmp = self.dir / "summary.json.tmp"
        tmp.write_text(json.dumps(s, indent=1))
        tmp.replace(self.dir / "summary.json")
        return s


def build_prompt_set(out_dir: Path, num_prompts: int, num_held_out: int, settings: Settings, sampler=None,
                     chat: dict | None = None, count_tokens: Callable[[str], int] | None = None,
                     benchmarks: list[Path] | None = None, progress: bool = True, max_idle_slots: int = 2000,
                     summary_every: float = 60.0, on_summary: Callable[[], object] | None = None,
                     focus: str | None = None) -> dict:
    """Fill ``out_dir`` until it holds ``num_prompts`` training and ``num_held_out`` held-out prompts.

    ``sampler`` (a speccompile.training.magpie.MagpieSampler, or anything with its ``encode``, ``run``
    and ``generated_tokens``) samples the Magpie user turns and the grounded slots' documents; ``chat``
    is the model config that holds ``chat_template``, ``bos_token`` and ``eos_token``. Stops with an error when ``max_idle_slots`` slots in a
    row are rejected: the filters or the model are not producing usable prompts. ``on_summary``
    is called after each summary (every ``summary_every`` seconds and at the end), with the
    files flushed: the data dir's copy (speccompile/training/store.py). With ``focus`` (a family of
    FOCUS_FAMILIES) the run makes only that family's prompts, until the set holds ``num_prompts``
    of them (``PromptSet.add_focus``); ``num_held_out`` is then not read."""
    from tqdm import tqdm

    if num_prompts < 1 or num_held_out < 0:
        raise ValueError(f"--num-prompts {num_prompts} must be >= 1 and --held-out {num_held_out} >= 0")
    if sampler is None or chat is None:
        raise ValueError("Magpie and grounded slots need a sampler and the model's chat template")
    if count_tokens is None:
        if sampler is None:
            raise ValueError("give count_tokens, or a sampler whose tokenizer counts them")
        count_tokens = lambda t: len(sampler.encode(t))  # noqa: E731
    ps = PromptSet(out_dir, settings, count_tokens, benchmarks)
    prefixes: dict[str | None, str] = {}

    def prefix_ids(slot: Slot) -> tuple[int, ...]:
        if slot.source == "grounded":  # the target answers the document request
            return tuple(sampler.encode(render_messages(chat, [{"role": "user", "content": slot.request}])))
        if slot.system not in prefixes:
            prefixes[slot.system] = magpie_prefix(chat["chat_template"], slot.system, chat.get("bos_token") or "",
                                                  chat.get("eos_token") or "")
        return tuple(sampler.encode(prefixes[slot.system] + slot.opener))

    if settings.magpie_share:  # a template that cannot open a user turn fails here, before any sampling
        for system in (None, CODER_SYSTEM, HELD_OUT_SYSTEM):
            prefix_ids(Slot("check", "t", "magpie", "check", system=system))
    prefix_ids(Slot("check", "t", "grounded", "check", request="Write a short news article."))
    targets = {"t": num_prompts, "h": num_held_out} if focus is None else ps.add_focus(focus, num_prompts)
    bar = tqdm(total=sum(targets.values()), initial=sum(min(ps.accepted(s), n) for s, n in targets.items()),
               desc="prompts", unit="prompt", disable=not progress, smoothing=0.05,
               mininterval=2.0 if sys.stderr.isatty() else 60.0)  # a log file gets a line a minute
    inflight: dict[str, Slot] = {}
    last_summary = [time.time()]
    tokens = lambda: sampler.generated_tokens if sampler is not None else 0  # noqa: E731

    def after(accepted: bool) -> None:
        if accepted:
            bar.update(1)
        if ps.since_accept >= max_idle_slots:
            raise RuntimeError(f"{max_idle_slots} slots in a row were rejected ({dict(ps.reasons.most_common(5))}); "
                               f"see {ps.dir / 'rejected.jsonl'}")
        now = time.time()
        if now - last_summary[0] >= summary_every:
            last_summary[0] = now
            s = ps.write_summary(tokens())["this_run"]
            if on_summary is not None:
                ps.flush()
                on_summary()
            bar.set_postfix(per_min=s["accepted_per_min"], tok_s=s["generated_tokens_per_s"], rejected=len(ps.rejected))

    def jobs():
        while True:
            split = ps.pick_split(targets)
            if split is None:
                return
            slot = ps.next_slot(split, None if focus is None else (focus, num_prompts))
            if slot.source == "written":
                after(ps.offer(slot, slot.text))
                continue
            ps.inflight[split] += 1
            inflight[slot.key] = slot
            # a document ends at the end of its turn: the stops that cut an answer out of a user turn don't apply
            yield Job(slot.key, prefix_ids(slot), slot.seed, () if slot.source == "grounded" else None)

    def on_sample(sample: Sample) -> None:
        slot = inflight.pop(sample.key)
        ps.inflight[slot.split] -= 1
        ps.samples += 1
        if slot.source == "grounded":
            doc, finish = sample.text, sample.finish_reason
            if finish == "length":  # the whole paragraphs before the cap are still a document
                doc, finish = complete_paragraphs(doc), "stop"
            doc = clean_document(doc)
            why = "truncated" if not doc else document_problem(doc)
            after(ps.offer(slot, slot.wrap.replace(DOC, doc), finish, problem=why))
            return
        text, cut = cut_answer_leak(slot.opener + sample.text)
        finish = "stop" if cut else sample.finish_reason  # a cut turn ended before the length cap did
        after(ps.offer(slot, text, finish, sample.leak or cut))

    try:
        while ps.pick_split(targets) is not None:
            sampler.run(jobs(), on_sample)
    finally:
        bar.close()
        report = ps.write_summary(tokens())
        ps.close()
        if on_summary is not None:
            on_summary()
    return report


def run_train_prompts(model_dir: Path, model_lib: Path, work_dir: Path | None, num_prompts: int, num_held_out: int,
                      settings: Settings, batch: int = 8, benchmarks: list[Path] | None = None,
                      progress: bool = True, data_dir: Path | None = None, focus: str | None = None) -> dict:
    """The CLI's stage: checks everything cheap, loads the engine, fills ``<work_dir>/prompts``;
    with ``data_dir``, starts from the prompts kept there and keeps them there as they grow
    (speccompile/training/store.py)."""
    from speccompile.training.magpie import MagpieSampler
    from speccompile.runtime.contract import MODEL_CONFIG_FILE, read_model_config
    from speccompile.runtime.engine import Engine

    model_dir, model_lib = Path(model_dir), Path(model_lib)
    if not (model_dir / MODEL_CONFIG_FILE).exists():
        raise FileNotFoundError(f"{model_dir} is not a converted model (no {MODEL_CONFIG_FILE})")
    if not model_lib.exists():
        raise FileNotFoundError(f"model library {model_lib} not found")
    if not 1 <= batch <= 64:
        raise ValueError(f"--batch {batch} must be in 1..64")
    if focus is not None and focus not in FOCUS_FAMILIES:
        raise ValueError(f"--focus {focus!r}: choose one of {', '.join(FOCUS_FAMILIES)}")
    config = read_model_config(model_dir)
    if not config.get("chat_template"):
        raise ValueError(f"{model_dir} has no chat template: the target writes the grounded prompts' documents and "
                         "the Magpie user turns in its chat format")
    if settings.magpie_share:
        magpie_prefix(config.get("chat_template") or "", CODER_SYSTEM)  # the template, before loading anything
    out = (Path(work_dir) if work_dir else default_work_dir(model_dir)) / "prompts"
    mirror = None
    if data_dir is not None:
        from speccompile.training.store import sync_prompts

        sync_prompts(out, Path(data_dir) / "prompts")
        mirror = lambda: sync_prompts(out, Path(data_dir) / "prompts")  # noqa: E731
    per_seq = 256 + settings.max_new_tokens  # prefix + opener + the sampled turn, with room to spare
    engine = Engine(model_dir, model_lib, max_num_sequence=batch, max_total_seq_length=batch * per_seq)
    sampler = MagpieSampler(engine, batch, settings.max_new_tokens, settings.temperature, settings.top_p)
    count = lambda t: len(engine.tokenizer.encode(t, add_special_tokens=False).ids)  # noqa: E731
    report = build_prompt_set(out, num_prompts, num_held_out, settings, sampler, config, count, benchmarks, progress,
                              on_summary=mirror, focus=focus)
    report["prompts_dir"] = str(out)
    return report
