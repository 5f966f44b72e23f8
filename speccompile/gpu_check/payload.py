"""``make gpu-payload`` / ``make gpu-check``: what a GPU machine without TVM needs, built here.

Why. The GPU machine (shared/GPU.md) has torch and transformers but no TVM, no package
registry and no internet; one command there receives at most 64 MiB of files -- the working
tree that travels included -- and files written outside the tree survive to the next
command only while the machine stays warm (about 30 s idle). So everything the check runs
is built here, once:

- TVM's runtime: the wheel's ``tvm`` package (py3-none: no cp311 extension in it) without
  its 250 MB compiler library, ``3rdparty``, ``src`` and ``include``; the cp312
  ``apache-tvm-ffi`` wheel; a wheel of speccompile itself (the code measured);
- the model libraries, compiled ahead of time for sm_90 with the nvcc here (the fatbin needs
  no compiler there): SmolLM2-135M q4f16_1 with its real converted weights and its EAGLE
  and Medusa heads, and the Qwen2.5-1.5B / -0.5B shapes as configs only -- their weights
  are made there from a transformers random init and converted there by our converter
  (``convert_weight --layout-from``, which needs no TVM compiler).

All of it is one gzip tar split into chunks, each small enough to travel beside the working
tree; part k is the folder ``partk/`` (its chunk plus the manifest). Call k < N stages its
chunk in /tmp/spc-payload; call N stages the last, joins and checks them, installs, and runs
speccompile/gpu_check/check.py. The runner half of this module (``stage``, ``run``) uses the
standard library alone: it runs from the repository copy before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

DEVICE_LIMIT = 64 << 20  # the device tool's cap on one call: working tree + carried paths
MARGIN = 2 << 20  # files that change between this build and the call
MAX_PART = 56 << 20  # no chunk above this, whatever room the tree leaves
MIN_PART = 4 << 20  # below this the payload would need too many back-to-back calls
STAGING = "/tmp/spc-payload"  # where chunks wait on the GPU machine between calls
INSTALL = "/tmp/spc-install"
CHUNK = "payload.tgz."
MANIFEST = "manifest.json"
REPO = Path(__file__).resolve().parents[2]


class PayloadError(RuntimeError):
    """A payload that cannot be built, does not fit, or is incomplete where it runs."""


# ------------------------------------------------------------------ size accounting
def traveling_tree_bytes(root: Path = REPO) -> int:
    """Bytes the device tool sends from the checkout besides carried paths: tracked files and
    untracked files git does not ignore (links count as links), plus ``shared/`` if any."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        path = root / name
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size
    shared = root / "shared"
    if shared.is_dir():
        total += sum(p.lstat().st_size for p in shared.rglob("*") if p.is_file() or p.is_symlink())
    return total


def largest_tracked_folders(root: Path = REPO, top: int = 4) -> list[tuple[str, int]]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    sizes: dict[str, int] = {}
    for name in filter(None, out.decode().split("\0")):
        path = root / name
        if path.is_file():
            key = "/".join(name.split("/")[:2]) if name.count("/") >= 1 else name
            sizes[key] = sizes.get(key, 0) + path.lstat().st_size
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


def part_budget(tree_bytes: int, limit: int = DEVICE_LIMIT, margin: int = MARGIN, max_part: int = MAX_PART) -> int:
    """The most bytes one part may hold so that it travels beside a tree of ``tree_bytes``."""
    room = limit - tree_bytes - margin
    if room < MIN_PART:
        raise PayloadError(
            f"the working tree that travels with every device call is {tree_bytes / 2**20:.1f} MiB; with the "
            f"device tool's {limit / 2**20:.0f} MiB per call that leaves {max(room, 0) / 2**20:.1f} MiB for the "
            f"payload (at least {MIN_PART / 2**20:.0f} MiB needed): keep large files out of the tree (a nested "
            "repository or an ignored folder travels only when carried), or build with --assume-tree-mib to size "
            "the parts for the tree as it will be")
    return min(room, max_part)


