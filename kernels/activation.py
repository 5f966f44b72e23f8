"""The gated activation of the MLP, ``act(gate) * up``, as one vectorized kernel: SwiGLU
(``act`` = silu) or GeGLU (gelu with the tanh approximation, Gemma's ``gelu_pytorch_tanh``).

Why our own: the default lowering calls libm ``expf`` once per element on one thread,
about 1 ms of a 1.5B decode step. Here ``exp`` is a polynomial (Cephes' single-precision
expf: range reduction by ln 2, a degree-6 polynomial, exponent bits added back) that
vectorizes, and rows are split over threads. It is elementwise, so batch invariant.
"""
from __future__ import annotations


from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.kernels.attention import SERIAL_BELOW, building_for_cpu

ACT_ATTR = "speccompile.act"  # the gated activation kernel's activation (passes/fuse_gated_projection.py finds it)
LOG2E = 1.44269504088896341
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def fast_exp(x):
    """exp(x) for float32 x, within a few ulp, for |x| <= 87 (inputs are clamped there)."""
    x = T.max(T.min(x, T.float32(87.0)), T.float32(-87.0))
    n = T.round(x * T.float32(LOG2E))
    r = x - n * T.float32(LN2_HI) - n * T.float32(LN2_LO)
    p = T.float32(EXP_POLY[0])
    for c in EXP_POLY[1:]:
        p = p * r + T.float32(c)
    p = p * r * r + r + T.float32(1.0)
    two_n = T.reinterpret("float32", T.shift_left(T.Cast("int32", n) + 127, 23))
    return p * two_n


def _chunk(n: int) -> int:
    for c in (256, 128, 64, 32, 16, 8, 4, 2):
        if n % c == 0:
            return c
    return 1


@kernel_cache
def swiglu(inter: int, dtype: str, act: str = "silu"):
    """out [m, inter] = act(gate[:, :inter]) * up[:, inter:]; the model passes the fused
    gate/up output as both inputs. (Two used inputs also keep relax's RewriteDataflowReshape
    from probing the kernel as a possible reshape, which it cannot do without blocks.)"""
    cpu = building_for_cpu()
    gated = GATED[act]
    ch = _chunk(inter) if cpu else 1  # GPUs: one thread per element
    lanes, per_row = min(16, ch), inter // ch

    @T.macro
    def chunk(gate, up, out, c):
        for v in range(ch // lanes):
            for l in T.vectorized(lanes):
                out[c // per_row, (c % per_row) * ch + v * lanes + l] = T.Cast(dtype, gated(
                    T.Cast("float32", gate[c // per_row, (c % per_row) * ch + v * lanes + l]),
                    T.Cast("float32", up[c // per_row, inter + (c % per_row) * ch + v * lanes + l])))

    @T.prim_func(private=True)
    def kernel(var_gate: T.handle, var_up: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, ACT_ATTR: act})
        m = T.int64()
        gate = T.match_buffer(var_gate, (m, 2 * inter), dtype)
        up = T.match_buffer(var_up, (m, 2 * inter), dtype)
        out = T.match_buffer(var_out, (m, inter), dtype)
        if cpu and m < SERIAL_BELOW:
            for c in range(m * per_row):
                chunk(gate, up, out, c)
        else:
            for c in T.parallel(m * per_row):
                chunk(gate, up, out, c)

    return kernel


def _silu_mul(g, u):
    return g / (T.float32(1.0) + fast_exp(-g)) * u


GELU_C = 0.7978845608028654  # sqrt(2 / pi)


def _gelu_tanh_mul(g, u):
    """0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, with tanh z = 1 - 2 / (e^2z + 1)."""
    z = T.float32(GELU_C) * (g + T.float32(0.044715) * g * g * g)
    tanh = T.float32(1.0) - T.float32(2.0) / (fast_exp(T.float32(2.0) * z) + T.float32(1.0))
    return T.float32(0.5) * g * (T.float32(1.0) + tanh) * u


# act(g) * u per activation name (the config's hidden_act), in fp32: one definition, which the
# fused gate/up projection's epilogue (kernels/gpu_matmul.py) shares with ``swiglu``
GATED = {"silu": _silu_mul, "gelu_pytorch_tanh": _gelu_tanh_mul}
