"""The generation engine: tokenizer + target model + KV cache + a proposer -> text.

One decode step serves every mode and batch size, and reads like the algorithm:

1. propose: the policy (runtime/adaptive.py) caps the draft depth, the proposer drafts
   while the step's plan says the next draft forward pays, and the plan keeps the nodes
   worth their verify rows (none at all is plain decoding);
2. one target forward over ``[last] + drafts`` of every sequence;
3. acceptance, the one verification routine, run by the library's kernels
   (runtime/acceptance.py is their numpy reference): a prefix or tree path plus a bonus;
4. commit: roll the KV cache back past rejected chain tokens, or move an accepted tree
   path into place;
5. emit the accepted tokens, and account the step once (a ``StepRecord`` that the metrics
   and the policy both read).

Bad input is refused before any forward runs. The step is exposed as primitives
(``new_sequence``, ``attach``, ``prefill``, ``step``, ``detach``) that ``generate_batch`` and
the scheduler (runtime/scheduler.py) drive alike: the scheduler only decides *which*
sequences take part in a step, never how a step runs.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .acceptance import Draft, Verdict, verified_as_tree
from .adaptive import MAX_DEPTH, AcceptanceModel, Policy, StepPlan
from .contract import read_model_config
from .costs import load_or_measure, weights_key
from .device import DeviceError, parse_device
from .generation import GenerationAPI
from .grammar import Grammars, constrain_drafts
from .kv_cache import KVCacheFull
from .metrics import SpecMetrics, StepRecord, record_step
from .model import Model
from .options import EngineConfig, configs_from
from .penalties import adjust_first, adjust_step, check_ids
from .prediction import check_prediction
from .prefix_cache import PrefixCache
from .shared_prefill import take_shared
from .sampling import SamplingParams, sample, token_logprobs
from .sequence import GenerationError, GenerationResult, Sequence, Stats
from .speculative import SpeculativeConfig
from .threads import PoolTuner, thread_count
from .tokenizer import StreamDecoder, load_tokenizer


class Engine(GenerationAPI):
    """Greedy/sampled generation, plain or speculative, for one or many sequences (the
    step primitives here; whole generations and prompts in runtime/generation.py)."""

    def __init__(self, model_dir: str | Path, model_lib: str | Path, device: str = "auto",
                 speculative: SpeculativeConfig | None = None, engine: EngineConfig | None = None, *,
                 max_batch_tokens: int | None = None, **options):
        """``speculative``, ``engine``: the config objects (runtime/options.py), or their fields by
        name. Run-time sizes only lower what the config and library were built for; a lowered
        ``prefill_chunk_size`` is also the token budget per forward."""
        # ---- validate everything cheap before loading anything
        try:
            spec, sizing = configs_from(options, (SpeculativeConfig, speculative), (EngineConfig, engine))
        except ValueError as err:
            raise GenerationError(str(err)) from None
        max_num_sequence, prefill_chunk_size = sizing.max_num_sequence, sizing.prefill_chunk_size
        try:
            parse_device(device)
            self.config = read_model_config(Path(model_dir))
            self.context_window, self.max_batch_tokens = sizing.limits(self.config, max_batch_tokens)
        except (DeviceError, ValueError) as err:
            raise GenerationError(str(err)) from err
        self.model_dir = Path(model_dir)
        self.max_num_sequence = max_num_sequence
        spec.check(self.model_dir, self.max_batch_tokens)
        self.spec, self.sizes = spec, sizing  # the config objects it runs with
        self.tokenizer = load_tokenizer(self.model_dir)
        # ---- load
        self.model = Model(self.model_dir, Path(model_lib), device, cuda_graph=sizing.cuda_graph == "on")
        # CPU kernels: the pool size that decodes fastest beside whatever else runs here
        self.pool = PoolTuner(thread_count()) if self.model.cpu_kernels else None
        if self.model.meta["model_type"] != self.config["model_type"]:
            raise GenerationError("model library and config disagree on the model type")
        if prefill_chunk_size is not None and prefill_chunk_size > self.model.prefill_chunk_size:
            raise GenerationError(f"prefill_chunk_size={prefill_chunk_size} exceeds the {self.model.prefill_chunk_size}"
                                  f"-token chunk {model_lib} was compiled for")
        self.model.prefill_chunk_size = prefill_chunk_size or self.model.prefill_chunk_size  # read by every prefill
        total = sizing.max_total_seq_length or min(self.context_window * max_num_sequence, 32768)  # shared by all sequences
        self.kv = self.model.create_kv_cache(total)
        self.stop_token_ids = set(self.config.get("stop_token_ids", []))
        self.grammars = Grammars(self.model_dir / "tokenizer.json", self.model.vocab_size, list(self.stop_token_ids))
        self.proposer = spec.build(self.model, total, max_num_sequence, device)
        self.cost = None
        if self.proposer is not None:
            libs = [Path(model_lib)] + [Path(lib) for _, lib in spec.additional_models]
            self.cost = load_or_measure(libs, f"{spec.speculative_mode}|w{spec.spec_tree_width}", self.model,
                                        self.kv, self.proposer, self.max_batch_tokens)
            key = weights_key([self.model_dir] + [Path(d) for d, _ in spec.additional_models])
            if self.cost.acceptance_of != key:  # learned with other weights: start from the prior
                self.cost.acceptance, self.cost.acceptance_of = None, key
        self.set_draft_length(spec.spec_draft_length)
        recycling = sizing.prefix_cache_max_num_recycling_seqs
        self.prefix_cache = PrefixCache(self, max_num_sequence if recycling is None else recycling)
        self._next_seq = 0
        self.totals = Stats(spec=SpecMetrics())  # every step this engine ran (a server exports them)
        self.feature_sink = None  # see capture_features

    def set_draft_length(self, k: int) -> None:
        """Fix the draft length (k > 0) or make it adaptive (k = 0, starting from the
        calibration earlier processes saved with the cost profile)."""
        if k < 0 or k + 1 > self.max_batch_tokens:
            raise GenerationError(f"draft length {k} does not fit the token budget {self.max_batch_tokens}")
        self.policy = None
        if self.cost is not None:
            acceptance = AcceptanceModel().restore(self.cost.acceptance) if not k else AcceptanceModel()
            self.policy = Policy(self.cost, acceptance, fixed_k=k or None)

    # ------------------------------------------------------ step primitives
    def new_sequence(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None,
                     stop: list[str] | None = None, ignore_eos: bool = False, max_len: int | None = None,
                     speculative: bool = True, grammar=None, top_logprobs: int | None = None, tenant=None,
                     prediction: list[int] | None = None) -> Sequence:
        """A validated sequence, not yet holding KV pages. ``max_len`` caps prompt + output
        (a server passes its KV capacity so that one sequence alone always fits); ``grammar``:
        its own ``self.grammars.constraint(response_format)``, which every token obeys;
        ``top_logprobs``: 0..20 alternatives per token; ``tenant``: whose requests may draft for it;
        ``prediction``: the client's guess at the answer's tokens, a draft source (runtime/prediction.py)."""
        if max_tokens <= 0:
            raise GenerationError("max_tokens must be positive")
        if top_logprobs is not None and not 0 <= top_logprobs <= 20:
            raise GenerationError(f"top_logprobs={top_logprobs}: give 0..20")
        self.check_prompt(prompt_ids)
        limit = min(self.context_window, max_len or self.context_window)
        if len(prompt_ids) >= limit:
            raise GenerationError(f"the prompt has {len(prompt_ids)} tokens but at most {limit - 1} fit "
                                  "(context window and KV cache capacity)")
        sp = sampling or SamplingParams()
        check_ids(sp, self.model.vocab_size)
        check_prediction(self, prediction)
        seq = Sequence(self._next_seq, list(prompt_ids), min(max_tokens, limit - len(prompt_ids)), sp,
                       np.random.default_rng(sp.seed), list(stop or []), ignore_eos,
                       GenerationResult(list(prompt_ids)), StreamDecoder(self.tokenizer), speculative=speculative,
                       grammar=grammar, top_logprobs=top_logprobs, tenant=tenant)
        seq.result.prediction = prediction or None  # the result reports its usage, attach drafts from it
        if top_logprobs is not None:
            seq.result.logprobs = []
        seq.result.stats.spec = SpecMetrics() if self.proposer and speculative else None
        self._next_seq += 1
        return seq

    def attach(self, seq: Sequence) -> None:
        """Give the sequence a KV slot; its history is prefilled by :meth:`prefill`. A new
        prompt that starts like a kept finished sequence takes that one's KV -- and its
        ``seq_id`` -- and prefills only the rest (runtime/prefix_cache.py). A sequence that
        already emitted tokens (resumed after preemption) re-prefills all but its last token,
        which the next step feeds as usual: prefill and decode give bit-identical logits, so
        a resumed sequence continues exactly as if never paused."""
        if not seq.result.token_ids and (cached := self.prefix_cache.take(seq)):
            seq.result.stats.cached_prompt_tokens = cached
            self.totals.cached_prompt_tokens += cached
            seq.to_prefill = list(seq.history[cached:])
        else:
            self.kv.add_sequence(seq.seq_id)
            if self.proposer:
                self.proposer.add_sequence(seq.seq_id, seq.history, seq.tenant)
                if self.policy is not None:
                    self.policy.acceptance.new_prompt(seq.seq_id)
            seq.to_prefill = list(seq.history if not seq.result.token_ids else seq.history[:-1])
        if seq.result.prediction and seq.speculative:  # the proposer's id for it is final now
            self.proposer.predict(seq.seq_id, seq.result.prediction)

    def detach(self, seq: Sequence, keep: bool = False) -> None:
        """Free the sequence's KV pages (target and draft); safe to call twice. ``keep``: a
        sequence that finished is kept for a later prompt that starts the same way instead
        (the prefix cache, while it has room)."""
        if keep and seq.done and self.prefix_cache.keep(seq):
            seq.to_prefill = []
            return
        self.kv.remove_sequence(seq.seq_id)
        if self.proposer:
            self.proposer.remove_sequence(seq.seq_id)
            if self.policy is not None:
                self.policy.acceptance.forget(seq.seq_id)
        seq.to_prefill = []

    def prefill(self, seqs: list[Sequence], budget: int) -> list[Sequence]:
        """Prefill the next chunks of these sequences in one forward, at most ``budget``
        tokens in all (and at most the library's prefill chunk). A sequence whose prompt is
        complete gets its first token. Returns the sequences that finished prefilling.
        Raises KVCacheFull (nothing changed) when the pages are not there. Choices of one
        prompt copy their source's prefill instead (runtime/shared_prefill.py)."""
        shared, seqs = take_shared(self, seqs)
        budget = min(budget, self.model.prefill_chunk_size)
        batch, chunks = [], []
        for s in seqs:
            n = min(len(s.to_prefill), budget)
            if n:
                batch.append(s)
                chunks.append(s.to_prefill[:n])
                budget -= n
        if not batch:
            return shared
        t0 = time.perf_counter()
        ids, starts = [s.seq_id for s in batch], [self.kv.length(s.seq_id) for s in batch]
        if self._features():  # a head (or the feature sink) reads every prompt token's features
            hidden, feats = self._forward_features(ids, chunks, None)
            ends = np.cumsum([len(c) for c in chunks])
            logits = self.model.get_logits(hidden.numpy()[ends - 1]).numpy()
            for sid, start, end, c in zip(ids, starts, ends, chunks):
                self._observe(sid, start, tuple(f[end - len(c): end] for f in feats))
        else:
            logits = self.model.prefill(self.kv, ids, chunks)
        # a draft model prefills along -- if the batch about to decode (every sequence
        # holding pages) would draft, and drafting can win back what the prefill costs over
        # what the sequence may still emit: otherwise that prefill is pure loss, and a
        # sequence catches up later, priced by its proposer, when drafting pays again
        n = len(self.kv.seqs)
        drafted = [i for i, s in enumerate(batch) if s.speculative and self.proposer and self.policy.draft_prefill_pays(
            len(s.history), self.policy.expected_output(s.budget - len(s.result.token_ids), len(s.result.token_ids)),
            n, s.seq_id)]
        if drafted and self.policy.expects_drafting(list(self.kv.seqs)):
            self.proposer.prefill([ids[i] for i in drafted], [chunks[i] for i in drafted], [starts[i] for i in drafted])
        dt, total = time.perf_counter() - t0, sum(len(c) for c in chunks)
        done = []
        for row, (s, c) in enumerate(zip(batch, chunks)):
            del s.to_prefill[: len(c)]
            s.result.stats.prefill_tokens += len(c)
            s.result.stats.prefill_seconds += dt * len(c) / total
            if not s.to_prefill:
                done.append(s)
                if not s.result.token_ids:
                    s.first_logits = logits[row].copy() if s.shares_prefill else None
                    row_logits = adjust_first(logits[row], s)  # penalties, bias, grammar, min-p
                    self._emit(s, [sample(row_logits, s.sampling, s.rng)], row_logits[None])
        self.totals.prefill_tokens += total
        self.totals.prefill_seconds += dt
        return shared + done

    def step(self, active: list[Sequence]) -> StepRecord:
        """One decode step for these prefilled, unfinished sequences: propose, verify all
        of them in one target forward, accept, commit, emit; the record is accounted once."""
        if self.pool is not None:
            self.pool.begin()
        t0 = time.perf_counter()
        drafts, draft_forwards, plan = self._propose(active)
        t1 = time.perf_counter()
        drafts, masks = constrain_drafts(active, drafts)  # what a grammar forbids is not verified
        drafts, logits, hidden = self._forward(active, drafts)
        host = None  # [rows, vocab] on the host, for grammar masks, penalties and logprobs
        adjust = masks is not None or any(s.sampling.adjusts_logits for s in active)
        if adjust or any(s.top_logprobs is not None for s in active):
            host = logits.numpy()
        if adjust:  # each row as of its own prefix (runtime/penalties.py)
            logits = self.model.uploads.put("grammar.logits", adjust_step(host, active, drafts, masks))
        verdicts = self._accept(active, drafts, logits)
        t2 = time.perf_counter()
        self._commit(active, drafts, verdicts, hidden)
        starts = np.cumsum([0] + [len(d) + 1 for d in drafts])  # each sequence's row 0
        emitted = [self._emit(s, v.tokens, None if host is None else host[[row] + [row + 1 + j for j in v.path]])
                   for s, v, row in zip(active, verdicts, starts)]
        if self.proposer is not None:
            for s in active:
                if not s.done:
                    self.proposer.on_commit(s.seq_id, s.history)
        speculative = [s.speculative and self.proposer is not None for s in active]
        step = StepRecord(drafts, verdicts, emitted, speculative, draft_forwards, t1 - t0, t2 - t1,
                          time.perf_counter() - t2, [s.seq_id for s in active])
        if self.policy is not None:  # plain steps too: they keep the target's pace current
            self.policy.observe(step, plan)
        record_step(step, [s.result.stats for s in active], self.totals)
        if self.pool is not None:
            self.pool.end((step.rows, draft_forwards), step.seconds)
        return step

    def _propose(self, active: list[Sequence]) -> tuple[list[Draft], int, StepPlan | None]:
        """(each sequence's draft as the plan keeps it, draft forwards run, the step's plan --
        what it priced the proposing at, which Policy.observe compares -- or None). The depth is
        fixed or up to MAX_DEPTH, capped by the token budget per forward and the context
        window (not by max_tokens: drafts past it are verified, then cut on emission)."""
        plain = [Draft() for _ in active]
        if self.proposer is None or not any(s.speculative for s in active):
            return plain, 0, None
        b = len(active)
        limit = self.max_batch_tokens // b - 1
        room = min(self.context_window - len(s.history) for s in active)
        cap = min(self.policy.fixed_k or MAX_DEPTH, limit, room - 1)
        if cap <= 0 or self.policy.hopeless(b, self.proposer.free_drafts):
            return plain, 0, None
        plan, before = self.policy.plan(b, [s.seq_id for s in active]), self.proposer.forwards
        try:
            drafts = plan.select(self.proposer.propose(
                [s.seq_id for s in active], [s.history for s in active], [cap if s.speculative else 0 for s in active],
                [s.sampling for s in active], [s.rng for s in active], plan, node_limit=limit))
        except KVCacheFull:  # the draft model's cache is full: this step verifies no drafts
            drafts = plain
        return drafts, self.proposer.forwards - before, plan

    def _forward(self, active: list[Sequence], drafts: list[Draft]):
        """(the drafts verified, device logits [n, vocab] of ``[last] + drafts`` of every
        sequence, their features on the host if the proposer reads some). When the KV cache
        cannot hold the drafts, none are verified (plain decoding still raises KVCacheFull: the
        scheduler preempts). With features the forward stops at the final norm and
        ``get_logits`` finishes it: the same kernels, so the same logits."""
        ids = [s.seq_id for s in active]
        tokens = [[s.history[-1]] + d.tokens for s, d in zip(active, drafts)]
        tree = verified_as_tree(drafts)
        parents = [d.verify_parents() for d in drafts] if tree else None
        try:
            if self._features():
                return drafts, *self._forward_features(ids, tokens, parents, logits=True)
            if all(len(d) == 0 for d in drafts):
                return drafts, self.model.decode(self.kv, ids, [t[0] for t in tokens], on_device=True), None
            return drafts, self.model.forward(self.kv, ids, tokens, parents, on_device=True), None
        except KVCacheFull:
            if not any(len(d) for d in drafts):
                raise
            return self._forward(active, [Draft() for _ in active])

    def _features(self) -> str:
        """Which target features this step's forward must return: the proposer's ("" none,
        "hidden", "layers"), or "layers" for the feature sink."""
        return "layers" if self.feature_sink is not None else self.proposer.features if self.proposer else ""

    def _observe(self, seq_id: int, position: int, feats: tuple[np.ndarray, ...]) -> None:
        """Hand the features of committed tokens at position.. to whoever reads them: the
        proposer its kind, the sink the layer features and the hidden states."""
        if self.proposer is not None and self.proposer.features:
            self.proposer.observe_hidden(seq_id, position, feats[0])
        if self.feature_sink is not None:
            self.feature_sink(seq_id, position, *feats)

    def _forward_features(self, ids: list[int], tokens: list[list[int]], parents: list[list[int]] | None,
                          logits: bool = False):
        """(device final-normed hidden states [n, hidden] or, with ``logits``, their logits [n, vocab];
        host features: what the proposer reads -- those hidden states, or the target's low/mid/high
        layer outputs [n, 3 * hidden] -- then, for the feature sink, the hidden states too)."""
        layers = self._features() == "layers"
        outs = self.model.forward(self.kv, ids, tokens, parents, ("hidden",) + (("features",) if layers else ())
                                  + (("logits",) if logits else ()))  # with logits: one call, one CUDA graph
        hidden = outs[0]
        out = outs[-1] if logits else hidden
        if not layers:
            return out, (hidden.numpy(),)
        return out, (outs[1].numpy(),) + ((hidden.numpy(),) if self.feature_sink is not None else ())

    def _accept(self, active: list[Sequence], drafts: list[Draft], logits) -> list[Verdict]:
        """The one verification routine, on the device logits (grammar masks applied): greedy
        (argmax and tree walk) when every sequence is greedy, else temperature/top-k/top-p
        probabilities and recursive rejection sampling for the whole batch (a greedy row's
        probabilities are one-hot at its argmax, so it follows the greedy rule there too)."""
        tokens = [[s.history[-1]] + d.tokens for s, d in zip(active, drafts)]
        parents = [d.verify_parents() for d in drafts]
        if all(s.sampling.greedy for s in active):
            res = self.model.accept_greedy(logits, tokens, parents)
        else:
            rows = [s.sampling for s, d in zip(active, drafts) for _ in range(len(d) + 1)]
            p = self.model.sampling_probs(logits, [x.temperature for x in rows], [x.top_k for x in rows],
                                          [x.top_p for x in rows])
            q = None
            if any(d.probs is not None for d in drafts):  # row 0 of a sequence (its last token) has no q
                q = np.zeros((len(rows), self.model.vocab_size), np.float32)
                starts = np.cumsum([0] + [len(d) + 1 for d in drafts])
                for d, start in zip(drafts, starts):
                    if d.probs is not None:
                        q[start + 1: start + 1 + len(d)] = d.probs
            uniforms = [s.rng.random(len(d) + 1) for s, d in zip(active, drafts)]  # each node's test, then the bonus
            res = self.model.accept_sampled(p, q, [d.probs is None for d in drafts], tokens, parents, uniforms)
        return [Verdict(path, [d.tokens[j] for j in path] + [last]) for (path, last), d in zip(res, drafts)]

    def _emit(self, seq: Sequence, tokens: list[int], rows: np.ndarray | None) -> int:
        """Emit a step's tokens, chosen at ``rows`` [len(tokens), vocab] of host logits (or
        None); the sequence's grammar takes what was emitted, and its logprobs, if asked for."""
        if seq.grammar is not None:  # nothing after the grammar's end (ignore_eos keeps one EOS)
            tokens = tokens[: seq.grammar.until_complete(tokens)]
        n = seq.emit(tokens, self.stop_token_ids)
        if seq.grammar is not None and not seq.done and seq.grammar.commit(tokens[:n]):
            seq.result.finish_reason = "stop"
        if seq.done and self.policy is not None:  # emit is never called on a finished sequence
            self.policy.observe_output(len(seq.result.token_ids))
        if seq.top_logprobs is not None:
            seq.result.logprobs += token_logprobs(rows[:n], tokens[:n], seq.sampling.temperature, seq.top_logprobs)
        return n

    def _commit(self, active: list[Sequence], drafts: list[Draft], verdicts: list[Verdict], hidden) -> None:
        """Keep the accepted tokens' KV entries: a chain rolls back what was rejected, a tree
        moves its accepted path into place. A proposer that reads features gets those of
        the last committed token and the accepted drafts."""
        tree = verified_as_tree(drafts)  # as _forward planned the forward
        row = 0
        for s, d, verdict in zip(active, drafts, verdicts):
            if tree:
                self.model.commit_tree(self.kv, s.seq_id, [0] + [n + 1 for n in verdict.path])
            else:
                self.kv.popn(s.seq_id, len(d) - len(verdict.path))
            if hidden is not None:
                rows = [row] + [row + 1 + j for j in verdict.path]
                self._observe(s.seq_id, len(s.history) - 1, tuple(f[rows] for f in hidden))
            row += len(d) + 1