def check_parts(part_bytes: list[int], tree_bytes: int, limit: int = DEVICE_LIMIT, margin: int = MARGIN) -> None:
    """Refuse any part that, carried beside the tree, would exceed one call's limit."""
    for i, size in enumerate(part_bytes, 1):
        if size + tree_bytes + margin > limit:
            raise PayloadError(f"part {i} is {size / 2**20:.1f} MiB: with the {tree_bytes / 2**20:.1f} MiB tree "
                               f"it exceeds the device tool's {limit / 2**20:.0f} MiB per call "
                               f"(less a {margin / 2**20:.0f} MiB margin)")


def split_file(blob: Path, out_dir: Path, budget: int, build: dict) -> list[Path]:
    """Cut ``blob`` into chunks of at most ``budget`` bytes, one per ``out_dir/partK``, each part
    with the manifest naming every chunk (size, sha256): the last call checks them all."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    size = blob.stat().st_size
    n = max(1, -(-size // budget))
    step = -(-size // n)  # even chunks: no tiny last part
    chunks, parts = [], []
    with blob.open("rb") as f:
        for k in range(1, n + 1):
            data = f.read(step)
            part = out_dir / f"part{k}"
            part.mkdir(parents=True)
            name = f"{CHUNK}{k:03d}"
            (part / name).write_bytes(data)
            chunks.append({"name": name, "part": k, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            parts.append(part)
    manifest = {"format": 1, "parts": n, "chunks": chunks, "total_bytes": size, "build": build}
    for part in parts:
        (part / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return parts


# --------------------------------------------------------------------- on the machine
def stage(part: Path, staging: Path = Path(STAGING)) -> dict:
    """Copy one part's chunk and manifest into the staging folder (kept for the next call)."""
    manifest = json.loads((part / MANIFEST).read_text())
    staging.mkdir(parents=True, exist_ok=True)
    for f in part.iterdir():
        if f.name.startswith(CHUNK):
            shutil.copyfile(f, staging / f.name)
    shutil.copyfile(part / MANIFEST, staging / MANIFEST)
    have = sorted(f.name for f in staging.iterdir() if f.name.startswith(CHUNK))
    print(f"staged {part} in {staging}: {', '.join(have)} of {manifest['parts']} chunk(s)", flush=True)
    return manifest


def join(staging: Path, manifest: dict, into: Path) -> Path:
    """Check every chunk the manifest names is staged, intact and of this build; extract."""
    missing, bad = [], []
    for c in manifest["chunks"]:
        path = staging / c["name"]
        if not path.exists():
            missing.append(c)
        elif path.stat().st_size != c["bytes"] or hashlib.sha256(path.read_bytes()).hexdigest() != c["sha256"]:
            bad.append(c)
    if missing or bad:
        what = ", ".join(f"part {c['part']}" for c in missing + bad)
        raise PayloadError(
            f"{staging} lacks {what} of this payload ({'missing' if missing else 'from another build'}): the "
            "machine was given back between the calls (it keeps /tmp about 30 s after a call), or a part was not "
            f"staged. Run the calls for parts 1..{manifest['parts'] - 1} again, each right after the other, "
            "then this one")
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    blob = into / "payload.tgz"
    with blob.open("wb") as out:
        for c in manifest["chunks"]:
            with (staging / c["name"]).open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    with tarfile.open(blob) as tar:
        tar.extractall(into, filter="data")
    blob.unlink()
    return into / "payload"


def install_wheels(payload: Path, site: Path) -> None:
    """pip --target the payload's wheels (no index, no deps), or unpack them if pip refuses."""
    wheels = sorted(str(w) for w in (payload / "wheels").glob("*.whl"))
    if not wheels:
        return
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site), *wheels]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"pip install --target failed ({done.stderr.strip()[-300:]}); unpacking the wheels instead", flush=True)
        for w in wheels:
            with zipfile.ZipFile(w) as zf:
                zf.extractall(site)


