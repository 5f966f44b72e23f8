"""TIR device PrimFuncs -> GLSL 4.50 compute shaders for the Vulkan runtime.

The conventions (runtime/vulkan implements the other side):

* no descriptor sets: each buffer argument is a 64-bit device address (GL_EXT_buffer_reference);
  the push constants hold the arguments in call order, a buffer as 8 bytes (8-aligned), a 32-bit
  scalar as 4, a 64-bit one as 8 (8-aligned). Past 128 bytes the kernel is "indirect": the push
  constants hold one address of a struct laid out the same way.
* workgroup size = the threadIdx extents (constants); the grid comes from the launch params.
* shared buffers are globals; ``tvm_storage_sync`` is ``memoryBarrier*(); barrier();``.

Addresses are kept as ``uvec2`` (GL_EXT_buffer_reference_uvec2) and turned into typed references
where a buffer is declared: a reference member loaded from a buffer-reference struct gets the
alignment of the referenced type from glslang (spirv-val rejects it), and uvec2 needs no Int64.
The statement half lives here, the expressions in glsl_expr.py.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from tvm import ir, tirx
from tvm.sym.analyzer import Analyzer

from speccompile.compiler.glsl_expr import (DT, HELPER_DEPS, HELPERS, ExprEmitter, VulkanCodegenError, strip_parens,
                                            dtype_of, glsl_type, literal, parse_dtype, ref_type, storage_dt)

__all__ = ["KernelGLSL", "VulkanCodegenError", "emit_kernel", "PUSH_CONSTANT_LIMIT"]

PUSH_CONSTANT_LIMIT = 128  # bytes every Vulkan device guarantees
_THREAD_TAGS = {"threadIdx.x": "gl_LocalInvocationID.x", "threadIdx.y": "gl_LocalInvocationID.y",
                "threadIdx.z": "gl_LocalInvocationID.z", "blockIdx.x": "gl_WorkGroupID.x",
                "blockIdx.y": "gl_WorkGroupID.y", "blockIdx.z": "gl_WorkGroupID.z"}
_SCALAR_ARGS = {"int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8}
# attributes that only guide earlier passes: their body is emitted as is
_IGNORED_ATTRS = {"reduce_scope", "storage_alignment", "compute_scope", "device_scope", "volatile_scope",
                  "storage_scope", "buffer_bound", "coproc_scope", "extern_scope", "buffer_bind_scope"}
_PURE_EVALUATE = {"tirx.assume", "tirx.likely"}
_RESERVED = set("""
attribute const uniform varying buffer shared coherent volatile restrict readonly writeonly atomic_uint layout
centroid flat smooth noperspective patch sample break continue do for while switch case default if else
subroutine in out inout float double int void bool true false invariant precise discard return lowp mediump
highp precision struct common partition active asm class union enum typedef template this resource goto
inline noinline public static extern external interface long short half fixed unsigned superp input output
filter sizeof cast namespace using demote uint main args p d Args Push ArgsRef
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t float16_t float32_t float64_t
abs acos acosh all any asin asinh atan atanh barrier bitCount ceil clamp cos cosh cross degrees determinant
distance dot equal exp exp2 faceforward findLSB findMSB floor fma fract frexp greaterThan inverse
inversesqrt isinf isnan ldexp length lessThan log log2 max memoryBarrier min mix mod modf normalize not
notEqual outerProduct pow radians reflect refract round roundEven sign sin sinh smoothstep sqrt step tan
tanh transpose trunc floatBitsToInt floatBitsToUint intBitsToFloat uintBitsToFloat
""".split())
_TYPE_WORD = re.compile(r"^(?:[iubdf](?:8|16|32|64)?vec[234]|[bdiu]?vec[234]|d?mat[234](?:x[234])?|"
                        r"f(?:16|32|64)mat[234](?:x[234])?|[iu]?(?:sampler|image|texture|subpass)\w*)$")


@dataclass
class BufInfo:
    name: str
    dt: DT  # element type
    scope: str  # "global", "shared" or "local"
    elem_offset: object = None  # a non-zero element offset (TIR expression), or None


@dataclass
class KernelGLSL:
    name: str
    source: str
    args: list[dict]
    arg_bytes: int
    indirect: bool
    launch_params: list[str]
    workgroup_size: list[int]
    shared_bytes: int
    ref_types: list[str] = field(default_factory=list)


def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    name = re.sub(r"_{2,}", "_", name)
    if name[0].isdigit():
        name = "v" + name
    if name.startswith("gl_") or name.startswith("spc_") or name in _RESERVED or _TYPE_WORD.match(name) \
            or name.endswith("Ref"):
        name = "v_" + name
    return name


class KernelEmitter(ExprEmitter):
    def __init__(self, kernel: str, func: tirx.PrimFunc):
        self.kernel, self.func = kernel, func
        self.names: dict = {}  # var handle -> GLSL name (or (text, reads_memory) for a Let written in place)
        self.used: set[str] = set()
        self.buffers: dict = {}  # buffer var handle -> BufInfo
        self.params: dict = {}  # pointer param handle -> text of its address (uvec2)
        self.ana = Analyzer()
        self.helpers: set[str] = set()
        self.refs: set[str] = set()  # reference types used
        self.pre: list[str] = []
        self.cond = 0
        self.loads = False
        self.scopes: list[dict] = [{}]
        self.lines: list[str] = []
        self.indent = 1
        self.shared: list[str] = []
        self.shared_bytes = 0
        self.extents: dict[str, int] = {}

    # ------------------------------------------------------------------ utilities
    def fresh(self, base: str) -> str:
        base = _sanitize(base)
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def declare(self, var, base: str | None = None) -> str:
        name = self.fresh(base or var.name)
        self.names[var.__chandle__()] = name
        return name

    def line(self, text: str):
        self.lines.append("  " * self.indent + text)

    def evaluate(self, e, lane=None) -> str:
        """An expression at statement level: its hoisted lines go out first."""
        self.pre, self.cond, self.loads = [], 0, False
        text = strip_parens(self.expr(e, lane))
        for p in self.pre:
            self.line(p)
        self.pre = []
        return text

    def buffer(self, var) -> BufInfo:
        info = self.buffers.get(var.__chandle__())
        if info is None:
            self.fail(f"accesses {var.name}, which is not a declared buffer")
        return info

    def bind_range(self, var, lo, extent):
        try:
            self.ana.bind(var, ir.Range.from_min_extent(lo, extent))
        except Exception:  # noqa: BLE001 - bounds are only an optimisation
            pass

    # ------------------------------------------------------------------ memory access
    def access(self, buf: BufInfo, index, lane) -> str:
        """The GLSL lvalue of one lane of ``buf[index]``."""
        if buf.elem_offset is not None:
            off = buf.elem_offset
            if isinstance(index, tirx.Ramp):
                index = tirx.Ramp(index.base + tirx.Cast(str(dtype_of(index.base)), off), index.stride,
                                  dtype_of(index).lanes)
            else:
                index = index + tirx.Cast(str(dtype_of(index).scalar), off)
        idt = dtype_of(index).scalar
        if idt.kind not in ("int", "uint"):
            self.fail(f"index of {buf.name} has type {idt}")
        if buf.scope != "global":
            i = strip_parens(self.sub(index, lane))
            return f"{buf.name}[{i if idt == DT('int', 32) else f'int({i})'}]"
        if idt.bits <= 32:
            i = strip_parens(self.sub(index, lane))
            return f"{buf.name}.d[{i if idt.bits == 32 else f'int({i})'}]"
        ref, size = ref_type(buf.dt), storage_dt(buf.dt).bytes
        if lane is None:
            try:
                bound = self.ana.const_int_bound(index)
                if bound.min_value >= 0 and bound.max_value < 2 ** 31:
                    return f"{buf.name}.d[int({strip_parens(self.expr(index))})]"
            except Exception:  # noqa: BLE001
                pass
        # a 64-bit index: GLSL indexes with 32 bits, so step the address instead
        ramp = isinstance(index, tirx.Ramp) and isinstance(index.stride, tirx.IntImm) and lane is not None
        outer, self.loads = self.loads, False
        i = strip_parens(self.expr(index.base) if ramp else self.sub(index, lane))
        reads, self.loads = self.loads, outer | self.loads
        ptr = f"{ref}(uint64_t({buf.name}) + uint64_t({i}) * {size}ul)"
        if not reads or not self.cond:  # an address reading memory is computed where TIR reads it
            ptr = self.hoist(ref, ptr, buf.name + "_at", cache=not reads)
        return f"{ptr}.d[{lane * index.stride.value if ramp else 0}]"

    # ------------------------------------------------------------------ statements
    def stmt(self, s):
        fn = getattr(self, "s_" + type(s).__name__, None)
        if fn is None:
            self.fail(f"cannot translate statement {type(s).__name__}: {s}")
        fn(s)

    def block(self, s):
        self.indent += 1
        self.scopes.append({})
        self.stmt(s)
        self.scopes.pop()
        self.indent -= 1

    def s_SeqStmt(self, s):
        for x in s.seq:
            self.stmt(x)

    def s_Bind(self, s):
        dt = dtype_of(s.var) if isinstance(s.var.ty, ir.PrimType) else None
        if dt is None or dt.lanes != 1:
            self.fail(f"binds {s.var.name} to a value of type {s.var.ty} (only scalars are supported)")
        value = self.evaluate(s.value)
        name = self.declare(s.var)
        self.line(f"{glsl_type(dt)} {name} = {value};")
        try:
            self.ana.bind(s.var, s.value)
        except Exception:  # noqa: BLE001
            pass

    s_LetStmt = s_Bind

    def s_DeclBuffer(self, s):
        var, data = s.buffer, s.data
        bt = var.ty
        dt = parse_dtype(bt.dtype.dtype if isinstance(bt.dtype, ir.PrimType) else bt.dtype)
        if dt.lanes != 1:
            self.fail(f"buffer {var.name} has vector elements ({dt})")
        off = bt.elem_offset
        off = None if off is None or (isinstance(off, tirx.IntImm) and off.value == 0) else off
        if not isinstance(data, ir.Var):
            self.fail(f"buffer {var.name} is declared over {data}, not over a pointer argument or another buffer")
        handle = data.__chandle__()
        if handle in self.params:
            ref = ref_type(dt)
            self.refs.add(ref)
            name = self.fresh(var.name)
            self.line(f"{ref} {name} = {ref}({self.params[handle]});")
            self.buffers[var.__chandle__()] = BufInfo(name, dt, "global", off)
            return
        base = self.buffers.get(handle)
        if base is None:
            self.fail(f"buffer {var.name} is declared over {data.name}, which is neither an argument nor a buffer")
        if base.dt != dt or off is not None or base.elem_offset is not None:
            self.fail(f"buffer {var.name} views {data.name} with another element type or offset")
        self.buffers[var.__chandle__()] = base

    def s_AllocBuffer(self, s):
        var = s.buffer
        bt = var.ty
        dt = parse_dtype(bt.dtype.dtype if isinstance(bt.dtype, ir.PrimType) else bt.dtype)
        scope = str(bt.storage_scope)
        size = 1
        for d in bt.shape:
            if not isinstance(d, tirx.IntImm):
                self.fail(f"{scope} buffer {var.name} has a size known only at run time ({list(bt.shape)})")
            size *= d.value
        if dt.lanes != 1:
            self.fail(f"{scope} buffer {var.name} has vector elements ({dt})")
        name = self.fresh(var.name)
        if scope in ("shared", "shared.dyn"):
            self.shared.append(f"shared {glsl_type(dt)} {name}[{size}];")
            self.shared_bytes += size * max(dt.bytes, 4 if dt.kind == "bool" else 1)
            self.buffers[var.__chandle__()] = BufInfo(name, dt, "shared")
        elif scope == "local":
            self.line(f"{glsl_type(dt)} {name}[{size}];")
            self.buffers[var.__chandle__()] = BufInfo(name, dt, "local")
        else:
            self.fail(f"allocates buffer {var.name} in scope {scope!r} (only shared and local are supported)")

    def s_AttrStmt(self, s):
        key = str(s.attr_key)
        if key == "thread_extent":
            iv = s.node
            tag = str(iv.thread_tag)
            if tag not in _THREAD_TAGS:
                self.fail(f"thread tag {tag!r} is not supported")
            ext = s.value
            if not isinstance(ext, tirx.IntImm):
                ext = self.ana.simplify(ext)
            if tag.startswith("threadIdx"):
                if not isinstance(ext, tirx.IntImm):
                    self.fail(f"the extent of {tag} is not a constant ({s.value}); Vulkan needs the workgroup "
                              "size at compile time")
                if self.extents.get(tag, ext.value) != ext.value:
                    self.fail(f"{tag} is launched with two extents ({self.extents[tag]} and {ext.value})")
                self.extents[tag] = ext.value
            var = iv.var
            dt = dtype_of(var)
            name = self.declare(var)
            self.line(f"{glsl_type(dt)} {name} = {glsl_type(dt)}({_THREAD_TAGS[tag]});")
            self.bind_range(var, 0, ext)
            self.stmt(s.body)
        elif key in _IGNORED_ATTRS or key.startswith("pragma_"):
            self.stmt(s.body)
        else:
            self.fail(f"attribute {key!r} is not supported")

    def s_For(self, s):
        kind = int(s.kind)
        if kind not in (0, 2, 3):  # serial, vectorized (left as a loop), unrolled
            self.fail(f"loop over {s.loop_var.name} of kind {tirx.ForKind(kind).name} cannot run inside a kernel")
        dt = dtype_of(s.loop_var)
        t = glsl_type(dt)
        lo = self.evaluate(s.min)
        if not isinstance(s.min, (tirx.IntImm, ir.Var)):
            tmp = self.fresh(s.loop_var.name + "_lo")
            self.line(f"{t} {tmp} = {lo};")
            lo = tmp
        ext = self.evaluate(s.extent)
        if isinstance(s.min, tirx.IntImm) and s.min.value == 0:
            end = ext
        elif isinstance(s.min, tirx.IntImm) and isinstance(s.extent, tirx.IntImm):
            end = literal(dt, s.min.value + s.extent.value)
        else:
            end = f"{lo} + {ext}"
        if not isinstance(s.extent, (tirx.IntImm, ir.Var)):
            tmp = self.fresh(s.loop_var.name + "_end")
            self.line(f"{t} {tmp} = {end};")
            end = tmp
        step = None if s.step is None else s.step
        if step is not None and not (isinstance(step, tirx.IntImm) and step.value == 1):
            st = self.evaluate(step)
            if not isinstance(step, tirx.IntImm):
                tmp = self.fresh(s.loop_var.name + "_step")
                self.line(f"{t} {tmp} = {st};")
                st = tmp
            incr = f"{{v}} += {st}"
        else:
            incr = "++{v}"
        name = self.declare(s.loop_var)
        self.bind_range(s.loop_var, s.min, s.extent)
        prefix = "[[unroll]] " if kind == 3 else ""
        self.line(f"{prefix}for ({t} {name} = {lo}; {name} < {end}; {incr.format(v=name)}) {{")
        self.block(s.body)
        self.line("}")

    def s_While(self, s):
        self.scopes.append({})  # the condition's temporaries live inside the loop
        cond = self.evaluate_deferred(s.condition)
        if cond[0]:
            self.line("while (true) {")
            self.indent += 1
            for p in cond[0]:
                self.line(p)
            self.line(f"if (!({cond[1]})) break;")
            self.stmt(s.body)
            self.indent -= 1
        else:
            self.line(f"while ({cond[1]}) {{")
            self.block(s.body)
        self.scopes.pop()
        self.line("}")

    def evaluate_deferred(self, e):
        """(hoisted lines, text) of an expression whose lines must not go out yet."""
        self.pre, self.cond, self.loads = [], 0, False
        text = strip_parens(self.expr(e))
        pre, self.pre = self.pre, []
        return pre, text

    def s_IfThenElse(self, s):
        self.line(f"if ({self.evaluate(s.condition)}) {{")
        self.block(s.then_case)
        if s.else_case is not None:
            self.line("} else {")
            self.block(s.else_case)
        self.line("}")

    def s_BufferStore(self, s):
        buf = self.buffer(s.buffer)
        if len(s.indices) != 1:
            self.fail(f"store to {buf.name} with {len(s.indices)} indices (buffers should be flat by now)")
        index, value = s.indices[0], s.value
        lanes = dtype_of(value).lanes
        if dtype_of(index).lanes != lanes:
            self.fail(f"store to {buf.name}: {dtype_of(index).lanes} indices for {lanes} values")
        if lanes == 1:
            v = self.evaluate(value)
            target = self.evaluate_more(lambda: self.access(buf, index, None))
            self.line(f"{target} = {self.stored(buf, v)};")
            return
        # vector store: lane by lane, with every lane's value computed first when it may read
        # what the store overwrites
        self.pre, self.cond, self.loads = [], 0, False
        t = glsl_type(dtype_of(value).scalar)
        temps = []
        direct = self.reads_only_others(value, buf)
        for i in range(lanes):
            text = strip_parens(self.expr(value, i))
            if direct:
                temps.append(text)
                continue
            tmp = self.fresh("lane")
            self.pre.append(f"{t} {tmp} = {text};")
            temps.append(tmp)
        targets = [self.access(buf, index, i) for i in range(lanes)]
        for p in self.pre:
            self.line(p)
        self.pre = []
        for target, tmp in zip(targets, temps):
            self.line(f"{target} = {self.stored(buf, tmp)};")

    def reads_only_others(self, value, buf: BufInfo) -> bool:
        """Whether a vector value is a constant or a load from memory other than ``buf``'s
        (two global buffers may be the same memory, two local or shared ones may not)."""
        if isinstance(value, tirx.Broadcast):
            value = value.value
        if isinstance(value, (tirx.IntImm, tirx.FloatImm, tirx.Ramp)):
            return True
        if not isinstance(value, ir.TensorLoad):
            return False
        src = self.buffer(value.source)
        return src is not buf and not (src.scope == "global" and buf.scope == "global")

    def evaluate_more(self, produce) -> str:
        self.pre, self.cond, self.loads = [], 0, False
        text = produce()
        for p in self.pre:
            self.line(p)
        self.pre = []
        return text

    @staticmethod
    def stored(buf: BufInfo, value: str) -> str:
        if buf.dt.kind == "bool" and buf.scope == "global":
            return f"uint8_t(({value}) ? 1 : 0)"
        return value

    def s_Evaluate(self, s):
        v = s.value
        if isinstance(v, (tirx.IntImm, tirx.FloatImm)):
            return
        if isinstance(v, ir.Call) and v.op.name == "tirx.tvm_storage_sync":
            scope = v.args[0].value
            if scope in ("shared", "shared.dyn"):
                self.line("memoryBarrierShared(); barrier();")
            elif scope == "global":
                self.line("memoryBarrierBuffer(); barrier();")
            else:
                self.fail(f"tvm_storage_sync({scope!r}) is not supported (warp size is 1 on Vulkan)")
            return
        if isinstance(v, ir.Call) and str(v.op.name).replace("prim.", "tirx.", 1) in _PURE_EVALUATE:
            return
        self.fail(f"cannot translate statement {v}")

    def s_Break(self, s):
        self.line("break;")

    def s_Continue(self, s):
        self.line("continue;")

    def s_AssertStmt(self, s):
        self.fail(f"assertion inside a kernel is not supported: {s}")

    # ------------------------------------------------------------------ the kernel
    def run(self) -> KernelGLSL:
        func = self.func
        attrs = func.attrs
        launch = [str(x) for x in (attrs["tirx.kernel_launch_params"] if attrs is not None and
                                   "tirx.kernel_launch_params" in attrs else [])]
        for tag in launch:
            if tag not in _THREAD_TAGS:
                self.fail(f"launch parameter {tag!r} is not supported (dynamic shared memory needs a constant size)")
        args, members, offset = [], [], 0
        member_names: set[str] = set()

        def member_name(name: str) -> str:  # block members have their own namespace
            base = name = _sanitize(name)
            i = 0
            while name in member_names:
                i += 1
                name = f"{base}_{i}"
            member_names.add(name)
            return name

        for p in func.params:
            if isinstance(p.ty, ir.PointerType):
                offset = (offset + 7) // 8 * 8
                member = member_name(p.name)
                args.append({"kind": "buffer", "offset": offset})
                members.append((offset, "uvec2", member, p, None))
                offset += 8
            elif isinstance(p.ty, ir.PrimType) and str(p.ty.dtype) in _SCALAR_ARGS:
                size = _SCALAR_ARGS[str(p.ty.dtype)]
                offset = (offset + size - 1) // size * size
                member = member_name(p.name)
                args.append({"kind": "scalar", "dtype": str(p.ty.dtype), "offset": offset})
                members.append((offset, glsl_type(parse_dtype(p.ty.dtype)), member, p, p.ty.dtype))
                offset += size
            else:
                self.fail(f"argument {p.name} of type {p.ty} is not supported (buffers and "
                          f"{', '.join(_SCALAR_ARGS)} scalars are)")
        indirect = offset > PUSH_CONSTANT_LIMIT
        holder = "p.a" if indirect else "args"
        for off, t, member, p, scalar in members:
            if scalar is None:
                self.params[p.__chandle__()] = f"{holder}.{member}"
            else:
                name = self.declare(p)
                self.line(f"{t} {name} = {holder}.{member};")
        self.stmt(func.body)
        wg = [self.extents.get(f"threadIdx.{a}", 1) for a in "xyz"]
        body = [f"layout(offset = {off}) {t} {m};" for off, t, m, _, _ in members]
        out = ["#version 450",
               "#extension GL_EXT_buffer_reference : require",
               "#extension GL_EXT_buffer_reference_uvec2 : require",
               "#extension GL_EXT_shader_explicit_arithmetic_types : require",
               "#extension GL_EXT_shader_16bit_storage : require",
               "#extension GL_EXT_shader_8bit_storage : require",
               "#extension GL_EXT_control_flow_attributes : require",
               f"// kernel {self.kernel}: launch {', '.join(launch)}; arguments {offset} bytes"
               + (" (indirect)" if indirect else ""),
               f"layout(local_size_x = {wg[0]}, local_size_y = {wg[1]}, local_size_z = {wg[2]}) in;"]
        for ref in sorted(self.refs):
            dt = {"F": "float", "I": "int", "U": "uint"}[ref[0]]
            st = DT(dt, int(ref[1:-3]))
            out.append(f"layout(buffer_reference, std430, buffer_reference_align = {st.bytes}) "
                       f"buffer {ref} {{ {glsl_type(st)} d[]; }};")
        if members and indirect:
            out.append("layout(buffer_reference, std430, buffer_reference_align = 8) buffer ArgsRef {")
            out += ["  " + b for b in body] + ["};", "layout(push_constant, std430) uniform Push { ArgsRef a; } p;"]
        elif members:
            out += ["layout(push_constant, std430) uniform Args {"] + ["  " + b for b in body] + ["} args;"]
        out += self.shared
        done: set[str] = set()
        for key in sorted(self.helpers):
            for h in HELPER_DEPS.get(key, []) + [key]:
                if h not in done:
                    done.add(h)
                    out.append(HELPERS[h].rstrip())
        out += ["void main() {"] + self.lines + ["}", ""]
        return KernelGLSL(self.kernel, "\n".join(out), args, offset, indirect, launch, wg, self.shared_bytes,
                          sorted(self.refs))


def emit_kernel(name: str, func: tirx.PrimFunc) -> KernelGLSL:
    """GLSL for one device PrimFunc; VulkanCodegenError names the kernel and the construct it refused."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # deeply nested expressions (polynomials, index math)
    try:
        return KernelEmitter(name, func).run()
    except RecursionError:
        raise VulkanCodegenError(f"kernel {name}: expression nesting too deep to translate") from None
    finally:
        sys.setrecursionlimit(limit)
