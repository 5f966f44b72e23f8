# Two commands on a fresh machine: `make install`, then `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test test-fast demo bench heads clean

install:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@echo "installed into $(VENV)/ -- run 'make test'"

test:
	$(BIN)/python -m pytest -q

test-fast:
	$(BIN)/python -m pytest -q -m "not real_model"

demo:
	$(BIN)/python -m speccompile.demo

# Benchmarks are not tests: they measure and write JSON (+ a PNG chart) under bench-results/.
bench:
	$(BIN)/python -m speccompile.cli bench --model SmolLM2-135M-Instruct --quantization q4f32_1 \
		--speculative-mode ngram --per-category 3 --max-tokens 128 --json bench-results/smollm2-ngram.json

# Train our draft heads by self-distillation (speccompile/heads.py), resumable: rerun to continue.
# MODEL=Qwen2.5-Coder-1.5B-Instruct (default): the EAGLE-3 pipeline (prompts, answers with features,
# training-time test, then Medusa on the same answers), days of CPU in all; MODEL=SmolLM2-135M-Instruct:
# its EAGLE-1 and Medusa heads.
# Data and checkpoints in ~/.cache/speccompile/train; the prompts and the answers' token ids also in
# heads/data/<model>-<quant>/ (commit it: a machine with an empty cache rebuilds the features from it);
# heads land in heads/. Prompts and answers alternate in rounds of PROMPT_BLOCK prompts.
heads:
	MODEL=$(MODEL) QUANT=$(QUANT) TRAIN_PROMPTS=$(TRAIN_PROMPTS) HELD_OUT_PROMPTS=$(HELD_OUT_PROMPTS) \
		nice -n 10 $(BIN)/python -m speccompile.heads

# Draft-head training data, stage 1: the prompt set (speccompile/train_prompts.py) -- written families plus
# Magpie user turns sampled from the target, filtered, with a held-out set -- into
# $SPECCOMPILE_CACHE/train/<model>-<quant>-eagle3/prompts/. Hours on 2 cores; resumable: rerun to continue.
# For `make heads MODEL=...` to call first. TRAIN_PROMPTS / HELD_OUT_PROMPTS change the targets.
MODEL ?= Qwen2.5-Coder-1.5B-Instruct
QUANT ?= q4f32_1
TRAIN_PROMPTS ?= 20000
HELD_OUT_PROMPTS ?= 500
.PHONY: head-prompts
head-prompts:
	nice -n 19 $(BIN)/python -m speccompile.cli train-prompts --model $(MODEL) --quantization $(QUANT) \
		--num-prompts $(TRAIN_PROMPTS) --held-out $(HELD_OUT_PROMPTS) --data-dir heads/data/$(MODEL)-$(QUANT)

# The C API for embedding (runtime/capi): libspeccompile_capi.so + build/capi/spc_generate,
# built with CMake against the TVM runtime in the venv's wheel.
.PHONY: capi
capi:
	cmake -S runtime/capi -B build/capi -DPython_EXECUTABLE=$(abspath $(BIN)/python)
	cmake --build build/capi -j2

clean:
	rm -rf build *.egg-info .pytest_cache