def run(parts: list[Path], out: Path, staging: Path, install: Path, check_args: list[str]) -> int:
    """Stage the given parts, join all staged chunks, install, run gpu_check; its exit code."""
    t0 = time.time()
    staging, install = staging.resolve(), install.resolve()
    manifest = None
    for part in parts:
        manifest = stage(part, staging)
    payload = join(staging, manifest, install)
    site = install / "site"
    install_wheels(payload, site)
    env = dict(os.environ)
    paths = [str(site), str(payload / "python")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    print(f"installed the payload in {install} ({time.time() - t0:.1f} s)", flush=True)
    cmd = [sys.executable, "-m", "speccompile.gpu_check.check", "--payload", str(payload), "--out", str(out), *check_args]
    # cwd: not the repository, whose speccompile/ folder (no runtime/ inside) would shadow the wheel
    return subprocess.run(cmd, env=env, cwd=install).returncode


def device_commands(parts: list[Path], root: Path = REPO, timeout_s: int = 600) -> list[str]:
    """The device-tool calls that run the check, in order (printed by ``build``)."""
    rel = [str(p.resolve().relative_to(root)) for p in parts]
    calls = [f'run(command="python3 -m speccompile.gpu_check.payload stage {r}", carry=["{r}"], timeout_s=120)'
             for r in rel[:-1]]
    calls.append(f'run(command="PYTHONUNBUFFERED=1 python3 -m speccompile.gpu_check.payload run {rel[-1]} --out $OUT", '
                 f'carry=["{rel[-1]}"], timeout_s={timeout_s})')
    return calls


# ------------------------------------------------------------------------ building
def git_state(root: Path = REPO) -> dict:
    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status)}


def add_tvm_runtime(tar: tarfile.TarFile) -> int:
    """TVM's Python package without its compiler library and build sources, as python/tvm."""
    import importlib.util

    src = Path(importlib.util.find_spec("tvm").origin).parent
    skip_dirs = {"3rdparty", "src", "include", "__pycache__"}
    total = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if skip_dirs & set(rel.parts) or path.suffix == ".pyc" or rel.as_posix() == "lib/libtvm_compiler.so":
            continue
        if path.is_file():
            tar.add(path, f"payload/python/tvm/{rel.as_posix()}", recursive=False)
            total += path.stat().st_size
    return total


def build_wheel(work: Path) -> Path:
    """A wheel of speccompile from this checkout (pure Python; offline: no build isolation)."""
    out = work / "wheel"
    if out.exists():
        shutil.rmtree(out)
    build = REPO / "build"
    before = {d.name for d in build.iterdir()} if build.exists() else set()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(REPO)], check=True)
    for d in build.iterdir():  # setuptools' scratch folders, when this build made them
        if d.name not in before and (d.name == "lib" or d.name.startswith("bdist.")):
            shutil.rmtree(d, ignore_errors=True)
    return next(out.glob("speccompile-*.whl"))


def tvm_ffi_wheel(work: Path) -> Path:
    """The cp312 manylinux apache-tvm-ffi wheel matching this venv's tvm-ffi, downloaded once."""
    from importlib.metadata import version

    ver = version("apache-tvm-ffi")
    dest = work / "wheels"
    found = sorted(dest.glob(f"apache_tvm_ffi-{ver}-cp312-*.whl"))
    if found:
        return found[0]
    plats = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)] + ["manylinux2014_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *sum((["--platform", p] for p in plats), []), "-d", str(dest),
           f"apache-tvm-ffi=={ver}"]
    subprocess.run(cmd, check=True)
    return sorted(dest.glob(f"apache_tvm_ffi-{ver}-cp312-*.whl"))[0]


