"""Shared fixtures: tiny random-weight checkpoints built end to end, and the real SmolLM2;
and the test tiers (pyproject.toml's markers), given to each test from what it uses."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from speccompile.models.config import PRESETS
from speccompile.runtime.threads import configure_threads


def pytest_configure(config):
    """The test session is one of our entry points: kernel tests run TVM kernels before any
    model is loaded, and TVM's thread pool reads its size once (runtime/threads.py). Under
    ``pytest -n N`` (``make test``) each of the N workers gets its share of the cores for TVM
    and for torch: N pools as wide as the machine would spin against each other (SmolLM2's
    transformers references ran 4-5x slower so)."""
    import os

    from speccompile.runtime.threads import physical_cores, user_threads

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and user_threads() is None:
        share = str(max(1, physical_cores() // workers))
        # torch's OpenMP pool too (the transformers references): both spin while they wait
        os.environ["TVM_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = share
    configure_threads()


REAL_MODEL_FIXTURES = {"smollm2", "smollm2_q4", "random_draft", "smollm2_heads"}
HEADS = Path(__file__).resolve().parents[1] / "heads"  # the trained draft heads (`make heads`)
TIERS = ("unit", "tiny", "real_model", "opencl", "gpu")
# A file's seconds when tests/durations.json has no entry for it: rough seconds per test of its tier
TIER_WEIGHT = {"unit": 0.1, "tiny": 3.0, "gpu": 5.0, "opencl": 8.0, "real_model": 10.0}
DURATIONS = Path(__file__).parent / "durations.json"  # measured seconds per test file (`make test-durations`)


def pytest_collection_modifyitems(config, items):
    """One tier per test, from the fixtures it uses (transitively) and its name: real_model
    (SmolLM2), opencl (runs on the CPU OpenCL device), gpu (builds GPU artifacts), tiny (builds
    a tiny model), else unit. A module may state its tier (``pytestmark``) where it builds
    models inline; a unit test that builds or fetches one fails (``unit_builds_nothing``)."""
    for item in items:
        given = [m.name for m in item.iter_markers() if m.name in TIERS]
        words = item.nodeid.lower()
        if given:
            tier = given[0]
        elif REAL_MODEL_FIXTURES & set(item.fixturenames):
            tier = "real_model"
        elif "opencl" in words:
            tier = "opencl"
        elif any(w in words for w in ("cuda", "metal", "gpu", "iphone", "android")):
            tier = "gpu"
        elif "build_tiny" in item.fixturenames:
            tier = "tiny"
        else:
            tier = "unit"
        if not given:
            item.add_marker(tier)
    seconds = file_seconds(items)
    items.sort(key=lambda item: -seconds[_file_key(item)])  # stable: a file's own order is kept


def _file_key(item) -> str:
    return item.nodeid.split("::", 1)[0]  # tests/runtime/test_engine.py


def file_seconds(items) -> dict[str, float]:
    """Seconds each test file takes, longest first being the order `make test` hands whole files
    to its workers (``--dist loadfile --no-loadscope-reorder``): a long file started last keeps
    one worker busy while the others idle. Measured seconds from tests/durations.json; a file
    it lacks (new, or renamed) is guessed from its tests' tiers."""
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    guess: dict[str, float] = {}
    for item in items:
        tier = next(m.name for m in item.iter_markers() if m.name in TIERS)
        guess[_file_key(item)] = guess.get(_file_key(item), 0.0) + TIER_WEIGHT[tier]
    return {f: measured.get(f, g) for f, g in guess.items()}


