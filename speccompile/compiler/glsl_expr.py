"""TIR expressions -> GLSL 4.50 (the expression half of glsl.py's emitter).

Vectors (Ramp, Broadcast, ``float32x8`` values) are emitted lane by lane: every method takes
``lane`` (None for a scalar expression) and returns the GLSL text of that one lane. Integer
division follows TIR (truncating Div/Mod, flooring FloorDiv/FloorMod), through helper functions
unless both operands are provably non-negative. A ``Let`` is hoisted into a statement before the
one being emitted, unless it sits under a condition (``?:``, ``&&``, ``||``) and reads memory:
then its value is written out where it is used, so no load runs that TIR would not run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from tvm import ir, tirx


class VulkanCodegenError(RuntimeError):
    """A kernel that cannot be translated to GLSL, or whose shader failed to build."""


# ----------------------------------------------------------------------------- dtypes
@dataclass(frozen=True)
class DT:
    kind: str  # "int", "uint", "float", "bool"
    bits: int
    lanes: int = 1

    @property
    def scalar(self) -> "DT":
        return DT(self.kind, self.bits)

    @property
    def bytes(self) -> int:
        return 1 if self.kind == "bool" else self.bits // 8

    def __str__(self) -> str:
        base = "bool" if self.kind == "bool" else f"{self.kind}{self.bits}"
        return base if self.lanes == 1 else f"{base}x{self.lanes}"


_DTYPE = re.compile(r"^(int|uint|float|bool)(\d*)(?:x(\d+))?$")
_GLSL_TYPES = {("bool", 1): "bool", ("int", 8): "int8_t", ("int", 16): "int16_t", ("int", 32): "int",
               ("int", 64): "int64_t", ("uint", 8): "uint8_t", ("uint", 16): "uint16_t", ("uint", 32): "uint",
               ("uint", 64): "uint64_t", ("float", 16): "float16_t", ("float", 32): "float"}


def parse_dtype(text) -> DT:
    m = _DTYPE.match(str(text))
    if not m:
        raise VulkanCodegenError(f"data type {text} has no GLSL equivalent here")
    kind, bits, lanes = m.group(1), int(m.group(2) or 1), int(m.group(3) or 1)
    if (kind, bits) not in _GLSL_TYPES:
        raise VulkanCodegenError(f"data type {text} has no GLSL equivalent here "
                                 "(float64 and bfloat16 are not supported)")
    return DT(kind, bits, lanes)


def dtype_of(e) -> DT:
    ty = e.ty
    if not isinstance(ty, ir.PrimType):
        raise VulkanCodegenError(f"expression of type {ty} (not a primitive value): {e}")
    return parse_dtype(ty.dtype)


def glsl_type(dt: DT) -> str:
    if dt.lanes != 1:
        raise VulkanCodegenError(f"internal: vector type {dt} reached a scalar declaration")
    return _GLSL_TYPES[(dt.kind, dt.bits)]


def storage_dt(dt: DT) -> DT:
    """How a value of ``dt`` is stored in device memory (bool as one byte, like TVM)."""
    return DT("uint", 8) if dt.kind == "bool" else dt.scalar


def ref_type(dt: DT) -> str:
    st = storage_dt(dt)
    return {"int": "I", "uint": "U", "float": "F"}[st.kind] + f"{st.bits}Ref"


def literal(dt: DT, value) -> str:
    t = dt.scalar
    if t.kind == "bool":
        return "true" if value else "false"
    if t.kind == "float":
        v = float(value)
        if np.isnan(v):
            text = "uintBitsToFloat(0x7fc00000u)"
        elif np.isinf(v):
            text = "uintBitsToFloat(0xff800000u)" if v < 0 else "uintBitsToFloat(0x7f800000u)"
        else:
            text = repr(float(np.float32(v))) if t.bits == 32 else repr(float(v))
            if "e" not in text and "." not in text:
                text += ".0"
            if v < 0 or (v == 0 and np.signbit(v)):
                text = f"({text if text.startswith('-') else '-' + text})"
        return text if t.bits == 32 else f"float16_t({text})"
    v = int(value)
    if t.bits in (8, 16):
        return f"{glsl_type(t)}({v})"
    if t.kind == "uint":
        return f"{v % (1 << t.bits)}u" + ("l" if t.bits == 64 else "")
    suffix = "l" if t.bits == 64 else ""
    if v == -(1 << (t.bits - 1)):
        return f"(-{(1 << (t.bits - 1)) - 1}{suffix} - 1{suffix})"
    return f"({v}{suffix})" if v < 0 else f"{v}{suffix}"


# ---------------------------------------------------------------------- helper library
# name -> GLSL source; the emitter includes those a kernel uses (after the ones they call)
_INT_HELPERS = """\
{T} spc_fdiv({T} a, {T} b) {{ {T} q = a / b; return (q * b != a && ((a < {Z}) != (b < {Z}))) ? q - {O} : q; }}
{T} spc_fmod({T} a, {T} b) {{ {T} r = a - (a / b) * b; return (r != {Z} && ((r < {Z}) != (b < {Z}))) ? r + b : r; }}
{T} spc_tmod({T} a, {T} b) {{ return a - (a / b) * b; }}
"""
HELPERS = {
    "int_i32": _INT_HELPERS.format(T="int", Z="0", O="1"),
    "int_i64": _INT_HELPERS.format(T="int64_t", Z="0l", O="1l"),
    # sin/cos: reduce to [-pi, pi] first (Cody-Waite, 2*pi = 6.28125 + 1.9353071795864769e-3): Vulkan
    # only bounds their error there, and RoPE angles reach thousands of radians
    "trig": """\
