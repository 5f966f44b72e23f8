"""The weights image (runtime/params_image.py) shared by the two runtimes: the C API computes the
same key, so an image either one wrote is mapped by the other, and a model loaded from it
generates what a model copied from the shards generates."""
from __future__ import annotations

import ctypes as C
import json

import pytest
from capi_ctypes import Capi, run_example

from speccompile.runtime.model import Model

pytestmark = pytest.mark.real_model


def c_loads(capi: Capi, model_dir, lib) -> str:
    capi.lib.spc_model_weights_from.restype = C.c_char_p
    model = capi.model(model_dir, lib)
    try:
        return capi.lib.spc_model_weights_from(model).decode()
    finally:
        capi.lib.spc_model_free(model)


def test_one_image_for_both_runtimes(capi_build, smollm2_q4, tmp_path, monkeypatch):
    model_dir, lib = smollm2_q4
    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path / "cache"))  # read at each load, by both runtimes
    images = tmp_path / "cache" / "params"
    capi = Capi(capi_build)
    # C first: the first load leaves a marker, the second writes the image, Python maps it
    assert [c_loads(capi, model_dir, lib) for _ in range(2)] == ["shards", "shards"]
    written = sorted(images.glob("*.bin"))
    assert len(written) == 1
    assert Model(model_dir, lib).weights_from == "image"
    assert c_loads(capi, model_dir, lib) == "image"
    # Python first: the image it writes is the one C maps
    for f in images.iterdir():
        f.unlink()
    assert [Model(model_dir, lib).weights_from for _ in range(2)] == ["shards", "shards"]
    assert sorted(images.glob("*.bin")) == written
    assert c_loads(capi, model_dir, lib) == "image"


def test_tokens_from_the_image_equal_the_shards(capi_build, smollm2_q4, tmp_path):
    model_dir, lib = smollm2_q4
    runs = [run_example(capi_build / "spc_generate", model_dir, lib, "--prompt", "Name the planets of the solar system.",
                        "--max-tokens", "24", "--json", env_extra={"SPECCOMPILE_CACHE": str(tmp_path / "cache")})
            for _ in range(3)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert list((tmp_path / "cache" / "params").glob("*.bin"))  # the second run wrote it, the third mapped it
    assert len({json.dumps(json.loads(r.stdout)["token_ids"]) for r in runs}) == 1
