"""The weight quantization formats and their numpy codec, without TVM.

Formats (see ANCHORS.md): ``q0f32``/``q0f16`` keep plain weights; ``q4f32_1``/``q4f16_1``
store symmetric int4 in groups of 32 along the input axis, eight nibbles per uint32
(element r in bits [4r, 4r+4)), with one scale per group: ``w = (q - 7) * scale``.

Why apart from models/quantization.py (the nn layers that consume the format): converting
weights needs only this, and it must work where TVM's compiler is not installed -- a GPU
machine that carries TVM's runtime alone converts random-weight checkpoints there
(``convert_weight --layout-from``, speccompile/gpu_check/check.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_SIZE = 32
PACK = 8  # nibbles per uint32


@dataclass(frozen=True)
class Quantization:
    name: str
    kind: str  # "none" | "group4"
    model_dtype: str  # activation dtype and scale dtype

    @property
    def is_q4(self) -> bool:
        return self.kind == "group4"


QUANTIZATIONS = {
    "q0f32": Quantization("q0f32", "none", "float32"),
    "q0f16": Quantization("q0f16", "none", "float16"),
    "q4f32_1": Quantization("q4f32_1", "group4", "float32"),
    "q4f16_1": Quantization("q4f16_1", "group4", "float16"),
}


def get_quantization(name: str) -> Quantization:
    if name not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {name!r}; choose one of: {', '.join(QUANTIZATIONS)}")
    return QUANTIZATIONS[name]


# ---------------------------------------------------------------- numpy codec
def quantize_q4(w: np.ndarray, scale_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] float -> (q_weight [out, in/8] uint32, q_scale [out, in/32]).

    An all-zero group gets scale 0 and codes 7 (exact zero) instead of a division by zero.
    """
    out_f, in_f = w.shape
    if in_f % GROUP_SIZE:
        raise ValueError(f"q4 needs the input dim to be a multiple of {GROUP_SIZE}, got {w.shape}")
    groups = w.astype(np.float32).reshape(out_f, in_f // GROUP_SIZE, GROUP_SIZE)
    scale = np.abs(groups).max(axis=2) / 7.0  # [out, in/32]
    scale = scale.astype(scale_dtype).astype(np.float32)  # quantize against the stored scale
    safe = np.where(scale == 0, 1.0, scale)[..., None]
    q = np.clip(np.rint(groups / safe) + 7, 0, 14).astype(np.uint32)
    q = np.where(scale[..., None] == 0, np.uint32(7), q)
    q = q.reshape(out_f, in_f // PACK, PACK)
    shifts = (np.arange(PACK, dtype=np.uint32) * 4)[None, None, :]
    packed = np.bitwise_or.reduce(q << shifts, axis=2).astype(np.uint32)
    return packed, scale.astype(scale_dtype)


def dequantize_q4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Inverse of :func:`quantize_q4`, returning float32 [out, in]."""
    out_f, words = packed.shape
    shifts = (np.arange(PACK, dtype=np.uint32) * 4)[None, None, :]
    q = (packed[:, :, None] >> shifts) & np.uint32(0xF)
    w = q.reshape(out_f, words * PACK).astype(np.float32) - 7.0
    return (w.reshape(out_f, -1, GROUP_SIZE) * scale.astype(np.float32)[..., None]).reshape(out_f, -1)