float spc_reduce(float x) {
  float k = roundEven(x * 0.15915494309189535);
  return (x - k * 6.28125) - k * 1.9353071795864769e-3;
}
float spc_sin(float x) { return sin(spc_reduce(x)); }
float spc_cos(float x) { return cos(spc_reduce(x)); }
float spc_tan(float x) { return tan(spc_reduce(x)); }
float16_t spc_sin(float16_t x) { return float16_t(spc_sin(float(x))); }
float16_t spc_cos(float16_t x) { return float16_t(spc_cos(float(x))); }
float16_t spc_tan(float16_t x) { return float16_t(spc_tan(float(x))); }
""",
    # C's powf: GLSL's pow is undefined for x < 0 and for x == 0, y <= 0
    "pow": """\
float spc_pow(float x, float y) {
  if (x > 0.0) return pow(x, y);
  if (y == 0.0) return 1.0;
  if (x == 0.0) return y > 0.0 ? 0.0 : uintBitsToFloat(0x7f800000u);
  if (isnan(x) || floor(y) != y) return uintBitsToFloat(0x7fc00000u);
  float r = pow(-x, y);
  return mod(y, 2.0) == 1.0 ? -r : r;
}
float16_t spc_pow(float16_t x, float16_t y) { return float16_t(spc_pow(float(x), float(y))); }
""",
    # C's roundf (halves away from zero; GLSL's round may pick either way)
    "round": """\
float spc_round(float x) { float t = trunc(x); return abs(x - t) >= 0.5 ? t + sign(x) : t; }
float16_t spc_round(float16_t x) { return float16_t(spc_round(float(x))); }
""",
    # tanh: GLSL's may give NaN for large |x| (inf / inf); tanh(+-15) is +-1 in float32
    "tanh": """\
float spc_tanh(float x) { return tanh(clamp(x, -15.0, 15.0)); }
float16_t spc_tanh(float16_t x) { return float16_t(spc_tanh(float(x))); }
""",
    # NaN/Inf tests on the bits, which a driver's fast-math cannot fold away
    "fpclass": """\
bool spc_isnan(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }
bool spc_isinf(float x) { return (floatBitsToUint(x) & 0x7fffffffu) == 0x7f800000u; }
bool spc_isnan(float16_t x) { return (uint(float16BitsToUint16(x)) & 0x7fffu) > 0x7c00u; }
bool spc_isinf(float16_t x) { return (uint(float16BitsToUint16(x)) & 0x7fffu) == 0x7c00u; }
""",
    "fminmax": """\
