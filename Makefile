# Two commands on a fresh machine: `make install`, then `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test test-durations test-fast demo bench heads clean opencl opencl-system vulkan vulkan-system docs

install: opencl-system vulkan-system arm-system
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,vulkan]'
	$(MAKE) opencl vulkan capi-tests capi-payload
	$(MAKE) capi HOST=aarch64-linux-gnu >/dev/null
	@echo "built build/capi-aarch64-linux-gnu (the C API for aarch64, run under qemu-aarch64 by make test)"
	@echo "installed into $(VENV)/ -- run 'make test'"

# `make test` runs the OpenCL and Vulkan tests on the CPU devices `make install` sets up (PoCL,
# lavapipe), and aarch64 builds under qemu-aarch64 with the cross-built C API: they fail, not skip,
# when one is missing (SPECCOMPILE_REQUIRE_OPENCL=1, _VULKAN=1, _ARM=1). One worker per CPU, a test file per worker
# at a time (its module fixtures built once), longest file first by tests/durations.json (xdist would
# otherwise reorder files by their number of tests); tests/conftest.py gives each worker its share of cores.
# A test still running after 15 minutes (the slowest file takes about 5) has its worker's stacks
# printed and the worker ended, so a hang fails that test instead of the whole run.
PYTEST_RUN := SPECCOMPILE_REQUIRE_OPENCL=1 SPECCOMPILE_REQUIRE_VULKAN=1 SPECCOMPILE_REQUIRE_ARM=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --timeout=900 --timeout-method=thread
test:
	$(PYTEST_RUN) --durations=15

# `make test`, then (when every test passed) each file's measured seconds into tests/durations.json,
# the order the next runs hand files out in: rerun after adding or much changing slow tests.
test-durations:
	SPECCOMPILE_RECORD_DURATIONS=1 $(PYTEST_RUN) --durations=15

# The system pieces OpenCL libraries need to build and run here: the OpenCL ICD loader and headers
# (to build our OpenCL runtime) and PoCL, a CPU OpenCL device, for the tests. Debian/Ubuntu via apt
# (as root, or with sudo); elsewhere, install the equivalents and rerun.
OPENCL_PACKAGES := ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
opencl-system:
	@if [ -e /usr/include/CL/cl.h ] && ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 \
	    && ldconfig -p | grep -q 'libOpenCL.so '; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
	  echo "install an OpenCL ICD loader + headers and an OpenCL driver (PoCL for a CPU device), then rerun"; exit 1; fi; \
	SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	echo "apt-get install $(OPENCL_PACKAGES)"; \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(OPENCL_PACKAGES) >/dev/null \
	  || { $$SUDO apt-get update -q >/dev/null && \
	       DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(OPENCL_PACKAGES) >/dev/null; }

# speccompile's OpenCL device runtime (runtime/opencl) -> build/opencl/libspeccompile_opencl.so,
# built against the venv's TVM runtime; runtime/device_runtime.py and the C API load it.
opencl:
	cmake -S runtime/opencl -B build/opencl -DPython_EXECUTABLE=$(abspath $(BIN)/python) >/dev/null
	cmake --build build/opencl -j2 >/dev/null
	@echo "built build/opencl/libspeccompile_opencl.so"

# The system pieces Vulkan libraries need to build and run here: the Vulkan loader and headers (to
# build our Vulkan runtime) and Mesa's lavapipe, a CPU Vulkan device, for the tests.
VULKAN_PACKAGES := libvulkan-dev mesa-vulkan-drivers
vulkan-system:
	@if [ -e /usr/include/vulkan/vulkan.h ] && ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 \
	    && ldconfig -p | grep -q 'libvulkan.so.1 '; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
	  echo "install the Vulkan loader + headers and a Vulkan driver (Mesa lavapipe for a CPU device), then rerun"; exit 1; fi; \
	SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	echo "apt-get install $(VULKAN_PACKAGES)"; \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(VULKAN_PACKAGES) >/dev/null \
	  || { $$SUDO apt-get update -q >/dev/null && \
	       DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(VULKAN_PACKAGES) >/dev/null; }

# speccompile's Vulkan device runtime (runtime/vulkan) -> build/vulkan/libspeccompile_vulkan.so.
vulkan:
	cmake -S runtime/vulkan -B build/vulkan -DPython_EXECUTABLE=$(abspath $(BIN)/python) >/dev/null
	cmake --build build/vulkan -j2 >/dev/null
	@echo "built build/vulkan/libspeccompile_vulkan.so"

# The unit tier alone (no TVM build, no model; tests/conftest.py gives each test its tier).
test-fast:
	$(BIN)/python -m pytest -q -m unit

demo:
	$(BIN)/python -m speccompile.cli.demo

# The documentation site (mkdocs.yml, docs/): docs/results.md is generated from bench/results/*.json,
# then MkDocs builds the site into build/docs/ (strict: any warning, e.g. a broken link, fails).
docs:
	$(BIN)/python docs/gen_results.py && $(BIN)/mkdocs build --strict -d build/docs

