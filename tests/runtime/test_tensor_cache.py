import os
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


def test_a_conversion_stamps_its_shards_as_checked(tmp_path, monkeypatch):
    """The writer hashed the bytes it wrote: the first load trusts them (no second hash); a
    shard touched after writing is hashed again, and a changed byte is caught."""
    import hashlib

    from speccompile.runtime import tensor_cache

    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path / "cache"))
    w = tensor_cache.TensorCacheWriter(tmp_path / "m", {})
    arrays = {"a": np.arange(12, dtype=np.float32), "b": np.ones((3, 4), np.uint32)}
    for name, arr in arrays.items():
        w.add(name, arr)
    w.finish()
    real = hashlib.md5
    calls = []
    monkeypatch.setattr(tensor_cache.hashlib, "md5", lambda raw: calls.append(1) or real(raw))
    out = load_params(tmp_path / "m", ["a", "b"])
    assert not calls and all((out[n] == a).all() for n, a in arrays.items())
    shard = tmp_path / "m" / "params_shard_0.bin"
    before = shard.stat().st_mtime_ns
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before + 10**9, before + 10**9))  # touched (a coarse clock may not have moved)
    with pytest.raises(tensor_cache.TensorCacheError, match="corrupt: md5 mismatch"):
        load_params(tmp_path / "m", ["a", "b"])


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


def _logits(model):
    kv = model.create_kv_cache(64)
    kv.add_sequence(0)
    return model.prefill(kv, [0], [[1, 5, 9, 2]])


@pytest.mark.parametrize("quant", ["q4f32_1", "q0f32"])
def test_weights_are_mapped_from_an_image_written_by_their_second_load(build_tiny, tmp_path, monkeypatch, quant):
    """runtime/params_image.py: the first CPU load copies from the shards and leaves a marker,
    the second also writes the image, the third maps it (the same tensors' bytes, the same
    logits). A shard touched makes a new image (the old one goes when it is written); an image
    of the wrong size is ignored; a cache that cannot be written only means copying."""
    from speccompile.runtime import params_image

    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path / "cache"))
    built = build_tiny("tiny-llama", quant)
    d = _copy(built, tmp_path)
    loads = [Model(d, built.lib) for _ in range(3)]
    assert [m.weights_from for m in loads] == ["shards", "shards", "image"]
    images = sorted((tmp_path / "cache" / "params").glob("*.bin"))
    assert len(images) == 1 and images[0].with_suffix(".seen").exists()
    assert all(np.array_equal(np.from_dlpack(a), np.from_dlpack(b)) for a, b in zip(loads[0].params, loads[2].params))
    assert np.array_equal(_logits(loads[0]), _logits(loads[2]))
    ptr = loads[2].params[0].data_ptr()  # the tensor's memory is the image file's mapping, not a copy
    maps = [line.split() for line in open("/proc/self/maps")]
    assert any(int(m[0].split("-")[0], 16) <= ptr < int(m[0].split("-")[1], 16) and m[-1] == str(images[0])
               for m in maps if len(m) == 6)

    shard = d / "params_shard_0.bin"
    shard.write_bytes(shard.read_bytes())  # the same bytes, a new mtime: its tensors are read and hashed again
    assert [Model(d, built.lib).weights_from for _ in range(3)] == ["shards", "shards", "image"]
    now = sorted((tmp_path / "cache" / "params").glob("*.bin"))
    assert len(now) == 1 and now != images  # the earlier image of this directory was removed

    with open(now[0], "r+b") as f:  # an image of another size (a crash, another build) is not used
        f.truncate(1000)
    m = Model(d, built.lib)
    assert m.weights_from == "shards" and now[0].stat().st_size > 1000  # the second load or later writes it again
    assert np.array_equal(_logits(m), _logits(loads[0]))

    monkeypatch.setenv("SPECCOMPILE_CACHE", str(shard))  # a file, not a directory: nothing can be written there
    assert [Model(d, built.lib).weights_from for _ in range(2)] == ["shards", "shards"]
    assert params_image.map_image(tmp_path / "missing.bin", loads[0].meta) is None
