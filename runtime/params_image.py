"""A model's CPU weights as one file a process maps, instead of copying them out of the shards.

Why: on the CPU the weights are copied from the memory-mapped shards into tensors, the q4
ones in the 16-row tiled order the kernels read (runtime/model.py ``upload_param``). For
Qwen2.5-Coder-1.5B that copy was 0.5 s of a 1.75 s one-off ``generate`` on a 2-core Zen 4.
The first load on the CPU writes the tensors' bytes to an image; later processes map the
image (copy-on-write; TVM never writes a parameter, so its pages stay the page cache's,
shared by every process of the model) and wrap views of it as the tensors: no copy at all
(``Model()`` 0.51 -> 0.02 s there, the first forward no slower).

Which image is valid: its name hashes the tensor-cache.json bytes (the tensors' md5s), each
shard's size, mtime and inode (as the md5 stamps of runtime/tensor_cache.py do: a shard
rewritten, copied or touched makes a new image, read and hashed from the shards again), the
library's parameters (names, shapes, dtypes), which are tiled and the tile, and FORMAT. The
parameters lie in library order, each at a PAGE boundary; their offsets follow from the
shapes, so the file holds nothing else and its size is checked.

When: writing an image costs more than the copy it saves (1.1 GB took 2.9 s to write and
sync on that host, against 0.5 s a load), so it is written by the second process that loads
the same weights and library layout (the first leaves a marker, ``<image>.seen``): weights
loaded once never pay for an image; weights loaded again pay once and then map.

Both runtimes: the C API (runtime/capi/src/params_image.cc) computes the same key, maps the same
image and writes it the same way, so a Python process and an app share one image of a model.

Where: ``$SPECCOMPILE_CACHE/params/<model dir hash>-<key>.bin``, one per model directory (an
older image of the same directory is removed when a new one is written). Written to a
temporary name, synced to disk and renamed: a reader never sees a partial file, nor after a
crash one whose pages never reached the disk. A write that fails (disk full, read-only
cache) only means the next process copies again.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .contract import TENSOR_CACHE_FILE
from .tensor_cache import cache_root

FORMAT = 2  # 2: the parameters hashed as plain text, which the C runtime spells the same way
PAGE = 4096


def _dir_key(model_dir: Path) -> str:
    return hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]


def image_path(model_dir: Path, index: dict, meta: dict) -> Path:
    """The image of these weights (``index``: tensor-cache.json as read) for a library with
    this ``_metadata``."""
    model_dir = Path(model_dir)
    h = hashlib.sha256(f"v{FORMAT}".encode())
    h.update((model_dir / TENSOR_CACHE_FILE).read_bytes())
    for shard in index["records"]:
        st = (model_dir / shard["dataPath"]).stat()
        h.update(f"{shard['dataPath']}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino};".encode())
    # the library's parameters spelled out plainly, so that the C runtime (runtime/capi/src/
    # params_image.cc) finds the same image: name:dtype:shape; per parameter, then the tiling
    h.update("".join(f"{p['name']}:{p['dtype']}:{','.join(str(int(d)) for d in p['shape'])};"
                     for p in meta["params"]).encode())
    h.update(f"tiled:{','.join(sorted(meta.get('tiled_params', [])))};tile:{int(meta.get('tile', 16))}".encode())
    return cache_root() / "params" / f"{_dir_key(model_dir)}-{h.hexdigest()[:24]}.bin"


def _layout(meta: dict) -> tuple[list[tuple[int, tuple, np.dtype]], int]:
    """(offset, shape, dtype) of each parameter in library order, and the file's size."""
    out, at = [], 0
    for p in meta["params"]:
        dtype, shape = np.dtype(p["dtype"]), tuple(int(d) for d in p["shape"])
        out.append((at, shape, dtype))
        at += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // PAGE) * PAGE
    return out, at


def map_image(path: Path, meta: dict) -> list[np.ndarray] | None:
    """Writable (copy-on-write) views of the image's parameters, or None if there is no
    image of the expected size."""
    layout, size = _layout(meta)
    try:
        if path.stat().st_size != size:
            return None
        mm = np.memmap(path, dtype=np.uint8, mode="c")
    except (OSError, ValueError):
        return None
    return [np.ndarray(shape, dtype, buffer=mm, offset=off) for off, shape, dtype in layout]


def wanted(path: Path) -> bool:
    """Whether to write this image now: an earlier process loaded the same weights (its
    marker is there); else leave the marker. Best effort."""
    seen = path.with_suffix(".seen")
    if seen.exists():
        return True
    try:
        seen.parent.mkdir(parents=True, exist_ok=True)
        seen.touch()
    except OSError:
        pass
    return False


def write_image(path: Path, arrays: list[np.ndarray], meta: dict) -> bool:
    """Write the parameters (host arrays, in the tensors' layout) as the image; best effort."""
    layout, size = _layout(meta)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            for (off, shape, dtype), a in zip(layout, arrays):
                if a.shape != shape or a.dtype != dtype:
                    raise ValueError(f"parameter {shape} {dtype} written as {a.shape} {a.dtype}")
                f.seek(off)
                f.write(np.ascontiguousarray(a).data)
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, ValueError):
        tmp.unlink(missing_ok=True)
        return False
    key = path.name.split("-", 1)[0]
    for old in path.parent.glob(f"{key}-*"):  # earlier images of this model directory, and dead writers' files
        if old.stem == path.stem:
            continue
        if old.suffix in (".bin", ".seen") or not _alive(old.name.split(".")[-2]):
            old.unlink(missing_ok=True)
    return True


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
