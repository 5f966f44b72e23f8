"""The generation engine: tokenizer + target model + KV cache + a proposer -> text.

One decode loop serves every mode. Each step the proposer drafts for each sequence as long
as the step's plan says the next draft token pays (runtime/adaptive.py: measured costs,
calibrated confidence; none at all is plain decoding, or exactly k with a fixed
``spec_draft_length``), the plan keeps the nodes worth their verify rows, the target verifies
``[last] + drafts`` for the whole batch in one forward, the shared verification routine
accepts a prefix (or tree path) plus a bonus token, and the KV caches are rolled back or
committed. Bad input (over-long prompt, out-of-range ids, a mismatched draft) is refused
before any forward runs.

The loop is exposed as per-step primitives (``new_sequence``, ``attach``, ``prefill``,
``step``, ``detach``) so that ``generate_batch`` and the continuous-batching scheduler
(``runtime/scheduler.py``) drive the very same machinery: the scheduler only decides
*which* sequences take part in each step, never how a step runs.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from .adaptive import AcceptanceModel, Policy
from .costs import CostModel, CostTable, measure_target, profile_path
from .kv_cache import KVCacheFull
from .metrics import SpecMetrics
from .model import Model
from .proposers import NGramProposer, Proposer, SmallDraftProposer, load_head
from .sampling import SamplingParams, sample
from .sequence import GenerationError, GenerationResult, Sequence, Stats
from .tokenizer import StreamDecoder, load_tokenizer, render_chat
from .acceptance import Draft, Verdict

CONFIG_NAME = "speccompile-config.json"
SPECULATIVE_MODES = ("disable", "small_draft", "ngram", "eagle", "medusa")
HEAD_MODES = ("eagle", "medusa")  # drafting heads that read the target's hidden states
MAX_DEPTH = 8  # the longest chain / deepest tree an adaptive step drafts
# Row counts whose forward cost is measured before the first step (others interpolate).
TARGET_ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
DRAFT_ROWS = (1, 2, 3, 4, 6, 8)


def read_model_config(model_dir: Path) -> dict:
    path = Path(model_dir) / CONFIG_NAME
    if not path.exists():
        raise GenerationError(f"{path} not found: run `speccompile gen_config SRC -o {model_dir}`")
    return json.loads(path.read_text())


def check_draft_compatible(target_dir: Path, draft_dir: Path) -> None:
    """Same vocabulary and tokenizer, or a clear error before anything loads."""
    t_cfg, d_cfg = read_model_config(target_dir), read_model_config(draft_dir)
    if t_cfg["vocab_size"] != d_cfg["vocab_size"]:
        raise GenerationError(f"draft vocab size {d_cfg['vocab_size']} differs from the target's {t_cfg['vocab_size']}; "
                              "small_draft needs a draft model with the same vocabulary")
    t_tok = json.loads((Path(target_dir) / "tokenizer.json").read_text())["model"].get("vocab")
    d_path = Path(draft_dir) / "tokenizer.json"
    if not d_path.exists():
        raise GenerationError(f"{d_path} not found: run gen_config for the draft model")
    d_tok = json.loads(d_path.read_text())["model"].get("vocab")
    if t_tok != d_tok:
        raise GenerationError("the draft's tokenizer differs from the target's (different vocabularies); "
                              "small_draft needs the same tokenizer")


class Engine:
    """Greedy/sampled generation, plain or speculative, for one or many sequences."""

    def __init__(self, model_dir: str | Path, model_lib: str | Path, device: str = "auto",
                 speculative_mode: str = "disable", additional_models: list[tuple[str, str]] | None = None,
                 spec_draft_length: int = 0, ngram_min: int = 1, ngram_max: int = 4,
                 max_total_seq_len: int | None = None, max_num_sequence: int = 4,
                 max_batch_tokens: int | None = None, spec_tree_width: int = 1, spec_tree_nodes: int = 64,
                 context_window_size: int | None = None, prefill_chunk_size: int | None = None):
        """``context_window_size``, ``prefill_chunk_size`` (MLC-LLM's run-time overrides) only lower what the
        config and library were built for; a lowered chunk is also the token budget per forward."""
        # ---- validate everything cheap before loading anything
        if speculative_mode not in SPECULATIVE_MODES:
            raise GenerationError(f"unknown --speculative-mode {speculative_mode!r}; choose {', '.join(SPECULATIVE_MODES)}")
        if spec_draft_length < 0:
            raise GenerationError("--spec-draft-length must be >= 0 (0 = adaptive)")
        if speculative_mode == "small_draft":
            if not additional_models:
                raise GenerationError("--speculative-mode small_draft needs the draft: --additional-models DRAFT_DIR,DRAFT_LIB")
            check_draft_compatible(Path(model_dir), Path(additional_models[0][0]))
        if speculative_mode in HEAD_MODES and not additional_models:
            raise GenerationError(f"--speculative-mode {speculative_mode} needs its head: "
                                  "--additional-models HEAD_DIR,HEAD_LIB")
        if (spec_tree_width != 1 or spec_tree_nodes != 64) and speculative_mode not in HEAD_MODES:
            raise GenerationError("--spec-tree-width/--spec-tree-nodes apply to --speculative-mode eagle or medusa")
        if spec_tree_width < 1 or not 1 <= spec_tree_nodes <= 256:
            raise GenerationError("--spec-tree-width must be >= 1 and --spec-tree-nodes in 1..256")
        self.model_dir = Path(model_dir)
        self.config = read_model_config(self.model_dir)
        configured = int(self.config["context_window_size"])
        if context_window_size is not None and not 2 <= context_window_size <= configured:
            raise GenerationError(
                f"context_window_size={context_window_size}: {self.model_dir} was configured and compiled for a "
                f"{configured}-token window, which can only be lowered at run time (2..{configured}); for a larger "
                "one rerun gen_config --context-window-size and compile")
        chunk = int(self.config.get("prefill_chunk_size", 2048))
        if prefill_chunk_size is not None and not 1 <= prefill_chunk_size <= chunk:
            raise GenerationError(f"prefill_chunk_size={prefill_chunk_size}: the library was compiled for prefill "
                                  f"chunks of at most {chunk} tokens (1..{chunk}); for larger ones rerun gen_config "
                                  "--prefill-chunk-size and compile")
        self.tokenizer = load_tokenizer(self.model_dir)
        self.context_window = context_window_size or configured
        self.max_num_sequence = max_num_sequence
        self.max_batch_tokens = max_batch_tokens or prefill_chunk_size or chunk
        k_need = spec_draft_length + 1
        if speculative_mode != "disable" and k_need > self.max_batch_tokens:
            raise GenerationError(f"the token budget per forward ({self.max_batch_tokens}) cannot hold "
                                  f"spec_draft_length + 1 = {k_need} tokens; lower --spec-draft-length")
        # ---- load
        self.model = Model(self.model_dir, Path(model_lib), device)
        if self.model.meta["model_type"] != self.config["model_type"]:
            raise GenerationError("model library and config disagree on the model type")
        if prefill_chunk_size is not None and prefill_chunk_size > self.model.prefill_chunk_size:
            raise GenerationError(f"prefill_chunk_size={prefill_chunk_size} exceeds the {self.model.prefill_chunk_size}"
                                  f"-token chunk {model_lib} was compiled for")
        self.model.prefill_chunk_size = prefill_chunk_size or self.model.prefill_chunk_size  # read by every prefill
        # KV budget shared by all sequences (pages are only touched when used)
        total = max_total_seq_len or min(self.context_window * max_num_sequence, 32768)
        self.kv = self.model.create_kv_cache(total)
        self.stop_token_ids = set(self.config.get("stop_token_ids", []))
        self.speculative_mode = speculative_mode
        self.proposer: Proposer | None = None
        if speculative_mode == "ngram":
            self.proposer = NGramProposer(ngram_min, ngram_max)
        elif speculative_mode == "small_draft":
            d_dir, d_lib = additional_models[0]
            draft = Model(Path(d_dir), Path(d_lib), device)
            if draft.vocab_size != self.model.vocab_size:
                raise GenerationError("draft and target vocab sizes differ")
            self.proposer = SmallDraftProposer(draft, total)
        elif speculative_mode == "eagle":
            from .eagle import EagleHeadModel, EagleProposer, head_kv_tokens

            head = self._load_head(EagleHeadModel, additional_models[0], device)
            self.proposer = EagleProposer(head, self.model, head_kv_tokens(total, max_num_sequence, spec_tree_width,
                                                                           max(spec_draft_length, 8)),
                                          spec_tree_width, spec_tree_nodes)
        elif speculative_mode == "medusa":
            from .medusa import MedusaHeadsModel, MedusaProposer

            head = self._load_head(MedusaHeadsModel, additional_models[0], device)
            self.proposer = MedusaProposer(head, spec_tree_width, spec_tree_nodes, target=self.model)
        self.cost = self._cost_model([Path(model_lib)] + [Path(m[1]) for m in additional_models or []],
                                     f"{speculative_mode}|w{spec_tree_width}")
        self.set_draft_length(spec_draft_length)
        self._next_seq = 0
        # totals over every step this engine ran (the server exports them as metrics)
        self.totals = Stats(spec=SpecMetrics())

    def _load_head(self, cls, paths: tuple[str, str], device: str):
        try:
            return load_head(cls, self.speculative_mode, Path(paths[0]), Path(paths[1]), self.model, device)
        except ValueError as err:
            raise GenerationError(str(err)) from err

    @property
    def _wants_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden_states

    def set_draft_length(self, k: int) -> None:
        """Fix the draft length (k > 0) or make it adaptive (k = 0, starting from the
        calibration earlier processes saved with the cost profile)."""
        if k < 0 or k + 1 > self.max_batch_tokens:
            raise GenerationError(f"draft length {k} does not fit the token budget {self.max_batch_tokens}")
        self.policy = None
        if self.cost is not None:
            acceptance = AcceptanceModel().restore(self.cost.acceptance) if not k else AcceptanceModel()
            self.policy = Policy(self.cost, acceptance, fixed_k=k or None)

    def _cost_model(self, libs: list[Path], mode: str) -> CostModel | None:
        """The forward costs of this engine's target and proposer on this host: read from
        the cache, or measured now on scratch sequences (about a second) and cached."""
        if self.proposer is None:
            return None
        rows = [r for r in TARGET_ROWS if r <= self.max_batch_tokens]
        path = profile_path(libs, mode, f"rows<={rows[-1]}")
        cost = CostModel.load(path)
        if cost is not None:
            return cost
        target = CostTable(measure_target(self.model, self.kv, rows, self._wants_hidden))
        draft, per_token = self.proposer.measure(list(DRAFT_ROWS))
        cost = CostModel(target, CostTable(draft), per_token, path)
        cost.save()
        return cost

    def warm_up(self) -> None:
        """A short greedy generation without and with speculation, then fresh acceptance
        estimates and totals: the first forward of each shape allocates its buffers, which a
        server's first request should not wait for (the cost profile is measured apart)."""
        ids = self.encode_prompt("Count from one to ten.")
        with self.speculation_disabled():
            self.generate(ids, max_tokens=16, ignore_eos=True)
        if self.proposer is not None:
            self.generate(ids, max_tokens=16, ignore_eos=True)
            self.set_draft_length(self.policy.fixed_k or 0)
        self.totals = Stats(spec=SpecMetrics())

    @contextmanager
    def speculation_disabled(self):
        """Run plain decoding with this same engine (bench compares both in one process)."""
        saved = self.proposer
        self.proposer = None
        try:
            yield self
        finally:
            self.proposer = saved

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
        for deltas, results in self._run([prompt_ids], max_tokens, [sampling or SamplingParams()], stop, ignore_eos):
            yield deltas[0], results[0]

    def generate_batch(self, prompts: list[list[int]], max_tokens: int = 128,
                       sampling: list[SamplingParams] | SamplingParams | None = None,
                       stop: list[str] | None = None, ignore_eos: bool = False) -> list[GenerationResult]:
        """Decode several sequences together (one target forward per step for all)."""
        if len(prompts) > self.max_num_sequence:
            raise GenerationError(f"{len(prompts)} sequences exceed max_num_sequence={self.max_num_sequence}")
        if not isinstance(sampling, list):
            sampling = [sampling or SamplingParams()] * len(prompts)
        results = None
        for _, results in self._run(prompts, max_tokens, sampling, stop, ignore_eos):
            pass
        return results

    # -------------------------------------------------------------- the loop
    def _run(self, prompts, max_tokens, samplings, stop, ignore_eos):
        seqs = [self.new_sequence(ids, max_tokens, sp, stop, ignore_eos) for ids, sp in zip(prompts, samplings)]
        try:
            for seq in seqs:
                self.attach(seq)
                try:
                    while seq.prefilling:
                        self.prefill([seq], self.model.prefill_chunk_size)
                except KVCacheFull as err:
                    raise GenerationError(f"the KV cache cannot hold this prompt ({err}); "
                                          "raise max_total_seq_len or run fewer sequences at once") from err
            yield [s.pending_text for s in seqs], [s.result for s in seqs]
            for s in seqs:
                s.pending_text = ""
            while True:
                active = [s for s in seqs if not s.done]
                if not active:
                    break
                self.step(active)
                yield [s.pending_text for s in seqs], [s.result for s in seqs]
                for s in seqs:
                    s.pending_text = ""
        finally:
            for s in seqs:
                self.detach(s)
            if self.policy is not None and self.proposer is not None and self.policy.fixed_k is None:
                self.policy.save()

    # ------------------------------------------------------ step primitives
    def new_sequence(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None,
                     stop: list[str] | None = None, ignore_eos: bool = False, max_len: int | None = None,
                     speculative: bool = True) -> Sequence:
        """A validated sequence, not yet holding KV pages. ``max_len`` caps prompt + output
        (a server passes its KV capacity so that one sequence alone always fits)."""
        if max_tokens <= 0:
            raise GenerationError("max_tokens must be positive")
        self.check_prompt(prompt_ids)
        limit = min(self.context_window, max_len or self.context_window)
        if len(prompt_ids) >= limit:
            raise GenerationError(f"the prompt has {len(prompt_ids)} tokens but at most {limit - 1} fit "
                                  "(context window and KV cache capacity)")
        sp = sampling or SamplingParams()
        seq = Sequence(self._next_seq, list(prompt_ids), min(max_tokens, limit - len(prompt_ids)), sp,
                   np.random.default_rng(sp.seed), list(stop or []), ignore_eos,
                   GenerationResult(list(prompt_ids)), StreamDecoder(self.tokenizer))
        seq.speculative = speculative
        seq.result.stats.spec = SpecMetrics() if self.proposer and speculative else None
        self._next_seq += 1
        return seq

    def attach(self, seq: Sequence) -> None:
        """Give the sequence a KV slot; its history is prefilled by :meth:`prefill`. A
        sequence that already emitted tokens (resumed after preemption) re-prefills all
        but its last token, which the next step feeds as usual: prefill and decode give
        bit-identical logits, so a resumed sequence continues exactly as if never paused."""
        self.kv.add_sequence(seq.seq_id)
        if self.proposer:
            self.proposer.add_sequence(seq.seq_id, seq.history)
        seq.to_prefill = list(seq.history if not seq.result.token_ids else seq.history[:-1])

    def detach(self, seq: Sequence) -> None:
        """Free the sequence's KV pages (target and draft); safe to call twice."""
        self.kv.remove_sequence(seq.seq_id)
        if self.proposer:
            self.proposer.remove_sequence(seq.seq_id)
        seq.to_prefill = []

    def prefill(self, seqs: list[Sequence], budget: int) -> list[Sequence]:
        """Prefill the next chunks of these sequences in one forward, at most ``budget``
        tokens in all (and at most the library's prefill chunk). A sequence whose prompt is
        complete gets its first token. Returns the sequences that finished prefilling.
        Raises KVCacheFull (nothing changed) when the pages are not there."""
        budget = min(budget, self.model.prefill_chunk_size)
        batch, chunks = [], []
        for s in seqs:
            if budget <= 0:
                break
            n = min(len(s.to_prefill), budget)
            if n:
                batch.append(s)
                chunks.append(s.to_prefill[:n])
                budget -= n
        if not batch:
            return []
        t0 = time.perf_counter()
        starts = [self.kv.length(s.seq_id) for s in batch]  # where each chunk begins
        if self._wants_hidden:  # the head needs every prompt token's feature, not only logits
            hidden = self.model.forward_hidden(self.kv, [s.seq_id for s in batch], chunks).numpy()
            ends = np.cumsum([len(c) for c in chunks])
            logits = self.model.get_logits(hidden[ends - 1]).numpy()
            for s, st, end, c in zip(batch, starts, ends, chunks):
                self.proposer.observe_hidden(s.seq_id, st, hidden[end - len(c): end])
        else:
            logits = self.model.prefill(self.kv, [s.seq_id for s in batch], chunks)
        # a draft model prefills with the target -- if drafting is what the batch size about
        # to be decoded (every sequence holding pages) does: otherwise that prefill is pure
        # loss (0.5B draft, batch 8: 7% of the time), and the sequence catches up later, on
        # a probe or when drafting pays again
        drafted = [i for i, s in enumerate(batch) if s.speculative]
        if self.proposer and drafted and self.policy.expects_drafting(len(self.kv.seqs)):
            self.proposer.prefill([batch[i].seq_id for i in drafted], [chunks[i] for i in drafted],
                                  [starts[i] for i in drafted])
        dt = time.perf_counter() - t0
        total = sum(len(c) for c in chunks)
        done = []
        for row, (s, c) in enumerate(zip(batch, chunks)):
            del s.to_prefill[: len(c)]
            s.result.stats.prefill_tokens += len(c)
            s.result.stats.prefill_seconds += dt * len(c) / total
            if not s.to_prefill:
                done.append(s)
                if not s.result.token_ids:
                    s.emit([sample(logits[row], s.sampling, s.rng)], self.stop_token_ids)
        self.totals.prefill_tokens += total
        self.totals.prefill_seconds += dt
        return done

    def step(self, active: list[Sequence]) -> None:
        """One batched decode (draft + verify) step for these prefilled, unfinished sequences."""
        t0 = time.perf_counter()
        before = sum(len(s.result.token_ids) for s in active)
        drafted, forward_seconds = self._step(active)
        dt = time.perf_counter() - t0
        emitted = sum(len(s.result.token_ids) for s in active) - before
        if self.proposer is not None and any(s.speculative for s in active):
            self.policy.observe_step(len(active), drafted, emitted, dt, forward_seconds)
        for s in active:
            s.result.stats.decode_seconds += dt
        self.totals.decode_seconds += dt
        self.totals.decode_tokens += emitted

    def _step(self, active: list[Sequence]) -> tuple[bool, float]:
        """One draft + verify step for every active sequence; (whether any draft was
        verified, seconds spent in draft and target forwards)."""
        b = len(active)
        ids = [s.seq_id for s in active]
        # draft depth: fixed or up to MAX_DEPTH, capped by the token budget per forward and
        # the context window (not by max_tokens: drafts past it are verified, then cut on emission)
        limit = self.max_batch_tokens // b - 1
        room = min(self.context_window - len(s.history) for s in active)
        cap = min(self.policy.fixed_k or MAX_DEPTH, limit, room - 1) if self.policy else 0
        drafts = [Draft() for _ in active]
        t0 = time.perf_counter()
        fw0 = self.proposer.forwards if self.proposer else 0
        if (self.proposer is not None and cap > 0 and any(s.speculative for s in active)
                and not self.policy.hopeless(b)):
            plan = self.policy.plan(b)
            try:
                drafts = self.proposer.propose(ids, [s.history for s in active],
                                               [cap if s.speculative else 0 for s in active],
                                               [s.sampling for s in active], [s.rng for s in active], plan,
                                               node_limit=limit)
                drafts = plan.select(drafts)
            except KVCacheFull:  # the draft model's cache is full: this step verifies no drafts
                drafts = [Draft() for _ in active]
        draft_forwards = (self.proposer.forwards if self.proposer else 0) - fw0
        t1 = time.perf_counter()
        logits, hidden = self._target_forward(active, drafts)
        if logits is None:  # the KV cache could not hold the drafts: verify none of them
            drafts = [Draft() for _ in active]
            logits, hidden = self._target_forward(active, drafts)
        verdicts = self._verify_on_device(active, drafts, logits)
        t2 = time.perf_counter()
        if self.policy is not None:
            self.cost.observe_target(sum(len(d) + 1 for d in drafts), t2 - t1)
        row = 0
        tree = any(d.parents is not None for d in drafts)  # as _target_forward planned the forward
        for s, d, verdict in zip(active, drafts, verdicts):
            if not tree:
                self.kv.popn(s.seq_id, len(d) - len(verdict.path))
            else:
                self.model.commit_tree(self.kv, s.seq_id, [0] + [n + 1 for n in verdict.path])
            if hidden is not None:  # features of the last committed token and the accepted drafts
                self.proposer.observe_hidden(s.seq_id, len(s.history) - 1,
                                             hidden[[row] + [row + 1 + j for j in verdict.path]])
            row += len(d) + 1
            if s.result.stats.spec is not None:
                self.policy.observe_verdict(d, verdict.path)
                depths = _depths(d.parent_list())
                # each sequence sees the whole step's time; the engine totals count it once
                for m, share in ((s.result.stats.spec, 1.0), (self.totals.spec, 1.0 / b)):
                    if len(d):
                        m.record_verify(depths, len(verdict.path), len(verdict.tokens))
                    else:
                        m.plain_steps += 1
                    m.draft_seconds += (t1 - t0) * share
                    m.verify_seconds += (t2 - t1) * share
                s.result.stats.spec.draft_steps += draft_forwards
            s.result.stats.decode_tokens += s.emit(verdict.tokens, self.stop_token_ids)
            if self.proposer and not s.done:
                self.proposer.on_commit(s.seq_id, s.history)
        if any(s.result.stats.spec is not None for s in active):
            self.totals.spec.draft_steps += draft_forwards  # once per step, whatever the batch
            rest = time.perf_counter() - t2
            for s in active:
                if s.result.stats.spec is not None:
                    s.result.stats.spec.other_seconds += rest
            self.totals.spec.other_seconds += rest
        return any(len(d) for d in drafts), t2 - t0

    def _verify_on_device(self, active: list[Sequence], drafts: list[Draft], logits) -> list[Verdict]:
        """The one verification routine, run by the library's TensorIR kernels on the device
        logits (runtime/acceptance.py is their numpy reference): greedy -- argmax and tree walk
        -- when every sequence is greedy, else temperature/top-k/top-p probabilities and
        recursive rejection sampling for the whole batch (a greedy row's probabilities are
        one-hot at its argmax, so it follows the greedy rule there too)."""
        tokens = [[s.history[-1]] + d.tokens for s, d in zip(active, drafts)]
        parents = [d.verify_parents() for d in drafts]
        if all(s.sampling.greedy for s in active):
            res = self.model.accept_greedy(logits, tokens, parents)
        else:
            per_row = [s.sampling for s, d in zip(active, drafts) for _ in range(len(d) + 1)]
            p = self.model.sampling_probs(logits, [x.temperature for x in per_row], [x.top_k for x in per_row],
                                          [x.top_p for x in per_row])
            one_hot = [d.probs is None for d in drafts]
            q = None
            if not all(one_hot):  # row 0 of each sequence (its last token) has no draft distribution
                q = np.zeros((len(per_row), self.model.vocab_size), np.float32)
                row = 0
                for d in drafts:
                    if d.probs is not None:
                        q[row + 1: row + 1 + len(d)] = d.probs
                    row += len(d) + 1
            uniforms = [s.rng.random(len(d) + 1) for s, d in zip(active, drafts)]  # each node's test, then the bonus
            res = self.model.accept_sampled(p, q, one_hot, tokens, parents, uniforms)
        return [Verdict(path, [d.tokens[j] for j in path] + [last]) for (path, last), d in zip(res, drafts)]

    def _target_forward(self, active: list[Sequence], drafts: list[Draft]):
        """(device logits [n, vocab] of [last] + drafts for every sequence, their hidden states
        [n, hidden] on the host when the proposer reads them, else None); logits None if
        the KV cache is full. With hidden states the forward stops at the final norm and
        ``get_logits`` finishes it: the same kernels, so the same logits bit for bit."""
        ids = [s.seq_id for s in active]
        tokens = [[s.history[-1]] + d.tokens for s, d in zip(active, drafts)]
        tree = any(d.parents is not None for d in drafts)
        parents = [d.verify_parents() for d in drafts] if tree else None
        if self._wants_hidden:
            try:
                hidden = self.model.forward_hidden(self.kv, ids, tokens, parents)
            except KVCacheFull:
                return None, None
            logits = self.model.get_logits(hidden)
            return logits, hidden.numpy()
        if all(len(d) == 0 for d in drafts):
            return self.model.decode(self.kv, ids, [s.history[-1] for s in active], on_device=True), None
        try:
            if tree:
                return self.model.forward_tokens(self.kv, ids, tokens, parents, True), None
            return self.model.forward_tokens(self.kv, ids, tokens, on_device=True), None
        except KVCacheFull:
            return None, None


def _depths(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth
