"""speccompile/gpu_check/kernels_bench.py end to end on the CPU OpenCL device (PoCL): the
portable q4 kernel built into a bench library, then timed and checked through TVM's runtime,
as the GPU check runs it (fp32 activations: PoCL has no fp16; the tensor-core variants are
cuda-only and run on the GPU alone)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import opencl_missing
from speccompile.gpu_check import kernels_bench as B

_MISSING = opencl_missing()


@pytest.mark.skipif(_MISSING is not None, reason=f"OpenCL unavailable: {_MISSING}")
def test_bench_times_and_checks_the_portable_kernel_on_pocl(tmp_path, monkeypatch):
    """Built here, run as the check runs it: a process of its own, TVM's runtime alone, the
    result on stdout's last line."""
    monkeypatch.setattr(B, "ROWS", (1, 3, 8, 9, 20))
    shapes = {"tiny": {"qkv": (96, 256), "o": (64, 4096)}}  # o: 4 warps split its k (q4_split)
    info = B.build(tmp_path, device="opencl", dtype="float32", variants=["portable", "portable_e", "dense_portable"],
                   shapes=shapes, attention={}, vocabs={})
    listing = json.loads(info.read_text())
    assert [f["name"] for f in listing["functions"]] == ["portable__tiny_qkv", "portable__tiny_o",
                                                         "portable_e__tiny_qkv", "portable_e__tiny_o",
                                                         "dense_portable__tiny_qkv", "dense_portable__tiny_o"]
    assert listing["functions"][2]["words"] == 1 and listing["functions"][2]["split"] == 1  # run e's kernel
    done = subprocess.run([sys.executable, "-m", "speccompile.gpu_check.kernels_bench", str(info), "--seconds", "120"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "portable__tiny_o:" in done.stderr  # the log goes to stderr, the check relays it
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name, rec in out["functions"].items():
        # the portable kernel is batch invariant: every row of every M equals the row alone
        assert rec["invariant"] and not rec["mismatched_rows"], name
        assert list(rec["us"]) == ["1", "3", "8", "9", "20"] and all(t > 0 for t in rec["us"].values())
        assert rec["vs_one_row"]["1"] == 1.0
        assert rec["max_err_vs_scale"] < 1e-5  # fp32 accumulation against float64
    assert out["functions"]["dense_portable__tiny_o"]["max_err_vs_scale"] < 1e-5  # dense weights, their own operands
    layer = out["layers"]["portable__tiny"]
    assert layer["complete"] and layer["us"]["8"] == pytest.approx(
        out["functions"]["portable__tiny_qkv"]["us"]["8"] + out["functions"]["portable__tiny_o"]["us"]["8"], abs=0.02)


@pytest.mark.skipif(_MISSING is not None, reason=f"OpenCL unavailable: {_MISSING}")
def test_bench_times_and_checks_attention_variants_and_the_argmax_on_pocl(tmp_path, monkeypatch):
    """The attention section at small contexts (a 300-row walk crosses the 256-row pass) and the
    verification section on a small vocabulary: both V sums bit-identical per token alone and
    together, close to float64; every bonus token numpy's first maximum; the sampling kernel's
    rows sum to 1 and keep their argmax under each cut."""
    monkeypatch.setattr(B, "CONTEXTS", (40, 300))
    monkeypatch.setattr(B, "PREFILL", 70)
    info = B.build(tmp_path, device="opencl", dtype="float32", variants=[], shapes={},
                   attention={"tiny": (4, 2, 64)}, vocabs={"tiny": 5000})
    listing = json.loads(info.read_text())
    assert [f["name"] for f in listing["attention"]] == ["attn__tiny", "attn_rows__tiny"]
    done = subprocess.run([sys.executable, "-m", "speccompile.gpu_check.kernels_bench", str(info), "--seconds", "200"],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["skipped"]
    for name in ("attn__tiny", "attn_rows__tiny"):
        rec = out["attention"][name]
        assert list(rec["us"]) == ["decode_40", "decode_300", "verify8_40", "verify8_300", "prefill_70"], rec["us"]
        assert all(t > 0 for t in rec["us"].values())
        assert rec["invariant"] and not rec["mismatched"], rec["mismatched"]
        assert 0 < rec["max_abs_err"] < 1e-5  # fp32 against float64
    acc = out["accept"]["accept__tiny"]
    assert acc["correct"] and list(acc["us"]) == ["1", "9"]
    probs = out["accept"]["probs__tiny"]
    assert probs["correct"] and list(probs["us"]) == [f"{cut}_{n}" for cut in ("top_p", "top_k", "none", "top_p_peaked",
                                                                               "top_k_top_p_peaked") for n in (1, 9)]
    sampled = out["accept"]["sampled__tiny"]
    assert sampled["correct"] and list(sampled["us"]) == ["plain", "reject_8"]


def test_layer_totals_flag_a_model_whose_projections_were_cut_short():
    """A deadline can skip kernels: a layer total over some of its projections says so."""
    f = {"tc__smollm2_qkv": {"variant": "tc", "model": "smollm2", "proj": "qkv", "us": {"1": 2.0, "8": 3.0}}}
    t = B.layer_totals(f, B.LAYERS, {m: list(p) for m, p in B.SHAPES.items()})["tc__smollm2"]
    assert not t["complete"] and t["vs_one_row"] == {"1": 1.0, "8": 1.5} and t["forward_ms"]["1"] == 0.06


def test_refusal_names_why_the_tensor_core_libraries_stand_down():
    """The check measures the portable libraries instead when the bench failed, or when the
    default tensor-core kernel broke batch invariance or missed float64 by more than fp16 does."""
    good = {"variant": "tc", "invariant": True, "mismatched_rows": {}, "max_err_vs_scale": 3e-4}
    ok = {"functions": {"tc__qwen15_o": good, "portable__qwen15_o": {**good, "variant": "portable"}}}
    assert B.refusal(ok) is None
    assert "failed" in B.refusal(None, "RuntimeError: exit -6: CUDA_ERROR_MISALIGNED_ADDRESS")
    assert "no tensor-core" in B.refusal({"functions": {"portable__qwen15_o": ok["functions"]["portable__qwen15_o"]}})
    split = {"functions": {"tc__qwen15_o": {**good, "invariant": False, "mismatched_rows": {"8": [3, 5]}}}}
    assert "tc__qwen15_o: rows differ" in B.refusal(split) and "[3, 5]" in B.refusal(split)
    assert "max error" in B.refusal({"functions": {"tc__qwen15_o": {**good, "max_err_vs_scale": 0.2}}})
    # another variant's fault is the bench's finding, not a reason to refuse the default
    other = {"functions": {**ok["functions"], "tc_w16__qwen15_o": {**good, "variant": "tc_w16", "invariant": False}}}
    assert B.refusal(other) is None
