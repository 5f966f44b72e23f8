"""Deriving a model's declarative chat format (runtime/chat_format.py) from its Jinja template.

Why: the C++ runtime that apps embed has no Jinja engine, so ``gen_config`` records the pieces
the template concatenates, and both runtimes render a conversation by joining them. The
template is a black box here: we render probe conversations whose contents are sentinels with
the runtime's own Jinja rendering (runtime/tokenizer.py ``render_chat``, the oracle), read off
the text between consecutive messages ("junctions"), cut it into pieces, and then check the
pieces against Jinja on a battery of conversations. Anything that differs -- a template that
moves the system prompt, drops empty messages, dates its prompt -- gives (None, reason), never a
format that renders differently. A conversation the template refuses (Mistral's alternation
check) is skipped: the format is meant for the conversations the template accepts.
"""
from __future__ import annotations

import itertools
import os
import re

from speccompile.runtime.chat_format import FORMAT_VERSION, ChatFormatError, render_content, render_with_format
from speccompile.runtime.tokenizer import render_chat

ROLES = ("system", "user", "assistant", "tool")
# A probe text whose raw, trimmed and JSON-quoted forms cannot be mistaken for one another.
MODE_PROBE = "\n \t Mq\"\\\n x \n "
# Special-token-like spans a piece boundary should not cut through ("<|end|>\n<|" + "user|>").
SPECIAL = re.compile(r"<\|[^<>|\s]*\|>|<[^<>\s]{1,40}>|\[/?[A-Z_]+\]")
# Contents for the verification battery: whitespace at the ends, newlines, empty, unicode,
# text that looks like special tokens or JSON.
AWKWARD = ["Hello there.", "  leading and trailing  ", "\nline one\nline two\n", "", "héllo wörld — ünïcode 🎉",
           "<|im_start|>user\nfake turn<|im_end|>", "\t\u3000tabs and ideographic space\u00a0\n", " ",
           '{"quote": "\\" and \\\\ back"}', "[INST] not a turn [/INST]", "x"]


class _Fail(Exception):
    pass


def derive_chat_format(template: str, bos_token: str | None, eos_token: str | None) -> tuple[dict | None, str | None]:
    """(format, None) when the template is a concatenation of fixed pieces around the message
    texts on every conversation checked, else (None, why). Never raises."""
    try:
        return _Deriver(template, bos_token or "", eos_token or "").derive(), None
    except _Fail as err:
        return None, str(err)
    except Exception as err:  # noqa: BLE001 - a template can fail in any way; gen_config must not
        return None, f"the chat template could not be analysed: {type(err).__name__}: {err}"


def _sentinel(i: int) -> str:
    return f"SPCQ{i}Z"  # alphanumeric: trim leaves it alone, and no sentinel contains another


def _kinds(roles: tuple[str, ...]) -> list[str]:
    """Each message's kind: a system message at the start (which replaces the default system
    text) and one later render differently in some templates (Llama 3.1)."""
    return ["system0" if r == "system" and i == 0 else r for i, r in enumerate(roles)]


def _probe(seq: tuple) -> list[dict]:
    return [{"role": r, "content": _sentinel(i)} for i, r in enumerate(seq)]


def _name(kind: str) -> str:
    return "first system" if kind == "system0" else kind


def _describe(msgs: list[dict]) -> str:
    return "[" + ", ".join(f"{m['role']}: {m['content']!r}" for m in msgs) + "]"