float spc_fmax(float a, float b) { return spc_isnan(a) ? b : spc_isnan(b) ? a : max(a, b); }
float spc_fmin(float a, float b) { return spc_isnan(a) ? b : spc_isnan(b) ? a : min(a, b); }
float16_t spc_fmax(float16_t a, float16_t b) { return spc_isnan(a) ? b : spc_isnan(b) ? a : max(a, b); }
float16_t spc_fmin(float16_t a, float16_t b) { return spc_isnan(a) ? b : spc_isnan(b) ? a : min(a, b); }
""",
    "copysign": """\
float spc_copysign(float a, float b) {
  return uintBitsToFloat((floatBitsToUint(a) & 0x7fffffffu) | (floatBitsToUint(b) & 0x80000000u));
}
""",
}
HELPER_DEPS = {"fminmax": ["fpclass"]}

# math functions: TIR name (extern "expf"/"exp"/"hexp" or op "tirx.exp") -> (GLSL, arity, helper)
_MATH = {
    "exp": ("exp", 1, None), "exp2": ("exp2", 1, None), "log": ("log", 1, None), "log2": ("log2", 1, None),
    "sqrt": ("sqrt", 1, None), "rsqrt": ("inversesqrt", 1, None), "fabs": ("abs", 1, None),
    "floor": ("floor", 1, None), "ceil": ("ceil", 1, None), "trunc": ("trunc", 1, None),
    "nearbyint": ("roundEven", 1, None), "rint": ("roundEven", 1, None), "round": ("spc_round", 1, "round"),
    "sin": ("spc_sin", 1, "trig"), "cos": ("spc_cos", 1, "trig"), "tan": ("spc_tan", 1, "trig"),
    "asin": ("asin", 1, None), "acos": ("acos", 1, None), "atan": ("atan", 1, None), "atan2": ("atan", 2, None),
    "sinh": ("sinh", 1, None), "cosh": ("cosh", 1, None), "tanh": ("spc_tanh", 1, "tanh"),
    "pow": ("spc_pow", 2, "pow"), "fmax": ("spc_fmax", 2, "fminmax"), "fmin": ("spc_fmin", 2, "fminmax"),
    "copysign": ("spc_copysign", 2, "copysign"),
}
_SPECIAL_MATH = {"log10", "sigmoid", "exp10", "isnan", "isinf", "isfinite"}


def _math_key(name: str) -> str | None:
    for key in (name, name[:-1] if name.endswith("f") else None, name[1:] if name.startswith("h") else None):
        if key and (key in _MATH or key in _SPECIAL_MATH):
            return key
    return None


_BINOPS = {"Add": "+", "Sub": "-", "Mul": "*", "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^",
           "LShift": "<<", "RShift": ">>", "EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">",
           "GE": ">=", "And": "&&", "Or": "||"}
_OP_BINOPS = {"tirx.shift_left": "<<", "tirx.shift_right": ">>", "tirx.bitwise_and": "&",
              "tirx.bitwise_or": "|", "tirx.bitwise_xor": "^"}


def strip_parens(text: str) -> str:
    """Drop one pair of enclosing parentheses (when they match each other)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1]


