import shutil

import numpy as np
import pytest

from speccompile.runtime.model import Model, ModelLoadError
from speccompile.runtime.tensor_cache import layout_fingerprint, load_params, read_index, records


def test_records_have_offsets_and_md5(build_tiny):
    built = build_tiny("tiny-llama", "q4f32_1")
    index = read_index(built.model_dir)
    recs = records(index)
    assert all({"name", "shape", "dtype", "byteOffset", "nbytes", "md5"} <= set(r) for r in recs)
    assert index["metadata"]["layout_fingerprint"] == layout_fingerprint((r["name"], r["shape"], r["dtype"]) for r in recs)
    names = [r["name"] for r in recs]
    assert "layers.0.self_attn.qkv_proj.q_weight" in names and "layers.0.self_attn.qkv_proj.q_scale" in names
    arrays = load_params(built.model_dir, names)
    assert arrays["layers.0.self_attn.qkv_proj.q_weight"].dtype == np.uint32


def _copy(built, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(built.model_dir, dst)
    return dst


def test_corrupt_shard_is_named(build_tiny, tmp_path):
    built = build_tiny("tiny-llama", "q0f32")
    d = _copy(built, tmp_path)
    shard = d / "params_shard_0.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt: md5 mismatch"):
        Model(d, built.lib)


def test_shards_are_hashed_once_and_again_after_any_change(build_tiny, tmp_path, monkeypatch):
    import hashlib

    from speccompile.runtime import tensor_cache

    built = build_tiny("tiny-llama", "q0f32")
    d = _copy(built, tmp_path)
    names = [r["name"] for r in records(read_index(d))]
    calls = []
    real = hashlib.md5
    monkeypatch.setattr(tensor_cache.hashlib, "md5", lambda raw: calls.append(1) or real(raw))
    load_params(d, names)
    assert len(calls) == len(names)  # the first load hashes every tensor
    calls.clear()
    load_params(d, names)
    assert not calls  # unchanged shards: their tensors passed before
    shard = d / "params_shard_0.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))  # same size, new mtime
    with pytest.raises(tensor_cache.TensorCacheError, match="corrupt: md5 mismatch"):
        load_params(d, names)


def test_truncated_shard_is_named(build_tiny, tmp_path):
    built = build_tiny("tiny-llama", "q0f32")
    d = _copy(built, tmp_path)
    shard = d / "params_shard_0.bin"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="truncated"):
        Model(d, built.lib)


def test_library_for_other_weights_is_refused(build_tiny):
    llama = build_tiny("tiny-llama", "q0f32")
    qwen = build_tiny("tiny-qwen2", "q0f32")
    with pytest.raises(ModelLoadError, match="compiled for other weights"):
        Model(qwen.model_dir, llama.lib)
    q4 = build_tiny("tiny-llama", "q4f32_1")
    with pytest.raises(ModelLoadError, match="q0f32"):
        Model(q4.model_dir, llama.lib)


def test_metadata_is_baked_into_the_library(build_tiny):
    from speccompile.runtime.model import read_metadata

    built = build_tiny("tiny-llama", "q4f32_1")
    _, meta = read_metadata(built.lib)
    assert meta["model_type"] == "llama" and meta["quantization"] == "q4f32_1" and meta["target"] == "llvm"
    assert meta["tvm_version"].startswith("0.27")
    assert meta["layout_fingerprint"] == read_index(built.model_dir)["metadata"]["layout_fingerprint"]
    assert {p["name"] for p in meta["params"]} == {r["name"] for r in records(read_index(built.model_dir))}