# Benchmarks are not tests: they measure and write JSON (+ a PNG chart) under bench-results/.
bench:
	$(BIN)/python -m speccompile.cli bench --model SmolLM2-135M-Instruct --quantization q4f32_1 \
		--speculative-mode ngram --per-category 3 --max-tokens 128 --json bench-results/smollm2-ngram.json

# Train our draft heads by self-distillation (speccompile/training/heads.py), resumable: rerun to continue.
# MODEL=Qwen2.5-Coder-1.5B-Instruct (default): the EAGLE-3 pipeline (prompts, answers with features,
# training-time test, then Medusa on the same answers), days of CPU in all; MODEL=SmolLM2-135M-Instruct:
# its EAGLE-1 and Medusa heads.
# Data and checkpoints in ~/.cache/speccompile/train; the prompts and the answers' token ids also in
# heads/data/<model>-<quant>/ (commit it: a machine with an empty cache rebuilds the features from it);
# heads land in heads/. `speccompile train-heads --help` lists the settings; HEADS_ARGS passes more of them.
heads:
	nice -n 10 $(BIN)/speccompile train-heads --model $(MODEL) --quantization $(QUANT) \
		--train-prompts $(TRAIN_PROMPTS) --held-out-prompts $(HELD_OUT_PROMPTS) $(HEADS_ARGS)

# Draft-head training data, stage 1: the prompt set (speccompile/training/prompt_set.py) -- written families plus
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

# The C API for embedding (runtime/capi): libspeccompile_capi.so + build/capi/spc_generate and spc_chat,
# built with CMake against the TVM runtime in the venv's wheel. `make capi HOST=<triple>`: a cross build
# (capi-cross below). Only a HOST given on the command line counts: some shells export HOST=<hostname>.
ifeq ($(origin HOST),environment)
HOST :=
endif
.PHONY: capi
capi:
ifeq ($(HOST),)
	cmake -S runtime/capi -B build/capi -DPython_EXECUTABLE=$(abspath $(BIN)/python)
	cmake --build build/capi -j2
else
	$(MAKE) capi-cross HOST=$(HOST)
endif

# The C API as the tests build it (tests/conftest.py capi_build: build/capi-tests), built at install so
# that `make test` spends its minutes testing (the fixture's own build is then a no-op).
.PHONY: capi-tests
capi-tests:
	cmake -S runtime/capi -B build/capi-tests -DPython_EXECUTABLE=$(abspath $(BIN)/python) >/dev/null
	cmake --build build/capi-tests -j2 >/dev/null
	@echo "built build/capi-tests (the C API for make test)"

# The C API as a GPU payload carries it (a stripped Release install, speccompile/gpu_check/capi.py), cached
# in build/gpu-work/: built at install for the same reason (the GPU check's dry-run test uses it).
.PHONY: capi-payload
capi-payload:
	$(BIN)/python -c "from pathlib import Path; from speccompile.gpu_check.capi import build_capi; \
		print('built', build_capi(Path('build/gpu-work')), '(the C API a GPU payload carries)')"

# ---- The C API for ARM Linux boards (Raspberry Pi, Jetson): `make capi HOST=aarch64-linux-gnu` ----
# Cross-compiled here with Debian's aarch64 gcc (`make arm-system` installs it and qemu-user) against
# the TVM runtime of the aarch64 wheels of exactly the apache-tvm / apache-tvm-ffi versions in the venv
# (downloaded once into build/wheels/<triple>/, the runtime libraries and tvm-ffi headers unpacked
# into its root/: runtime/capi/tools/fetch_tvm_runtime.py), configured with
# runtime/capi/cmake/aarch64-linux-gnu.cmake. Output: build/capi-<triple>/ with libspeccompile_capi.so,
# spc_generate, spc_chat, spc_policy_replay, spc_forward_logits and copies of libtvm_runtime.so and
# libtvm_ffi.so, found through $ORIGIN: copy the folder to the board. Run here with
# `qemu-aarch64 -L /usr/aarch64-linux-gnu build/capi-aarch64-linux-gnu/spc_generate ...` (runtime/capi/README.md).
# runtime/capi/cmake/<triple>.cmake where there is one, else the aarch64 file with the triple swapped
CROSS_TOOLCHAIN = $(or $(wildcard runtime/capi/cmake/$(HOST).cmake),runtime/capi/cmake/aarch64-linux-gnu.cmake)
.PHONY: capi-cross arm-system
capi-cross:
	@test -n "$(HOST)" || { echo "usage: make capi HOST=aarch64-linux-gnu"; exit 1; }
	@command -v $(HOST)-g++ >/dev/null || { echo "no $(HOST)-g++: run 'make arm-system' (or install a cross compiler for $(HOST))"; exit 1; }
	@roots=$$($(BIN)/python runtime/capi/tools/fetch_tvm_runtime.py $(HOST) build/wheels/$(HOST)) || exit 1; \
	cmd="cmake -S runtime/capi -B build/capi-$(HOST) -DCMAKE_TOOLCHAIN_FILE=$(abspath $(CROSS_TOOLCHAIN)) \
	  -DSPC_CROSS_TRIPLE=$(HOST) $$roots"; echo $$cmd; $$cmd
	cmake --build build/capi-$(HOST) -j2

