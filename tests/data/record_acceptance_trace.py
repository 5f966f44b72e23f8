"""Record the acceptance trace that tests/runtime/test_acceptance_replay.py replays.

A real concurrent workload: Qwen2.5-Coder-1.5B-Instruct q4f32_1 verifying a fixed 4-token
chain from Qwen2.5-Coder-0.5B-Instruct (small_draft) for the twelve bench/prompts.jsonl prompts
(two of each category), all decoded together (greedy, 128 tokens). A fixed length verifies every drafted
node whatever the policy predicts, so the trace holds each node's draft confidence and whether
it was tried and accepted -- the outcomes, independent of any calibration. Steps are kept in
the order they ran, each with the batch's sequences.

    .venv/bin/python tests/data/record_acceptance_trace.py   # ~3 min on 2 cores, models cached
"""
import json
import sys
from pathlib import Path

from speccompile.compiler.fetch import prepare
from speccompile.runtime.engine import Engine

OUT = Path(__file__).with_name("acceptance_trace_qwen15_small_draft.json")


def main() -> None:
    target_dir, target_lib = prepare("Qwen2.5-Coder-1.5B-Instruct", "q4f32_1")
    draft_dir, draft_lib = prepare("Qwen2.5-Coder-0.5B-Instruct", "q4f32_1")
    rows = [json.loads(line) for line in open(Path(__file__).parents[2] / "bench" / "prompts.jsonl")]
    prompts = [(r["category"], r["turns"][0]) for r in rows]
    engine = Engine(target_dir, target_lib, speculative_mode="small_draft", spec_draft_length=4,
                    additional_models=[(str(draft_dir), str(draft_lib))], max_num_sequence=len(prompts))
    steps = []
    run_step = engine.step

    def step(active):
        record = run_step(active)
        steps.append([{"seq": s.seq_id, "conf": [round(c, 5) for c in d.conf or []], "parents": d.parent_list(),
                       "path": v.path} for s, d, v in zip(active, record.drafts, record.verdicts)])
        return record

    engine.step = step
    ids = [engine.encode_prompt(p) for _, p in prompts]
    first = engine._next_seq
    results = engine.generate_batch(ids, max_tokens=128)
    category = {first + i: c for i, (c, _) in enumerate(prompts)}
    OUT.write_text(json.dumps({"target": "Qwen2.5-Coder-1.5B-Instruct-q4f32_1",
                               "draft": "Qwen2.5-Coder-0.5B-Instruct-q4f32_1", "draft_length": 4,
                               "category": {str(k): v for k, v in category.items()},
                               "accept_rate": [r.stats.spec.accept_rate for r in results],
                               "steps": steps}) + "\n")
    print(f"{len(steps)} steps -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
