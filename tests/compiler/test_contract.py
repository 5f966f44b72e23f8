"""The compiler/runtime contract (runtime/contract.py): the library records what the
contract says (page size, entry points with their argument order), the loaders refuse a
library that differs, the C API's mirror agrees with it, and the one config reader
explains a missing file."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from speccompile.runtime import contract as C
from speccompile.runtime.kv_cache import PagedKV
from speccompile.runtime.model import Model, ModelLoadError, baked_metadata

CONTRACT_H = Path(__file__).resolve().parents[2] / "runtime" / "capi" / "src" / "contract.h"


@pytest.fixture(scope="module")
def tiny(build_tiny):
    return build_tiny("tiny-llama", "q0f32")


def test_library_records_the_contract(tiny):
    meta = baked_metadata(tiny.lib)
    assert meta["kv_page_size"] == C.KV_PAGE_SIZE
    assert meta["entry_points"] == {name: list(args) for name, args in C.ENTRY_POINTS[C.TARGET].items()}
    assert set(C.required_metadata(C.TARGET)) <= set(meta)
    assert next(iter(meta)) == "speccompile_version"  # baked_metadata finds the JSON by its first key
    model = Model(tiny.model_dir, tiny.lib)  # every entry point of the table is exported and bound
    assert set(model._fn) == set(C.ENTRY_POINTS[C.TARGET])


def test_other_page_size_is_refused(tiny, monkeypatch):
    import speccompile.runtime.model as model_mod

    real = model_mod.read_metadata

    def other_pages(path):
        lib, meta = real(path)
        return lib, {**meta, "kv_page_size": 2 * C.KV_PAGE_SIZE}

    monkeypatch.setattr(model_mod, "read_metadata", other_pages)
    with pytest.raises(ModelLoadError, match=f"KV pages of {2 * C.KV_PAGE_SIZE} tokens, this runtime uses "
                                             f"{C.KV_PAGE_SIZE}; rebuild it with `speccompile compile"):
        Model(tiny.model_dir, tiny.lib)


def _meta(kind=C.TARGET, **changes) -> dict:
    meta = {key: 0 for key in C.required_metadata(kind)}
    meta.update(model_type={C.TARGET: "llama"}.get(kind, kind), kv_page_size=C.KV_PAGE_SIZE,
                entry_points={n: list(a) for n, a in C.ENTRY_POINTS[kind].items()})
    meta.update(changes)
    return meta


def test_check_library_names_what_differs():
    C.check_library(_meta(), C.TARGET, "m.so")
    C.check_library(_meta(C.EAGLE, draft_vocab_size=0), C.EAGLE, "h.so")
    C.check_library(_meta(C.EAGLE3), C.EAGLE3, "h.so")
    # an EAGLE-1 library built before draft steps on device (no draft_top_k) still loads
    older = {n: list(C.ENTRY_POINTS[C.EAGLE][n]) for n in ("eagle_forward", "draft_logits")}
    C.check_library(_meta(C.EAGLE, draft_vocab_size=8, entry_points=older), C.EAGLE, "h.so")
    assert {"draft_top_k", "target_embed"} <= set(C.required_metadata(C.EAGLE3))
    older = _meta()
    del older["kv_page_size"]
    cases = [
        (older, C.TARGET, "lacks kv_page_size in its _metadata: it was built by an older speccompile"),
        (_meta(entry_points=list(C.ENTRY_POINTS[C.TARGET])), C.TARGET, "does not record its entry points"),
        (_meta(entry_points={n: list(a) for n, a in C.ENTRY_POINTS[C.TARGET].items() if n != "decode"}),
         C.TARGET, "lacks the entry point 'decode'"),
        (_meta(entry_points={**_meta()["entry_points"], "decode": ["kv", "input_embeds"]}), C.TARGET,
         r"entry point decode takes \(kv, input_embeds\), this runtime passes \(input_embeds, kv, positions"),
        (_meta(C.EAGLE, draft_vocab_size=8, entry_points={"eagle_forward": list(C.ENTRY_POINTS[C.EAGLE]["eagle_forward"])}),
         C.EAGLE, "lacks the entry point 'draft_logits'"),  # a reduced vocabulary needs its logits function
        (_meta(C.MEDUSA), C.TARGET, "is a medusa library"),
        # a head with a draft vocabulary drafts on device: draft_top_k says it has the draft steps
        (_meta(C.EAGLE, draft_vocab_size=8, draft_top_k=8,
               entry_points={n: list(a) for n, a in C.ENTRY_POINTS[C.EAGLE].items() if n != "draft_step"}),
         C.EAGLE, "lacks the entry point 'draft_step'"),
        (_meta(C.EAGLE3, entry_points={**_meta(C.EAGLE3)["entry_points"], "draft_step": ["input_ids", "hidden"]}),
         C.EAGLE3, r"entry point draft_step takes \(input_ids, hidden\), this runtime passes \(input_ids, hidden, "
                   r"hidden_rows, target_embed, kv"),
    ]
    for meta, kind, words in cases:
        with pytest.raises(C.ContractError, match=words):
            C.check_library(meta, kind, "m.so")


def test_forward_metadata_is_built_by_name():
    kv = PagedKV(None, 4)
    for s in (0, 1):
        kv.add_sequence(s)
    chain = kv.plan_chain([0, 1], [3, C.KV_PAGE_SIZE + 1])
    # the entry points' order comes from the contract, whatever order the arrays were built in
    assert len(chain.arrays) == len(C.FORWARD_META)
    assert all(a is chain.named[k] for k, a in zip(C.FORWARD_META, chain.arrays))
    n = 3 + C.KV_PAGE_SIZE + 1
    for name, (shape, dtype) in C.FORWARD_META.items():  # each shaped as the contract says
        arr = chain.named[name]
        assert arr.dtype == np.dtype(dtype) and arr.ndim == len(shape)
        assert arr.shape[0] == (n if shape[0] == "n" else 2)
    assert chain.named["page_table"].shape == (2, 2)  # the second sequence spans two pages
    tree = kv.plan_tree([0], [[-1, 0, 0]])
    assert tree.named["extra_len"].tolist() == [1, 2, 2]


def test_capi_mirror_agrees():
    text = CONTRACT_H.read_text()
    consts = dict(re.findall(r'k(\w+) = "([^"]+)"', text))
    assert consts["ModelConfigFile"] == C.MODEL_CONFIG_FILE and consts["TensorCacheFile"] == C.TENSOR_CACHE_FILE
    assert consts["PageSizeKey"] == "kv_page_size" and consts["EntryPointsKey"] == "entry_points"
    assert "kv_page_size" in C.METADATA_KEYS and "entry_points" in C.METADATA_KEYS
    entries = re.findall(r'\{"(\w+)", "(\w+)",\s*\{([^}]*)\}(?:,\s*"(\w*)")?\}', text)
    assert {kind for kind, *_ in entries} == {C.TARGET, C.EAGLE, C.EAGLE3, C.MEDUSA}
    for kind, name, args, present_if in entries:
        assert tuple(re.findall(r'"(\w+)"', args)) == C.ENTRY_POINTS[kind][name], (kind, name)
        assert present_if == C.OPTIONAL_ENTRY_POINTS.get((kind, name), ""), (kind, name)


def test_compiler_checks_methods_against_the_table():
    from tvm.relax.frontend import nn

    from speccompile.models.exports import contract_spec

    class Medusa(nn.Module):
        def medusa_heads(self, features):  # the contract names it "hidden"
            return features

    with pytest.raises(TypeError, match=r"medusa_heads takes \(features\) but runtime/contract.py says the "
                                        r"runtimes pass \(hidden\)"):
        contract_spec(Medusa(), C.MEDUSA, {"hidden": None})


def test_read_model_config(tmp_path):
    with pytest.raises(C.ContractError, match=f"{tmp_path / C.MODEL_CONFIG_FILE} not found: run "
                                              f"`speccompile gen_config SRC -o {tmp_path}`"):
        C.read_model_config(tmp_path)
    (tmp_path / C.MODEL_CONFIG_FILE).write_text('{"model_type": "llama"}')
    assert C.read_model_config(tmp_path) == C.read_model_config(tmp_path / C.MODEL_CONFIG_FILE) == {"model_type": "llama"}
    (tmp_path / C.MODEL_CONFIG_FILE).write_text("{")
    with pytest.raises(C.ContractError, match="is not valid JSON"):
        C.read_model_config(tmp_path)