class _Deriver:
    def __init__(self, template: str, bos: str, eos: str):
        self.template, self.bos, self.eos = template, bos, eos
        self.tokens = [t for t in (bos, eos) if t]
        self.seen: dict[tuple, str | None] = {}

    def render(self, msgs: list[dict], gen: bool) -> str | None:
        """Jinja's rendering, or None where the template refuses the conversation (memoized:
        render_chat compiles the template on every call)."""
        key = (tuple((m["role"], m["content"]) for m in msgs), gen)
        if key not in self.seen:
            try:
                self.seen[key] = render_chat(self.template, msgs, add_generation_prompt=gen,
                                             bos_token=self.bos, eos_token=self.eos)
            except Exception:  # noqa: BLE001 - raise_exception, or a template tripping over the roles
                self.seen[key] = None
        return self.seen[key]

    def derive(self) -> dict:
        probes = [seq for n in (1, 2, 3) for seq in itertools.product(ROLES, repeat=n)]
        accepted = [seq for seq in probes if self.render(_probe(seq), False) is not None]
        if not any(seq == ("user",) for seq in accepted):
            raise _Fail("the chat template refuses a conversation of one user message")
        modes = self.content_modes(accepted)
        obs: dict[tuple[str, str], tuple[str, tuple]] = {}
        for seq in accepted:
            for gen in (False, True) if len(seq) < 3 else (False,):  # enough to see each kind last
                self.junctions(seq, modes, gen, obs)
        pieces = self.solve({k: v[0] for k, v in obs.items()}, {k: v[1] for k, v in obs.items()}, modes)
        self.verify(pieces, accepted)
        return pieces

    def content_modes(self, accepted: list[tuple]) -> dict[str, str]:
        """Per kind of message, what the template does to its text: emits it as is, trims it,
        or quotes it as JSON. A kind whose text never shows up is one the template drops."""
        modes = {}
        for kind in ("system0", "system", "user", "assistant", "tool"):
            for seq in (s for s in accepted if kind in _kinds(s)):
                at = _kinds(seq).index(kind)
                msgs = [{"role": r, "content": MODE_PROBE if i == at else _sentinel(i)} for i, r in enumerate(seq)]
                out = self.render(msgs, False) or ""
                modes[kind] = next((m for m in ("json", "raw", "trim") if render_content(m, MODE_PROBE) in out), None)
                if modes[kind]:
                    break
            if modes.get(kind) is None:
                modes.pop(kind, None)
        return modes

    def junctions(self, seq: tuple, modes: dict, gen: bool, obs: dict) -> None:
        """Records the text between consecutive messages (and before the first, after the last)
        of one probe conversation, keyed by the kinds on either side; a junction that differs
        from one conversation to another cannot be a fixed piece."""
        kinds = _kinds(seq)
        if any(k not in modes for k in kinds):
            return
        out = self.render(_probe(seq), gen)
        if out is None:
            return
        cuts, pos = [], 0
        for i, k in enumerate(kinds):
            text = render_content(modes[k], _sentinel(i))
            at = out.find(text, pos)
            if at < 0:
                return  # reordered or dropped: the verification battery will say so
            cuts.append((at, at + len(text)))
            pos = at + len(text)
        bounds = [0] + [c for cut in cuts for c in cut] + [len(out)]
        labels = ["START"] + kinds + ["END_ON" if gen else "END_OFF"]
        for i in range(len(labels) - 1):
            key, text = (labels[i], labels[i + 1]), out[bounds[2 * i]:bounds[2 * i + 1]]
            seen = obs.setdefault(key, (text, seq))
            if seen[0] != text:
                raise _Fail(f"the text between {_name(key[0])} and {_name(key[1])} differs between the conversations "
                            f"{list(seen[1])} ({seen[0]!r}) and {list(seq)} ({text!r}): not a fixed piece")

    def end_of(self, kind: str, obs: dict) -> str:
        """What a message of this kind ends with: the common start of everything that follows
        it, not cut inside a special token (Phi-3's "<|end|>\\n" + "<|endoftext|>"/"<|user|>")."""
        follow = [t for (a, _), t in obs.items() if a == kind]
        if not follow:
            raise _Fail(f"no conversation the template accepts shows where a {_name(kind)} message ends")
        n = len(os.path.commonprefix(follow))
        moved = True
        while moved:
            moved = False
            for t in follow:
                spans = [m.span() for m in SPECIAL.finditer(t)]
                spans += [m.span() for tok in self.tokens for m in re.finditer(re.escape(tok), t)]
                for s, e in spans:
                    if s < n < e:
                        n, moved = s, True
        return follow[0][:n]

    def solve(self, obs: dict, where: dict, modes: dict) -> dict:
        """The pieces from the junctions: ``end`` of each kind first (end_of), then each begin
        is a junction less the end before it, the tool group what is left around tool runs,
        and the prefix plus default system what is left before the first message."""
        def conv(key: tuple) -> str:
            return f"{_name(key[0])} -> {_name(key[1])} in {list(where[key])}"

        def after(key: tuple, head: str) -> str:
            if not obs[key].startswith(head):
                raise _Fail(f"{obs[key]!r} ({conv(key)}) does not start with {head!r}, how a {_name(key[0])} message ends")
            return obs[key][len(head):]

        def before(key: tuple, text: str, tail: str) -> str:
            if not text.endswith(tail):
                raise _Fail(f"{obs[key]!r} ({conv(key)}) does not end with {tail!r}, what should follow it")
            return text[:len(text) - len(tail)]

        def agreed(values: dict, what: str) -> str:
            if not values:
                raise _Fail(f"no conversation the template accepts shows {what}")
            if len(set(values.values())) > 1:
                seen = ", ".join(f"{t!r} ({conv(k)})" for k, t in values.items())
                raise _Fail(f"{what} is not one fixed text: {seen}")
            return next(iter(values.values()))

        kinds = set(modes)
        end = {k: self.end_of(k, obs) for k in kinds}
        plain = [a for a in ("system0", "system", "user", "assistant") if a in kinds]  # no tool group around
        begin = {}
        for b in ("system", "user", "assistant"):
            if b in kinds:
                begin[b] = agreed({(a, b): after((a, b), end[a]) for a in plain if (a, b) in obs},
                                  f"the start of a {b} message after a non-tool one")
        gen = agreed({(a, "END_ON"): after((a, "END_ON"), end[a]) for a in plain if (a, "END_ON") in obs},
                     "the generation prompt")
        closing = agreed({(a, "END_OFF"): after((a, "END_OFF"), end[a]) for a in plain if (a, "END_OFF") in obs},
                         "the text after the last message")
        group = {"begin": "", "end": ""}
        if "tool" in kinds:
            into = {(a, "tool"): after((a, "tool"), end[a]) for a in plain if (a, "tool") in obs}
            begin["tool"] = after(("tool", "tool"), end["tool"]) if ("tool", "tool") in obs else \
                agreed(into, "the start of a tool message")
            group["begin"] = agreed({k: before(k, t, begin["tool"]) for k, t in into.items()},
                                    "the start of a run of tool messages")
            follow = {**{b: begin[b] for b in ("system", "user", "assistant") if b in begin},
                      "END_ON": gen, "END_OFF": closing}
            tails = {("tool", b): before(("tool", b), after(("tool", b), end["tool"]), rest)
                     for b, rest in follow.items() if ("tool", b) in obs}
            group["end"] = agreed(tails, "the end of a run of tool messages")
        first = {b: (group["begin"] if b == "tool" else "") + begin[b] for b in ("user", "assistant", "tool")
                 if b in begin and ("START", b) in obs}
        heads = {("START", b): before(("START", b), obs[("START", b)], t) for b, t in first.items()}
        head = agreed(heads, "the text before the first message")
        first_system = obs.get(("START", "system0"))
        candidates = []
        if first_system is not None and "system" in begin and first_system.endswith(begin["system"]):
            candidates.append(first_system[:len(first_system) - len(begin["system"])])
        if self.bos and all(t.startswith(self.bos) for (a, _), t in obs.items() if a == "START"):
            candidates.append(self.bos)
        prefix = next(c for c in candidates + [""] if head.startswith(c) and (first_system is None or
                                                                               first_system.startswith(c)))

        def piece(kind: str, b: str) -> dict:
            p = {"begin": b, "end": end[kind]}
            return p if modes[kind] == "raw" else {**p, "content": modes[kind]}

        roles = {"system": piece("system0", first_system[len(prefix):])} if first_system is not None else {}
        roles.update({r: piece(r, begin[r]) for r in ("user", "assistant", "tool") if r in kinds and r in begin})
        fmt = {"version": FORMAT_VERSION, "prefix": prefix, "default_system": head[len(prefix):], "roles": roles}
        if "system" in kinds and "system" in begin:
            fmt["later_system"] = piece("system", begin["system"])
        if group["begin"] or group["end"]:
            fmt["tool_group"] = group
        fmt["generation_prompt"], fmt["closing"] = gen, closing
        return fmt

    def verify(self, fmt: dict, accepted: list[tuple]) -> None:
        """The format against Jinja on conversations the template accepts: every probe shape and
        chats of 1-4 turns with and without a system message, tool runs of 1-3 between turns and
        a later system message where the format has them, all with awkward contents."""
        sys_first = [(), ("system",)] if "system" in fmt["roles"] else [()]
        renders = set(fmt["roles"]) - {"system"}
        shapes = {s for s in accepted if all(r in renders or (r == "system" and ("later_system" in fmt if i else
                                                                                  "system" in fmt["roles"]))
                                             for i, r in enumerate(s))}
        for head, turns in itertools.product(sys_first, range(1, 5)):
            chat = tuple(itertools.chain.from_iterable(("user", "assistant") for _ in range(turns)))
            shapes |= {head + chat, head + chat[:-1]}
            if "tool" in fmt["roles"]:
                for run in (1, 2, 3):
                    tools = ("tool",) * run
                    shapes |= {head + ("user", "assistant") + tools + ("assistant", "user"),
                               head + ("user",) + tools, head + ("user", "assistant") + tools + ("user",)}
        if "later_system" in fmt:
            shapes |= {("user", "assistant", "system", "user"), ("system", "user", "system", "assistant")}
        checked, used = 0, set()
        for n, shape in enumerate(sorted(shapes, key=lambda s: (len(s), s))):
            for rot in range(2 if len(shape) > 3 else 1):
                msgs = [{"role": r, "content": AWKWARD[(n * 3 + i + rot * 5) % len(AWKWARD)]}
                        for i, r in enumerate(shape)]
                for gen in (False, True) if len(shape) < 3 or shape not in accepted else (False,):
                    want = self.render(msgs, gen)
                    if want is None:
                        continue
                    try:
                        got = render_with_format(fmt, msgs, gen)
                    except ChatFormatError as err:
                        raise _Fail(f"the template renders {_describe(msgs)} but the derived format cannot: {err}")
                    if got != want:
                        i = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                        raise _Fail(f"the derived format renders {_describe(msgs)} (add_generation_prompt={gen}) "
                                    f"differently from the template at character {i}: template "
                                    f"{want[max(0, i - 20):i + 30]!r}, format {got[max(0, i - 20):i + 30]!r}")
                    checked += 1
                    used |= set(_kinds(shape))
        missing = {"system0" if r == "system" else r for r in fmt["roles"]} - used
        if missing:
            raise _Fail(f"no conversation with {', '.join(sorted(missing))} messages could be checked")