class ExprEmitter:
    """The expression methods of the kernel emitter (glsl.py's KernelEmitter adds statements).

    Subclasses provide: ``self.kernel`` (name for errors), ``self.names`` (var handle -> GLSL
    name), ``self.params`` (pointer argument handles), ``self.buffer(var)`` and
    ``self.access(buf, index, lane)`` (memory), ``self.ana`` (an Analyzer),
    ``self.fresh(base)`` (a unique name), ``self.helpers`` (set of helper keys used),
    ``self.pre`` (lines to emit before the current statement), ``self.scopes`` (the reusable
    temporaries of each open block), ``self.cond`` (> 0 under a condition) and ``self.loads``
    (set when the text being built reads memory)."""

    def hoist(self, glsl_ty: str, text: str, base: str, cache: bool = True) -> str:
        """A temporary declared before the current statement; one whose value reads no memory
        is reused while it is in scope (``self.scopes``: one dict per open GLSL block)."""
        key = (glsl_ty, text)
        if cache:
            for scope in reversed(self.scopes):
                if key in scope:
                    return scope[key]
        name = self.fresh(base)
        self.pre.append(f"{glsl_ty} {name} = {text};")
        if cache:
            self.scopes[-1][key] = name
        return name

    def fail(self, what: str):
        raise VulkanCodegenError(f"kernel {self.kernel}: {what}")

    # -- entry points
    def expr(self, e, lane: int | None = None) -> str:
        kind = type(e).__name__
        if kind in _BINOPS:
            return self._binop(e, lane, _BINOPS[kind])
        fn = getattr(self, "e_" + kind, None)
        if fn is None:
            self.fail(f"cannot translate expression {type(e).__name__}: {e}")
        return fn(e, lane)

    def sub(self, e, lane):
        """A child that may be a vector (takes the lane) or a scalar (lane ignored)."""
        return self.expr(e, lane if dtype_of(e).lanes > 1 else None)

    def guarded(self, e, lane) -> str:
        """A child evaluated only under a condition."""
        self.cond += 1
        try:
            return self.sub(e, lane)
        finally:
            self.cond -= 1

    # -- leaves
    def e_IntImm(self, e, lane):
        return literal(dtype_of(e), e.value)

    def e_FloatImm(self, e, lane):
        return literal(dtype_of(e), e.value)

    def e_Var(self, e, lane):
        name = self.names.get(e.__chandle__())
        if name is None:
            if e.__chandle__() in self.params:
                self.fail(f"uses the address of buffer argument {e.name} as a value")
            self.fail(f"uses variable {e.name}, which is not defined in the kernel")
        if isinstance(name, tuple):  # a Let written out at its uses: (text, reads_memory)
            self.loads |= name[1]
            return name[0]
        return name

    # -- arithmetic
    def _binop(self, e, lane, op):
        if op in ("&", "|", "^") and dtype_of(e).kind == "bool":
            op = {"&": "&&", "|": "||", "^": "^^"}[op]  # GLSL has no bitwise operators on bool
        a = self.sub(e.a, lane)
        b = self.guarded(e.b, lane) if op in ("&&", "||") else self.sub(e.b, lane)
        return f"({a} {op} {b})"

    def _nonneg(self, e) -> bool:
        try:
            if self.ana.const_int_bound(e).min_value >= 0:
                return True
            return bool(self.ana.can_prove(e >= 0))
        except Exception:  # noqa: BLE001 - the analyzer refusing an expression just means "unknown"
            return False

    def _int_division(self, e, lane, kind):
        dt = dtype_of(e).scalar
        a, b = self.sub(e.a, lane), self.sub(e.b, lane)
        if dt.kind == "uint":
            return f"({a} {'/' if kind in ('Div', 'FloorDiv') else '%'} {b})"
        bval = e.b.value if isinstance(e.b, tirx.IntImm) else None
        if kind in ("FloorDiv", "FloorMod") and bval is not None and bval > 0 and bval & (bval - 1) == 0:
            if kind == "FloorDiv":
                return f"({a} >> {literal(dt, bval.bit_length() - 1)})"
            return f"({a} & {literal(dt, bval - 1)})"
        simple = dtype_of(e).lanes == 1 and self._nonneg(e.a) and (bval is not None and bval > 0 or self._nonneg(e.b))
        if kind in ("Div", "FloorDiv") and (kind == "Div" or simple):
            return f"({a} / {b})"  # SPIR-V OpSDiv truncates; equal to floor when both are >= 0
        if simple:
            return f"({a} % {b})"
        helper = {"FloorDiv": "spc_fdiv", "FloorMod": "spc_fmod", "Mod": "spc_tmod"}[kind]
        if dt.bits == 64:
            self.helpers.add("int_i64")
            return f"{helper}({a}, {b})"
        self.helpers.add("int_i32")
        if dt.bits == 32:
            return f"{helper}({a}, {b})"
        return f"{glsl_type(dt)}({helper}(int({a}), int({b})))"

    def _division(self, e, lane, kind):
        dt = dtype_of(e)
        if dt.kind in ("int", "uint"):
            return self._int_division(e, lane, kind)
        a, b = self.sub(e.a, lane), self.sub(e.b, lane)
        if kind == "Div":
            return f"({a} / {b})"
        if kind == "FloorDiv":
            return f"floor({a} / {b})"
        if kind == "FloorMod":
            return f"({a} - floor({a} / {b}) * {b})"
        self.fail(f"floating-point Mod (C fmod) is not supported: {e}")

    def e_Div(self, e, lane):
        return self._division(e, lane, "Div")

    def e_Mod(self, e, lane):
        return self._division(e, lane, "Mod")

    def e_FloorDiv(self, e, lane):
        return self._division(e, lane, "FloorDiv")

    def e_FloorMod(self, e, lane):
        return self._division(e, lane, "FloorMod")

    def e_Min(self, e, lane):
        return f"min({strip_parens(self.sub(e.a, lane))}, {strip_parens(self.sub(e.b, lane))})"

    def e_Max(self, e, lane):
        return f"max({strip_parens(self.sub(e.a, lane))}, {strip_parens(self.sub(e.b, lane))})"

    def e_Not(self, e, lane):
        return f"(!{self.sub(e.a, lane)})"

    def e_BitwiseNot(self, e, lane):
        return f"(~{self.sub(e.a, lane)})"

    def e_Select(self, e, lane):
        c = self.sub(e.condition, lane)
        return f"({c} ? {self.guarded(e.true_value, lane)} : {self.guarded(e.false_value, lane)})"

    def e_Cast(self, e, lane):
        to, frm = dtype_of(e).scalar, dtype_of(e.value).scalar
        v = self.sub(e.value, lane)
        if to == frm:
            return v
        if to.kind == "bool":
            return f"({v} != {literal(frm, 0)})"
        if frm.kind == "bool":
            return f"({v} ? {literal(to, 1)} : {literal(to, 0)})"
        return f"{glsl_type(to)}({strip_parens(v)})"

    # -- vectors
    def e_Ramp(self, e, lane):
        if lane is None:
            self.fail(f"vector {e} used where a scalar is expected")
        dt = dtype_of(e).scalar
        if isinstance(e.base, tirx.IntImm) and isinstance(e.stride, tirx.IntImm):
            return literal(dt, e.base.value + lane * e.stride.value)
        base = self.expr(e.base)
        if lane == 0:
            return base
        if isinstance(e.stride, tirx.IntImm):
            return f"({base} + {literal(dt, lane * e.stride.value)})"
        return f"({base} + {literal(dt, lane)} * {self.expr(e.stride)})"

    def e_Broadcast(self, e, lane):
        return self.expr(e.value)

    def e_Shuffle(self, e, lane):
        if lane is None:
            lane = 0
        idx = e.indices[lane]
        if not isinstance(idx, tirx.IntImm):
            self.fail(f"Shuffle with a computed index: {e}")
        k = idx.value
        for v in e.vectors:
            n = dtype_of(v).lanes
            if k < n:
                return self.expr(v, k if n > 1 else None)
            k -= n
        self.fail(f"Shuffle index out of range: {e}")

    # -- Let
    def e_Let(self, e, lane):
        if dtype_of(e.value).lanes > 1:
            self.fail(f"Let of a vector value: {e}")
        outer = self.loads
        self.loads = False
        value = self.expr(e.value)
        reads, self.loads = self.loads, outer | self.loads
        key = e.var.__chandle__()
        saved = self.names.get(key)
        if self.cond and reads:
            self.names[key] = (f"({strip_parens(value)})", True)
        else:
            self.names[key] = self.hoist(glsl_type(dtype_of(e.var)), strip_parens(value), e.var.name, cache=not reads)
        try:
            return self.sub(e.body, lane)
        finally:
            if saved is None:
                self.names.pop(key, None)
            else:
                self.names[key] = saved

    # -- memory
    def e_TensorLoad(self, e, lane):
        self.loads = True
        buf = self.buffer(e.source)
        if len(e.indices) != 1:
            self.fail(f"load from {buf.name} with {len(e.indices)} indices (buffers should be flat by now)")
        text = self.access(buf, e.indices[0], lane)
        if buf.dt.kind == "bool" and buf.scope == "global":
            return f"({text} != uint8_t(0))"
        return text

    # -- calls
    def e_Call(self, e, lane):
        op = str(e.op.name)
        if op.startswith("prim."):
            op = "tirx." + op[5:]
        args = list(e.args)
        if op == "tirx.if_then_else":
            c = self.sub(args[0], lane)
            return f"({c} ? {self.guarded(args[1], lane)} : {self.guarded(args[2], lane)})"
        if op == "tirx.likely":
            return self.sub(args[0], lane)
        if op == "tirx.reinterpret":
            return self.reinterpret(e, args[0], lane)
        if op in _OP_BINOPS:
            return f"({self.sub(args[0], lane)} {_OP_BINOPS[op]} {self.sub(args[1], lane)})"
        if op == "tirx.bitwise_not":
            return f"(~{self.sub(args[0], lane)})"
        if op in ("tirx.call_pure_extern", "tirx.call_extern"):
            name = args[0].value
            return self.math(e, name, args[1:], lane, f"extern function {name!r}")
        if op == "tirx.popcount":
            return self.int_intrinsic(e, "bitCount", args[0], lane)
        if op == "tirx.clz":
            dt = dtype_of(args[0]).scalar
            if dt.bits != 32:
                self.fail(f"clz of {dt} is not supported")
            return f"{glsl_type(dtype_of(e).scalar)}(31 - findMSB(uint({strip_parens(self.sub(args[0], lane))})))"
        if op.startswith("tirx."):
            return self.math(e, op[5:], args, lane, f"intrinsic {op}")
        self.fail(f"cannot translate call to {op}: {e}")

    def int_intrinsic(self, e, fn, arg, lane):
        dt = dtype_of(arg).scalar
        if dt.bits != 32:
            self.fail(f"{fn} of {dt} is not supported")
        return f"{glsl_type(dtype_of(e).scalar)}({fn}({strip_parens(self.sub(arg, lane))}))"

    def math(self, e, name, args, lane, what):
        key = _math_key(name)
        dt = dtype_of(e).scalar
        if key is None:
            self.fail(f"cannot translate {what} ({e})")
        if key in ("isnan", "isinf", "isfinite"):
            adt = dtype_of(args[0]).scalar
            x = strip_parens(self.sub(args[0], lane))
            if adt.kind != "float":
                return "false" if key != "isfinite" else "true"
            self.helpers.add("fpclass")
            if key == "isfinite":
                return f"(!spc_isnan({x}) && !spc_isinf({x}))"
            return f"spc_{key}({x})"
        if dt.kind != "float":
            self.fail(f"{what} on {dt} values is not supported")
        xs = [strip_parens(self.sub(a, lane)) for a in args]
        if key == "log10":
            return f"(log2({xs[0]}) * {literal(dt, 0.30102999566398120)})"
        if key == "exp10":
            return f"exp2({xs[0]} * {literal(dt, 3.3219280948873622)})"
        if key == "sigmoid":
            return f"({literal(dt, 1.0)} / ({literal(dt, 1.0)} + exp(-({xs[0]}))))"
        fn, arity, helper = _MATH[key]
        if len(xs) != arity:
            self.fail(f"{what} takes {arity} arguments, got {len(xs)}")
        if helper:
            self.helpers.add(helper)
            for dep in HELPER_DEPS.get(helper, []):
                self.helpers.add(dep)
        return f"{fn}({', '.join(xs)})"

    def reinterpret(self, e, arg, lane):
        to, frm = dtype_of(e), dtype_of(arg)
        if to.lanes != frm.lanes:
            self.fail(f"reinterpret between {frm} and {to} (different lane counts) is not supported")
        to, frm = to.scalar, frm.scalar
        x = strip_parens(self.sub(arg, lane))
        if to.bits != frm.bits:
            self.fail(f"reinterpret from {frm} to {to} (different sizes)")
        if to == frm:
            return x
        fns = {("float32", "int32"): "floatBitsToInt", ("float32", "uint32"): "floatBitsToUint",
               ("int32", "float32"): "intBitsToFloat", ("uint32", "float32"): "uintBitsToFloat",
               ("float16", "int16"): "float16BitsToInt16", ("float16", "uint16"): "float16BitsToUint16",
               ("int16", "float16"): "int16BitsToFloat16", ("uint16", "float16"): "uint16BitsToFloat16"}
        fn = fns.get((str(frm), str(to)))
        if fn is not None:
            return f"{fn}({x})"
        if frm.kind in ("int", "uint") and to.kind in ("int", "uint"):
            return f"{glsl_type(to)}({x})"  # same width: GLSL keeps the bits
        self.fail(f"reinterpret from {frm} to {to} is not supported")