# The cross compiler and the emulator for `make capi HOST=aarch64-linux-gnu` and for running its programs
# here. Debian/Ubuntu via apt (as root, or with sudo).
ARM_PACKAGES := g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
arm-system:
	@if command -v aarch64-linux-gnu-g++ >/dev/null && [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] \
	    && command -v qemu-aarch64 >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
	  echo "install an aarch64-linux-gnu cross g++ with its libc, and qemu-user (qemu-aarch64), then rerun"; exit 1; fi; \
	SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	echo "apt-get install $(ARM_PACKAGES)"; \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(ARM_PACKAGES) >/dev/null \
	  || { $$SUDO apt-get update -q >/dev/null && \
	       DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(ARM_PACKAGES) >/dev/null; }

clean:
	rm -rf build *.egg-info .pytest_cache

# ---- The GPU check (issue 32 part 3): prepared here, run on the GPU machine (../shared/GPU.md) ----
# `make gpu-payload` (here; nvcc compiles the fatbins ahead of time; ~10 min the first time, then cached in
# build/gpu-work/) writes build/gpu-payload/part1..N: TVM's runtime without its compiler, the cp312 tvm-ffi
# wheel, a speccompile wheel, libraries for sm_90, SmolLM2 q4f16_1 weights + EAGLE/Medusa heads, the
# Qwen2.5-1.5B/-0.5B shapes (configs; their random weights are made there). Each part is sized to travel
# beside the working tree (the device tool sends at most 64 MiB per call; GPU_TREE_MIB=N sizes them for a
# tree of N MiB instead of today's). It prints the device-tool calls, to run back to back (the machine
# keeps /tmp only ~30 s after a call), e.g. for two parts:
#   run(command="python3 -m speccompile.gpu_check.payload stage build/gpu-payload/part1", carry=["build/gpu-payload/part1"], timeout_s=120)
#   run(command="PYTHONUNBUFFERED=1 python3 -m speccompile.gpu_check.payload run build/gpu-payload/part2 --out $OUT", carry=["build/gpu-payload/part2"], timeout_s=600)
# The last call is `make gpu-check` there: it joins the parts, installs them under /tmp and runs
# speccompile/gpu_check/check.py (<= 8 min), writing gpu-check-<gpu>-<date>.json/.png/.log into $OUT.
# `make gpu-check DEVICE=cpu` here: the same check as a dry run on tiny models (build/gpu-check-cpu/).
# The device tool sends the tracked tree with every call (at most 64 MiB); heads/ (90 MB of trained heads,
# none of them needed there: the payload carries SmolLM2's converted heads) would not fit. `make gpu-park`
# takes heads/ out of the index (files stay on disk, ignored through .git/info/exclude) for the device
# calls; `make gpu-unpark` puts it back. Nothing is committed or deleted either way.
GPU_PARK := heads
.PHONY: gpu-park gpu-unpark
gpu-park:
	git rm -r -q --cached $(GPU_PARK)
	@for p in $(GPU_PARK); do grep -qx "/$$p/" .git/info/exclude 2>/dev/null || echo "/$$p/" >> .git/info/exclude; done
	@echo "parked $(GPU_PARK) (run 'make gpu-unpark' after the device calls); tracked tree now $$(git ls-files -z | du -ch --files0-from=- 2>/dev/null | tail -1 | cut -f1)"

gpu-unpark:
	@for p in $(GPU_PARK); do sed -i "\|^/$$p/$$|d" .git/info/exclude; done
	git reset -q -- $(GPU_PARK)
	@git status --short -- $(GPU_PARK) | head -3

GPU_TREE_MIB ?=
DEVICE ?= cuda
.PHONY: gpu-payload gpu-check
gpu-payload:
	$(BIN)/python -m speccompile.gpu_check.models --device cuda $(if $(GPU_TREE_MIB),--assume-tree-mib $(GPU_TREE_MIB))

gpu-check:
ifeq ($(DEVICE),cpu)
	$(BIN)/python -m speccompile.gpu_check.models --device cpu
	$(BIN)/python -m speccompile.gpu_check.payload run build/gpu-payload-cpu/part* --staging build/gpu-check-cpu/staging \
		--install build/gpu-check-cpu/install --out build/gpu-check-cpu
else
	PYTHONUNBUFFERED=1 python3 -m speccompile.gpu_check.payload run $(lastword $(sort $(wildcard build/gpu-payload/part*)))
endif
