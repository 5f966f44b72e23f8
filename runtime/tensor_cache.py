"""``tensor-cache.json`` plus ``params_shard_N.bin``: writing, reading and checking.

Records carry name, shape, dtype, byte offset, byte count and md5 of every tensor, so a
corrupt shard is caught by name at load. The layout fingerprint (names, shapes, dtypes)
is what a compiled library's ``_metadata`` is checked against.

The md5s are checked once per shard file, not on every load: hashing Qwen2.5-Coder-1.5B's
900 MB took 1.4 s of every one-off ``generate``. After a shard's tensors pass, its size,
mtime and inode are kept in ``$SPECCOMPILE_CACHE/verified/``; a later load skips the hash
of those tensors while the file is unchanged by that measure, as make and git trust file
stats. A shard rewritten, copied or touched is hashed again.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from .contract import TENSOR_CACHE_FILE

SHARD_BYTES = 32 * 1024 * 1024


class TensorCacheError(ValueError):
    """Converted parameters that are missing, corrupt or do not fit the library."""


def layout_fingerprint(entries: Iterable[tuple[str, Iterable[int], str]]) -> str:
    """sha256 over the ordered (name, shape, dtype) list of parameters."""
    canon = [[name, [int(d) for d in shape], str(dtype)] for name, shape, dtype in entries]
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()[:16]


class TensorCacheWriter:
    """Streams tensors into ≤32 MB shards; call :meth:`finish` to write the index."""

    def __init__(self, out_dir: Path, metadata: dict):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metadata = metadata
        self.shards: list[dict] = []
        self._fh = None
        self._offset = 0

    def _open_shard(self) -> None:
        if self._fh:
            self._fh.close()
        name = f"params_shard_{len(self.shards)}.bin"
        self._fh = (self.out_dir / name).open("wb")
        self.shards.append({"dataPath": name, "format": "raw-shard", "nbytes": 0, "records": []})
        self._offset = 0

    def add(self, name: str, arr: np.ndarray) -> None:
        data = np.ascontiguousarray(arr).tobytes()
        if self._fh is None or (self._offset and self._offset + len(data) > SHARD_BYTES):
            self._open_shard()
        self._fh.write(data)
        shard = self.shards[-1]
        shard["records"].append({
            "name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), "format": "raw",
            "nbytes": len(data), "byteOffset": self._offset, "md5": hashlib.md5(data).hexdigest(),
        })
        self._offset += len(data)
        shard["nbytes"] = self._offset

    def finish(self) -> Path:
        if self._fh:
            self._fh.close()
        records = [r for s in self.shards for r in s["records"]]
        meta = dict(self.metadata)
        meta["ParamSize"] = len(records)
        meta["ParamBytes"] = sum(r["nbytes"] for r in records)
        meta["layout_fingerprint"] = layout_fingerprint((r["name"], r["shape"], r["dtype"]) for r in records)
        path = self.out_dir / TENSOR_CACHE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"metadata": meta, "records": self.shards}, indent=1))
        tmp.replace(path)  # atomic: a crash never leaves a half-written index
        # The md5s above are of the very bytes written, so the shards count as checked: the
        # first load after a conversion need not read and hash them all again (1.1 GB of
        # Qwen2.5-1.5B: ~1.5 s of a first generate). A shard touched since is hashed as before.
        _write_stamps(self.out_dir, _read_stamps(self.out_dir),
                      {s["dataPath"]: {r["name"] for r in s["records"]} for s in self.shards})
        return path


def read_index(model_dir: Path) -> dict:
    path = Path(model_dir) / TENSOR_CACHE_FILE
    if not path.exists():
        raise TensorCacheError(f"{path} not found: run `speccompile convert_weight ... -o {model_dir}` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise TensorCacheError(f"{path} is not valid JSON: {err}") from err


def records(index: dict) -> list[dict]:
    return [r for shard in index["records"] for r in shard["records"]]


def load_params(model_dir: Path, names: list[str], verify_md5: bool = True) -> dict[str, np.ndarray]:
    """Read the named tensors (memory-mapped), checking sizes and md5 per tensor."""
    model_dir = Path(model_dir)
    index = read_index(model_dir)
    by_name = {}
    for shard in index["records"]:
        for r in shard["records"]:
            by_name[r["name"]] = (shard["dataPath"], r)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise TensorCacheError(f"{model_dir} lacks parameter(s) {missing[:5]}{'...' if len(missing) > 5 else ''}")
    maps: dict[str, np.memmap] = {}
    out = {}
    stamps = _read_stamps(model_dir) if verify_md5 else {}
    checked: dict[str, set[str]] = {}  # shard -> tensors hashed or trusted in this call
    for n in names:
        shard, r = by_name[n]
        path = model_dir / shard
        if shard not in maps:
            if not path.exists():
                raise TensorCacheError(f"shard {path} is missing; re-run convert_weight")
            maps[shard] = np.memmap(path, dtype=np.uint8, mode="r")
        buf = maps[shard]
        end = r["byteOffset"] + r["nbytes"]
        if end > buf.shape[0]:
            raise TensorCacheError(f"shard {path} is truncated ({buf.shape[0]} bytes, {n} needs {end}); re-run convert_weight")
        raw = buf[r["byteOffset"]:end]
        if verify_md5:
            stamp = stamps.get(shard, {})
            if not (stamp.get("stat") == _stat(path) and n in stamp.get("tensors", ())):
                if hashlib.md5(raw).hexdigest() != r["md5"]:
                    raise TensorCacheError(f"shard {path} is corrupt: md5 mismatch for {n}; re-run convert_weight")
            checked.setdefault(shard, set()).add(n)
        out[n] = np.frombuffer(raw, dtype=r["dtype"]).reshape(r["shape"])
    if verify_md5:
        _write_stamps(model_dir, stamps, checked)
    return out


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def cache_root() -> Path:
    """Where speccompile keeps what it downloads, builds and learns (``SPECCOMPILE_CACHE``)."""
    return Path(os.environ.get("SPECCOMPILE_CACHE", Path.home() / ".cache" / "speccompile"))


def _stamp_file(model_dir: Path) -> Path:
    key = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:20]
    return cache_root() / "verified" / f"{key}.json"


def _read_stamps(model_dir: Path) -> dict:
    try:
        stamps = json.loads(_stamp_file(model_dir).read_text())
        return stamps if isinstance(stamps, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_stamps(model_dir: Path, stamps: dict, checked: dict[str, set[str]]) -> None:
    """Record the shards whose tensors passed (best effort: a read-only cache only means
    hashing again next time)."""
    new = dict(stamps)
    for shard, tensors in checked.items():
        stat = _stat(Path(model_dir) / shard)
        old = stamps.get(shard, {})
        keep = set(old.get("tensors", ())) if old.get("stat") == stat else set()
        new[shard] = {"stat": stat, "tensors": sorted(keep | tensors)}
    if new == stamps:
        return
    path = _stamp_file(model_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(new))
        os.replace(tmp, path)
    except OSError:
        pass
