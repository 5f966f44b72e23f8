"""``make demo``: fetch SmolLM2-135M-Instruct, convert to q4f32_1, compile for this CPU, chat."""
from __future__ import annotations

import sys

from speccompile.compiler.fetch import prepare
from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams

PROMPT = "Explain in two sentences why the sky is blue."
# SmolLM2's model card recommends temperature 0.2 / top-p 0.9: greedy decoding of a 135M
# model at 4 bits tends to repeat itself. A fixed seed keeps the demo reproducible.
SAMPLING = SamplingParams(temperature=0.2, top_p=0.9, seed=0)


def main() -> None:
    model_dir, lib = prepare("SmolLM2-135M-Instruct", "q4f32_1")
    engine = Engine(model_dir, lib)
    print(f"user: {PROMPT}\nassistant: ", end="", flush=True)
    result = None
    for delta, result in engine.generate_stream(engine.encode_prompt(PROMPT), max_tokens=128, sampling=SAMPLING):
        print(delta, end="", flush=True)
    s = result.stats.to_dict()
    print(f"\n\n[{s['prefill_tokens']} prompt tokens at {s['prefill_tokens_per_s']:.0f} tok/s, "
          f"{s['decode_tokens']} decoded at {s['decode_tokens_per_s']:.1f} tok/s]", file=sys.stderr)


if __name__ == "__main__":
    main()
