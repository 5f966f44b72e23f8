import numpy as np
import pytest

from speccompile.models.quantization import GROUP_SIZE, dequantize_q4, get_quantization, quantize_q4


def test_round_trip_error_is_within_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    q, s = quantize_q4(w, "float32")
    assert q.shape == (48, 16) and q.dtype == np.uint32 and s.shape == (48, 4)
    err = np.abs(dequantize_q4(q, s) - w).reshape(48, 4, GROUP_SIZE)
    assert np.all(err <= s[..., None] / 2 + 1e-6)


def test_all_zero_group_gives_exact_zero_and_no_nan():
    w = np.zeros((16, 64), np.float32)
    w[3, 40] = 2.0
    q, s = quantize_q4(w, "float32")
    d = dequantize_q4(q, s)
    assert np.all(np.isfinite(d)) and np.all(np.isfinite(s))
    assert d[0].tolist() == [0.0] * 64
    assert d[3, 40] == pytest.approx(2.0)


def test_nibble_order_is_low_bits_first():
    w = np.zeros((1, 32), np.float32)
    w[0, :8] = np.arange(8) - 3.5  # distinct codes
    w[0, 31] = 7.0  # sets the scale to 1
    q, s = quantize_q4(w, "float32")
    codes = [(int(q[0, 0]) >> (4 * r)) & 0xF for r in range(8)]
    assert codes == [int(np.clip(np.rint(v) + 7, 0, 14)) for v in w[0, :8]]


def test_fp16_scales_round_trip():
    w = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    q, s = quantize_q4(w, "float16")
    assert s.dtype == np.float16
    assert np.abs(dequantize_q4(q, s) - w).max() < 0.5


def test_unknown_quantization_is_a_clear_error():
    with pytest.raises(ValueError, match="q4f16_1"):
        get_quantization("q3f16")
