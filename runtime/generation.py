"""The caller's side of the Engine: prompts (chat template, tokens), whole generations (one,
streamed, a batch), the warm-up, and the plain and feature-capturing modes of one engine.

Everything here drives the step primitives of runtime/engine.py (``new_sequence``,
``attach``, ``prefill``, ``step``, ``detach``) -- exactly what the continuous-batching
scheduler drives too -- so a generation here and a request in a server run the same steps.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .kv_cache import KVCacheFull
from .metrics import SpecMetrics
from .sampling import SamplingParams
from .sequence import GenerationError, GenerationResult, Stats
from .tokenizer import render_messages


class GenerationAPI:
    """Mixed into ``Engine``: the methods applications call."""

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise GenerationError("the prompt is empty")
        if len(ids) >= self.context_window:
            raise GenerationError(
                f"the prompt has {len(ids)} tokens but the context window is {self.context_window}; "
                "shorten it or rebuild with gen_config --context-window-size")
        self.model.check_token_ids(np.asarray(ids))

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
    def capture_features(self, sink):
        """Within this block every forward also returns the target's low/mid/high layer
        features, and ``sink(seq_id, position, layers [m, 3 * hidden], hidden [m, hidden])``
        receives those, and the final-normed hidden states, of each token as it is committed (prompt tokens at prefill, then every accepted token):
        an EAGLE-3 head's training data, captured while the engine generates, with no
        second pass. The logits are the same kernels' (bit-identical)."""
        if self.model.feature_layers is None:
            raise GenerationError(f"{self.model.lib_path} exports no layer features (built before EAGLE-3 "
                                  "support): rebuild it with `speccompile compile`")
        if self.proposer is not None and self.proposer.features not in ("", "layers"):
            raise GenerationError(f"--speculative-mode {self.spec.speculative_mode} reads the final hidden states; "
                                  "layer features cannot be captured beside it")
        self.feature_sink = sink
        try:
            yield self
        finally:
            self.feature_sink = None

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
    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat template applied; ``tools``: OpenAI function definitions, for a template
        with a tools section (runtime/tools.py ``template_messages`` covers one without)."""
        return render_messages(self.config, messages, tools)

    @property
    def template_has_tools(self) -> bool:
        return "tools" in self.config.get("chat_template", "")

    def encode_prompt(self, prompt: str, raw: bool = False) -> list[int]:
        text = prompt if raw else self.render([{"role": "user", "content": prompt}])
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.config.get("bos_token_id")
        if self.config.get("add_bos_token") and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    # --------------------------------------------------------------- generate
    def generate(self, prompt_ids: list[int], max_tokens: int = 128, sampling: SamplingParams | None = None,
                 stop: list[str] | None = None, ignore_eos: bool = False, response_format: dict | None = None,
                 top_logprobs: int | None = None, prediction: list[int] | None = None) -> GenerationResult:
        """``prediction``: token ids the answer is expected to repeat (Predicted Outputs)."""
        return self.generate_batch([prompt_ids], max_tokens, sampling, stop, ignore_eos, response_format,
                                   top_logprobs, None if prediction is None else [prediction])[0]

    def generate_stream(self, prompt_ids: list[int], max_tokens: int = 128, sampling: SamplingParams | None = None,
                        stop: list[str] | None = None, ignore_eos: bool = False, response_format: dict | None = None,
                        top_logprobs: int | None = None,
                        prediction: list[int] | None = None) -> Iterator[tuple[str, GenerationResult]]:
        """Yields (text delta, result so far); the last result is final."""
        for deltas, results in self._run([prompt_ids], max_tokens, [sampling or SamplingParams()], stop, ignore_eos,
                                         response_format, top_logprobs, None if prediction is None else [prediction]):
            yield deltas[0], results[0]

    def generate_batch(self, prompts: list[list[int]], max_tokens: int = 128,
                       sampling: list[SamplingParams] | SamplingParams | None = None,
                       stop: list[str] | None = None, ignore_eos: bool = False,
                       response_format: dict | None = None, top_logprobs: int | None = None,
                       predictions: list[list[int] | None] | None = None) -> list[GenerationResult]:
        """Decode several sequences together (one target forward per step for all).
        ``response_format``: OpenAI's (``json_object``, ``json_schema``), for every sequence;
        ``top_logprobs``: report each token's log-probability and this many alternatives;
        ``predictions``: each sequence's prediction of its answer (runtime/prediction.py), or None."""
        if len(prompts) > self.max_num_sequence:
            raise GenerationError(f"{len(prompts)} sequences exceed max_num_sequence={self.max_num_sequence}")
        if not isinstance(sampling, list):
            sampling = [sampling or SamplingParams()] * len(prompts)
        results = None
        for _, results in self._run(prompts, max_tokens, sampling, stop, ignore_eos, response_format, top_logprobs,
                                    predictions):
            pass
        return results

    def _run(self, prompts, max_tokens, samplings, stop, ignore_eos, response_format=None, top_logprobs=None,
             predictions=None):
        """Prefill every prompt, then step until all are done, yielding (deltas, results)."""
        predictions = predictions or [None] * len(prompts)
        seqs = [self.new_sequence(ids, max_tokens, sp, stop, ignore_eos, grammar=self.grammars.constraint(response_format),
                                  top_logprobs=top_logprobs, prediction=pred)
                for ids, sp, pred in zip(prompts, samplings, predictions)]
        finished = False
        try:
            for seq in seqs:
                self.attach(seq)
                try:
                    while seq.prefilling:
                        self.prefill([seq], self.model.prefill_chunk_size)
                except KVCacheFull as err:
                    raise GenerationError(f"the KV cache cannot hold this prompt ({err}); "
                                          "raise max_total_seq_length or run fewer sequences at once") from err
            while True:
                yield [s.pending_text for s in seqs], [s.result for s in seqs]
                for s in seqs:
                    s.pending_text = ""
                active = [s for s in seqs if not s.done]
                if not active:
                    finished = True
                    break
                self.step(active)
        finally:
            for s in seqs:
                self.detach(s, keep=finished)  # a generation cut short (an error, a closed stream) is freed
            if self.policy is not None and self.proposer is not None and self.policy.fixed_k is None:
                self.policy.save()
