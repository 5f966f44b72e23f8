"""The nn layers that consume the weight quantization formats (models/quant_codec.py
defines the formats and their numpy codec, re-exported here).

The layers emit their matmuls as TE computes tagged with ``speccompile.kernel`` so the
schedule rules in ``passes/`` can find them and give them fast, batch-invariant kernels.
"""
from __future__ import annotations

from tvm import te, tirx  # the runtime never imports this module, only the compiler does
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from speccompile.models.quant_codec import (GROUP_SIZE, PACK, QUANTIZATIONS, Quantization, dequantize_q4,  # noqa: F401 - re-exported
                          get_quantization, quantize_q4)

KERNEL_ATTR = "speccompile.kernel"


def _dequant_expr(qw: te.Tensor, qs: te.Tensor, n, k, dtype: str):
    """TE expression of one dequantized weight element w[n, k] from q4 storage."""
    word = qw[n, k // PACK]
    nib = (word >> ((k % PACK) * 4).astype("uint32")) & tirx.const(0xF, "uint32")
    return (nib.astype(dtype) - tirx.const(7, dtype)) * qs[n, k // GROUP_SIZE]


def matmul_te(x: te.Tensor, w: te.Tensor) -> te.Tensor:
    """y[m, n] = sum_k x[m, k] * w[n, k]  (weights in HF [out, in] order)."""
    m_dim, k_dim = x.shape
    k = te.reduce_axis((0, k_dim), name="k")
    return te.compute((m_dim, w.shape[0]), lambda m, n: te.sum(x[m, k] * w[n, k], axis=k), name="matmul")


def q4_matmul_te(x: te.Tensor, qw: te.Tensor, qs: te.Tensor) -> te.Tensor:
    """y[m, n] = sum_k x[m, k] * dequant(qw, qs)[n, k], fused so weights stay packed."""
    m_dim, k_dim = x.shape
    k = te.reduce_axis((0, k_dim), name="k")
    return te.compute(
        (m_dim, qw.shape[0]),
        lambda m, n: te.sum(x[m, k] * _dequant_expr(qw, qs, n, k, x.dtype), axis=k),
        name="q4_matmul",
    )


def q4_take_te(qw: te.Tensor, qs: te.Tensor, ids: te.Tensor) -> te.Tensor:
    """Embedding rows gathered and dequantized: [n] ids -> [n, dim]."""
    dim = qw.shape[1] * PACK
    return te.compute(
        (ids.shape[0], dim), lambda i, j: _dequant_expr(qw, qs, ids[i], j, qs.dtype), name="q4_take"
    )


def weight_storage(rows: int, cols: int, quant: Quantization) -> list[tuple[str, tuple[int, int], str]]:
    """(parameter name, shape, dtype) of each stored tensor of a [rows, cols] matrix."""
    if quant.is_q4:
        return [("q_weight", (rows, cols // PACK), "uint32"), ("q_scale", (rows, cols // GROUP_SIZE), quant.model_dtype)]
    return [("weight", (rows, cols), quant.model_dtype)]


def _declare_weight(module: nn.Module, rows: int, cols: int, quant: Quantization) -> None:
    """The weight parameters of a [rows, cols] matrix in the quantization's storage."""
    for name, shape, dtype in weight_storage(rows, cols, quant):
        setattr(module, name, nn.Parameter(shape, dtype))


def _project(module: nn.Module, x: nn.Tensor, cols: int, rows: int) -> nn.Tensor:
    """x [..., cols] @ W^T -> [..., rows], through a kernel-tagged TE compute."""
    lead = list(x.shape[:-1])
    x2 = op.reshape(x, [-1, cols])  # one dynamic row dim for the kernels
    if module.quant.is_q4:
        y = op.tensor_expr_op(q4_matmul_te, "q4_matmul", [x2, module.q_weight, module.q_scale],
                              attrs={KERNEL_ATTR: "q4_matmul"})
    else:
        y = op.tensor_expr_op(matmul_te, "matmul", [x2, module.weight], attrs={KERNEL_ATTR: "matmul"})
    if len(lead) == 1:
        # y is [n, rows] already; an identity reshape would be a view, except at a function's
        # output (the logits), where it is a copy of [n, rows] and a second such buffer
        return y
    return op.reshape(y, [*lead, rows])


class QLinear(nn.Module):
    """A linear layer whose weight is stored in the chosen quantization format."""

    def __init__(self, in_features: int, out_features: int, quant: Quantization, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.quant = in_features, out_features, quant
        _declare_weight(self, out_features, in_features, quant)
        self.bias = nn.Parameter((out_features,), quant.model_dtype) if bias else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        # x: [..., in] -> [..., out]
        y = self.project(x)
        return y if self.bias is None else y + self.bias

    def project(self, x: nn.Tensor) -> nn.Tensor:
        """x @ W^T without the bias (a caller that fuses the bias add into its next kernel)."""
        return _project(self, x, self.in_features, self.out_features)


def embedding_rows(storage: list[nn.Tensor], ids: nn.Tensor, quant: Quantization) -> nn.Tensor:
    """Rows ``ids`` [n] of an embedding table stored as ``weight_storage`` says -> [n, dim].

    The kernel-tagged gather every library uses for a table of this shape and storage (the
    CPU dispatcher swaps in the tiled kernel by the same rule as the loader tiles the
    tensor), so a draft head handed its target's table gets the target's embeddings bit
    for bit (models/eagle.py)."""
    if quant.is_q4:
        return op.tensor_expr_op(q4_take_te, "q4_take", [*storage, ids], attrs={KERNEL_ATTR: "q4_take"})
    return op.tensor_expr_op(lambda w, i: te.compute((i.shape[0], w.shape[1]), lambda a, b: w[i[a], b], name="take"),
                             "take", [*storage, ids], attrs={KERNEL_ATTR: "take"})


class QEmbedding(nn.Module):
    """Token embedding in the chosen format; also serves as a tied lm_head."""

    def __init__(self, vocab_size: int, dim: int, quant: Quantization):
        super().__init__()
        self.vocab_size, self.dim, self.quant = vocab_size, dim, quant
        _declare_weight(self, vocab_size, dim, quant)

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        # ids: [n] int32 (validated by the runtime: take does not bounds-check)
        storage = [self.q_weight, self.q_scale] if self.quant.is_q4 else [self.weight]
        return embedding_rows(storage, ids, self.quant)

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        """Logits with the embedding matrix as the output projection (tied)."""
        return _project(self, x, self.dim, self.vocab_size)
