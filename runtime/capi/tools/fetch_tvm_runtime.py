"""The TVM runtime for a cross build of the C API, taken from the Linux wheels of another CPU.

    .venv/bin/python runtime/capi/tools/fetch_tvm_runtime.py aarch64-linux-gnu build/wheels/aarch64-linux-gnu

downloads the apache-tvm and apache-tvm-ffi wheels of exactly the versions installed in the
Python running this script (the compiler that builds the model libraries: `_metadata` records
its TVM version) for that triple's CPU (`pip download --no-deps --only-binary :all:
--platform manylinux_2_28_<cpu>`), unless they are in the folder already, and unpacks the
parts the C API links and ships into <folder>/root/:

    root/tvm/lib/libtvm_runtime.so          (not the compiler, libtvm_compiler.so)
    root/tvm_ffi/lib/libtvm_ffi.so
    root/tvm_ffi/include/...                (tvm-ffi and dlpack headers)

then prints `-DTVM_ROOT=<folder>/root/tvm -DTVM_FFI_ROOT=<folder>/root/tvm_ffi` for CMake.
`make capi HOST=<triple>` runs it. Only the wheels' Linux builds exist (manylinux), so the
triple is a GNU/Linux one; Android and iOS need a TVM runtime built with their toolchains.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = {"apache-tvm": "tvm", "apache-tvm-ffi": "tvm_ffi"}  # distribution -> the package folder it unpacks


def wanted(member: str) -> bool:
    """The wheel members the C API needs: the two runtime libraries and tvm-ffi's headers."""
    return member in ("tvm/lib/libtvm_runtime.so", "tvm_ffi/lib/libtvm_ffi.so") or member.startswith(
        "tvm_ffi/include/")


def wheel_for(folder: Path, dist: str, version: str, cpu: str) -> Path | None:
    name = dist.replace("-", "_")
    found = sorted(folder.glob(f"{name}-{version}-*{cpu}*.whl"))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("triple", help="the GNU triple built for, e.g. aarch64-linux-gnu")
    ap.add_argument("folder", type=Path, help="where the wheels are kept and unpacked (root/)")
    ap.add_argument("--platform", help="pip's platform tag (default manylinux_2_28_<cpu of the triple>)")
    ap.add_argument("--python-version", default="3.11",
                    help="the Python whose wheels to take (only their native libraries are used)")
    args = ap.parse_args(argv)
    cpu = args.triple.split("-")[0]
    platform = args.platform or f"manylinux_2_28_{cpu}"
    args.folder.mkdir(parents=True, exist_ok=True)
    versions = {dist: importlib.metadata.version(dist) for dist in PACKAGES}
    missing = [d for d, v in versions.items() if wheel_for(args.folder, d, v, cpu) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
               "--platform", platform, "--python-version", args.python_version, "-d", str(args.folder),
               *(f"{d}=={versions[d]}" for d in missing)]
        print("fetching the", cpu, "TVM runtime:", " ".join(f"{d}=={versions[d]}" for d in missing), file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            print(f"pip could not download {', '.join(missing)} for {platform}: is there a wheel of that version "
                  "for this CPU (pypi.org/project/apache-tvm/#files), and is the index reachable?", file=sys.stderr)
            return 1
    root = args.folder / "root"
    stamp = root / (".unpacked-" + "-".join(f"{PACKAGES[d]}{v}" for d, v in versions.items()))
    if not stamp.exists():
        for old in root.glob(".unpacked-*"):
            old.unlink()
        for dist, version in versions.items():
            wheel = wheel_for(args.folder, dist, version, cpu)
            if wheel is None:
                print(f"no {dist} {version} wheel for {cpu} in {args.folder} after pip download", file=sys.stderr)
                return 1
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if wanted(m)]
                zf.extractall(root, members)
        for lib in ("tvm/lib/libtvm_runtime.so", "tvm_ffi/lib/libtvm_ffi.so"):
            if not (root / lib).exists():
                print(f"the wheels hold no {lib}: their layout changed; update {Path(__file__).name}", file=sys.stderr)
                return 1
        stamp.touch()
    print(f"-DTVM_ROOT={(root / 'tvm').resolve()} -DTVM_FFI_ROOT={(root / 'tvm_ffi').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