def assemble(out_dir: Path, work: Path, models: list[dict], wheels: list[Path], device: str, quantization: str,
             tree_bytes: int, extra: dict | None = None, capi: Path | None = None,
             files: dict[str, Path] | None = None) -> list[Path]:
    """Tar the payload (TVM runtime, wheels, each model's folder and library, the C API) and split it.

    ``models``: {"name", "weights": "real"|"random", "dir", "lib", "heads": {mode: {"dir", "lib", "alt_libs"}},
    "alt_libs": {name: lib}} with local paths (``alt_libs``: the same model or head built another way,
    e.g. with portable projections); the payload's models.json names them by their place inside it.
    ``capi``: the install prefix speccompile.gpu_check.capi.build_capi made (None: the payload has
    no C API). ``files``: more files by their name inside the payload (the kernel bench)."""
    budget = part_budget(tree_bytes)
    work.mkdir(parents=True, exist_ok=True)
    blob = work / "payload.tgz"
    listing = []
    t0 = time.time()
    with tarfile.open(blob, "w:gz", compresslevel=6) as tar:
        tvm_bytes = add_tvm_runtime(tar)
        for w in wheels:
            tar.add(w, f"payload/wheels/{w.name}")
        for m in models:
            slug = m["name"].lower()
            entry = {k: v for k, v in m.items() if k not in ("dir", "lib", "heads", "alt_libs")}
            entry.update(dir=f"models/{slug}", lib=f"models/{slug}.so", heads={}, alt_libs={})
            tar.add(m["dir"], f"payload/{entry['dir']}", filter=_no_caches)
            tar.add(m["lib"], f"payload/{entry['lib']}")
            for alt, lib in (m.get("alt_libs") or {}).items():
                entry["alt_libs"][alt] = f"models/{slug}-{alt}.so"
                tar.add(lib, f"payload/{entry['alt_libs'][alt]}")
            for mode, head in (m.get("heads") or {}).items():
                hslug = f"{slug}-{mode}"
                entry["heads"][mode] = {"dir": f"models/{hslug}", "lib": f"models/{hslug}.so", "alt_libs": {},
                                        "mode": head.get("mode", mode)}
                tar.add(head["dir"], f"payload/models/{hslug}", filter=_no_caches)
                tar.add(head["lib"], f"payload/models/{hslug}.so")
                for alt, lib in (head.get("alt_libs") or {}).items():
                    entry["heads"][mode]["alt_libs"][alt] = f"models/{hslug}-{alt}.so"
                    tar.add(lib, f"payload/models/{hslug}-{alt}.so")
            listing.append(entry)
        for name, path in (files or {}).items():
            tar.add(path, f"payload/{name}")
        capi_info = None
        if capi is not None:
            from speccompile.gpu_check.capi import add_to_tar

            capi_info = add_to_tar(tar, capi)
        info = {"device": device, "quantization": quantization, "models": listing, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                **git_state(), "tvm_runtime_bytes": tvm_bytes, "wheels": [w.name for w in wheels], "capi": capi_info,
                "files": sorted(files or {}),
                **(extra or {})}
        _add_bytes(tar, "payload/payload.json", json.dumps(info, indent=1).encode())
    parts = split_file(blob, out_dir, budget, {k: info[k] for k in ("device", "commit", "dirty", "built")})
    check_parts([sum(f.stat().st_size for f in p.iterdir()) for p in parts], tree_bytes)
    print(f"payload: {blob.stat().st_size / 2**20:.1f} MiB compressed in {time.time() - t0:.0f} s, "
          f"{len(parts)} part(s) of at most {budget / 2**20:.1f} MiB beside a {tree_bytes / 2**20:.1f} MiB tree")
    blob.unlink()
    return parts


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name else info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speccompile.gpu_check.payload", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="on the GPU machine: keep one part in the staging folder for the last call")
    s.add_argument("part", type=Path)
    s.add_argument("--staging", type=Path, default=Path(STAGING))
    r = sub.add_parser("run", help="stage these parts, join all staged chunks, install and run the check")
    r.add_argument("parts", type=Path, nargs="+")
    r.add_argument("--out", type=Path, default=None, help="results folder (default $OUT, else bench/results)")
    r.add_argument("--staging", type=Path, default=Path(STAGING))
    r.add_argument("--install", type=Path, default=Path(INSTALL))
    r.add_argument("--check-args", default="", help='more options for speccompile.gpu_check.check, e.g. "--budget-s 300"')
    args = ap.parse_args(argv)
    try:
        if args.cmd == "stage":
            stage(args.part, args.staging)
            return 0
        out = args.out or Path(os.environ.get("OUT") or REPO / "bench" / "results")
        import shlex

        return run(args.parts, out.resolve(), args.staging, args.install, shlex.split(args.check_args))
    except PayloadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":  # run the imported module's main: one PayloadError class, whoever raises it
    from speccompile.gpu_check.payload import main as _main

    sys.exit(_main())