_RECORDED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown seconds, summed per file (module fixtures count in
    their file's first setup); under xdist the controller sees every worker's reports."""
    path = report.nodeid.split("::", 1)[0]
    _RECORDED[path] = _RECORDED.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """``SPECCOMPILE_RECORD_DURATIONS=1`` (``make test-durations``): after a run with no failure,
    write the measured seconds per file into tests/durations.json for the next runs' order."""
    import os

    if os.environ.get("SPECCOMPILE_RECORD_DURATIONS") != "1" or exitstatus != 0 or \
            hasattr(session.config, "workerinput"):
        return
    DURATIONS.write_text(json.dumps({f: round(s, 1) for f, s in
                                     sorted(_RECORDED.items(), key=lambda kv: -kv[1])}, indent=1) + "\n")


@pytest.fixture(autouse=True)
def unit_builds_nothing(request, monkeypatch):
    """The unit tier's promise, kept: no TVM build and no real model in a unit test."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} is in the unit tier but builds or fetches a model: give its "
                             "module `pytestmark = pytest.mark.tiny` (or real_model)")

    from speccompile.compiler import compile as compiler, fetch

    monkeypatch.setattr(compiler, "compile_model", refuse)
    monkeypatch.setattr(fetch, "prepare", refuse)
    monkeypatch.setattr(fetch, "fetch", refuse)


def device_missing(kind: str) -> str | None:
    """Why the OpenCL or Vulkan tests cannot run here, or None when a device is there. Under
    ``make test`` (SPECCOMPILE_REQUIRE_OPENCL=1 / _VULKAN=1, where make install set PoCL and
    lavapipe up) a missing runtime or device is an error, not a skip."""
    import os

    from speccompile.runtime import device_runtime

    name, driver = {"opencl": ("OpenCL", "PoCL gives a CPU one: apt-get install pocl-opencl-icd"),
                    "vulkan": ("Vulkan", "Mesa's lavapipe gives a CPU one: apt-get install mesa-vulkan-drivers")}[kind]
    try:
        why = None if getattr(device_runtime, f"{kind}_device_names")() else f"no {name} device on this machine ({driver})"
    except RuntimeError as err:  # DeviceRuntimeError, or the runtime's own
        why = f"no {name} runtime to test with: {err}"
    variable = f"SPECCOMPILE_REQUIRE_{kind.upper()}"
    if why and os.environ.get(variable) == "1":
        raise RuntimeError(f"{variable}=1 but the {name} tests cannot run: {why}")
    return why


def fixed_costs():
    """A context in which engines take a fixed cost profile instead of timing forwards of 1-32
    rows at load: for modules whose tests fix the draft length (what forwards cost then decides
    nothing), where the timing is slow (CPU OpenCL and Vulkan devices) or repeated per engine.
    The cost model and its measurement are tested in test_adaptive.py and test_speculative.py."""
    import contextlib

    from speccompile.runtime import engine
    from speccompile.runtime.costs import CostModel, CostTable

    def fixed(*args, **kwargs):
        return CostModel(CostTable({1: 0.010, 8: 0.011, 32: 0.014}), CostTable({1: 0.001, 8: 0.008}), 0.0)

    @contextlib.contextmanager
    def patched():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "load_or_measure", fixed)
            yield

    return patched()


def opencl_missing() -> str | None:
    return device_missing("opencl")


def vulkan_missing() -> str | None:
    return device_missing("vulkan")


def make_byte_tokenizer(path: Path) -> None:
    """A 256-byte BPE tokenizer (no merges) plus chat specials: enough for tiny models."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(path))


def make_hf_checkpoint(folder: Path, preset: str, seed: int = 0, fmt: str = "safetensors",
                       vocab_size: int | None = None, tokenizer_from: Path | None = None) -> dict:
    """Random HF-layout weights for a preset; returns the float32 weights by HF name."""
    from safetensors.numpy import save_file

    p = dict(PRESETS[preset])
    if vocab_size:
        p["vocab_size"] = vocab_size
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, inter, L = p["hidden_size"], p["intermediate_size"], p["num_hidden_layers"]
    nh, nkv, v = p["num_attention_heads"], p["num_key_value_heads"], p["vocab_size"]
    hd = h // nh
    w = {"model.embed_tokens.weight": rng.standard_normal((v, h)) * 0.5, "model.norm.weight": 1 + 0.1 * rng.standard_normal(h)}
    if not p.get("tie_word_embeddings"):
        w["lm_head.weight"] = rng.standard_normal((v, h)) * 0.1
    for i in range(L):
        pre = f"model.layers.{i}."
        shapes = {"self_attn.q_proj.weight": (nh * hd, h), "self_attn.k_proj.weight": (nkv * hd, h),
                  "self_attn.v_proj.weight": (nkv * hd, h), "self_attn.o_proj.weight": (h, nh * hd),
                  "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}
        for k, s in shapes.items():
            w[pre + k] = rng.standard_normal(s) / np.sqrt(s[1])
        if p.get("attention_bias"):
            for k, s in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                w[pre + f"self_attn.{k}_proj.bias"] = 0.1 * rng.standard_normal(s)
        w[pre + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(h)
        w[pre + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(h)
    w = {k: np.asarray(a, np.float32) for k, a in w.items()}
    arch = "Qwen2ForCausalLM" if p["model_type"] == "qwen2" else "LlamaForCausalLM"
    config = {"architectures": [arch], "model_type": p["model_type"], "hidden_size": h, "intermediate_size": inter,
              "num_hidden_layers": L, "num_attention_heads": nh, "num_key_value_heads": nkv, "vocab_size": v,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": p["max_position_embeddings"],
              "tie_word_embeddings": bool(p.get("tie_word_embeddings")), "bos_token_id": 256, "eos_token_id": 257}
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        save_file(w, str(folder / "model.safetensors"))
    else:
        import torch

        torch.save({k: torch.from_numpy(a) for k, a in w.items()}, folder / "pytorch_model.bin")
    if tokenizer_from is not None:
        shutil.copy(tokenizer_from, folder / "tokenizer.json")
    else:
        make_byte_tokenizer(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")}))
    return w


class Built:
    def __init__(self, hf_dir: Path, model_dir: Path, lib: Path, weights: dict, preset: str, quant: str):
        self.hf_dir, self.model_dir, self.lib, self.weights, self.preset, self.quant = hf_dir, model_dir, lib, weights, preset, quant


@pytest.fixture(scope="session")
def build_tiny(tmp_path_factory):
    """build_tiny(preset, quant, device="llvm") -> Built, compiled once per session per combination
    (the weights and model directory are shared by every device's library)."""
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    cache: dict = {}
    root = tmp_path_factory.mktemp("tiny")

    def build(preset: str = "tiny-llama", quant: str = "q0f32", device: str = "llvm") -> Built:
        key = (preset, quant, device)
        if device != "llvm" and key not in cache:  # the same weights and model directory as the CPU build
            cpu = build(preset, quant)
            lib = root / f"{preset}-{quant}-{device}.so"
            compile_model(cpu.model_dir / "speccompile-config.json", device, lib, verbose=False)
            cache[key] = Built(cpu.hf_dir, cpu.model_dir, lib, cpu.weights, preset, quant)
        if key not in cache:
            hf = root / f"{preset}-hf"
            weights = make_hf_checkpoint(hf, preset) if not (hf / "config.json").exists() else cache[("w", preset)]
            cache[("w", preset)] = weights
            out = root / f"{preset}-{quant}"
            convert_weight(hf, quant, out, progress=False)
            gen_config(hf, quant, out)
            lib = root / f"{preset}-{quant}.so"
            compile_model(out / "speccompile-config.json", "llvm", lib, verbose=False)
            cache[key] = Built(hf, out, lib, weights, preset, quant)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def smollm2():
    """(gguf_path, model_dir, lib) for SmolLM2-135M-Instruct at q0f32, built once and cached."""
    from speccompile.compiler.fetch import fetch, prepare

    gguf = fetch("SmolLM2-135M-Instruct", quiet=True)
    model_dir, lib = prepare("SmolLM2-135M-Instruct", "q0f32", quiet=True)
    return gguf, model_dir, lib


@pytest.fixture(scope="session")
def smollm2_q4():
    from speccompile.compiler.fetch import prepare

    return prepare("SmolLM2-135M-Instruct", "q4f32_1", quiet=True)


@pytest.fixture(scope="session")
def smollm2_heads(smollm2_q4):
    """((dir, lib) of the EAGLE head, (dir, lib) of the Medusa heads): the project's trained heads
    for SmolLM2-135M (``make heads``, committed in heads/), converted with its GGUF as the target
    and compiled at q4f32_1 for this CPU -- once per suite: see :func:`cached_smollm2_heads`."""
    return cached_smollm2_heads()


def cached_smollm2_heads(quant: str = "q4f32_1") -> tuple[tuple[str, str], tuple[str, str]]:
    """The committed SmolLM2 heads built into the model cache, under a lock, keyed by what
    shapes them (the heads' files, the converter and compiler sources, this CPU): the test
    workers and the files that use them share one build (~40 s) instead of one each."""
    import hashlib

    import tvm
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.fetch import cache_root, compiler_hash, fetch, prepare_lock
    from speccompile.compiler.gen_config import gen_config

    h = hashlib.sha256(f"{compiler_hash()}|{quant}|{tvm.target.codegen.llvm_get_system_cpu()}".encode())
    compiler = Path(compile_model.__code__.co_filename).parent
    for f in sorted(compiler.glob("*.py")) + sorted(HEADS.glob("SmolLM2-135M-Instruct-*/*")):
        h.update(f.name.encode() + f.read_bytes())
    root = cache_root() / "test-heads" / f"SmolLM2-135M-Instruct-{quant}-{h.hexdigest()[:12]}"
    gguf = fetch("SmolLM2-135M-Instruct", quiet=True)
    built = []
    with prepare_lock(f"test-heads-SmolLM2-135M-Instruct-{quant}"):
        for kind in ("eagle", "medusa"):
            out = root / kind
            if not out.with_suffix(".so").exists():
                shutil.rmtree(out, ignore_errors=True)
                convert_weight(HEADS / f"SmolLM2-135M-Instruct-{kind}", quant, out, kind, progress=False, target=gguf)
                gen_config(HEADS / f"SmolLM2-135M-Instruct-{kind}", quant, out, target=gguf, model_type=kind)
                compile_model(out / "speccompile-config.json", "llvm", out.with_suffix(".tmp.so"), verbose=False)
                out.with_suffix(".tmp.so").rename(out.with_suffix(".so"))  # complete, or absent
            built.append((str(out), str(out.with_suffix(".so"))))
    return tuple(built)


@pytest.fixture(scope="session")
def random_draft(smollm2_q4, tmp_path_factory):
    """(model_dir, lib) of a 2-layer random-weight Llama with SmolLM2's vocabulary and
    tokenizer: a draft whose proposals are mostly wrong (and mostly break a grammar)."""
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    model_dir, _ = smollm2_q4
    root = tmp_path_factory.mktemp("randdraft")
    make_hf_checkpoint(root / "hf", "tiny-llama", seed=7, vocab_size=49152, tokenizer_from=model_dir / "tokenizer.json")
    convert_weight(root / "hf", "q4f32_1", root / "model", progress=False)
    gen_config(root / "hf", "q4f32_1", root / "model", conv_template="chatml")
    compile_model(root / "model" / "speccompile-config.json", "llvm", root / "draft.so", verbose=False)
    return str(root / "model"), str(root / "draft.so")


@pytest.fixture(scope="session")
def capi_build() -> Path:
    """The C API (runtime/capi) built with CMake against the venv's TVM runtime, into
    build/capi-tests/ under a lock: the xdist workers share one incremental build instead of
    each compiling it again on the same two cores."""
    import fcntl
    import subprocess
    import sys

    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: the C API is built with CMake")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler is installed")
    root = Path(__file__).resolve().parents[1]
    build = root / "build" / "capi-tests"
    build.mkdir(parents=True, exist_ok=True)
    with (build.parent / "capi-tests.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build / "CMakeCache.txt").exists():
            subprocess.run(["cmake", "-S", str(root / "runtime" / "capi"), "-B", str(build),
                            f"-DPython_EXECUTABLE={sys.executable}"], check=True, capture_output=True, text=True)
        proc = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return build
