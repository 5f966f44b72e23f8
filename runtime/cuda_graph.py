"""CUDA graphs of a model's forwards: one launch per step instead of one per kernel.

Why. A SmolLM2-135M decode step on the H200 took 3.6 ms of wall time for 0.75 ms of device
time: the relax VM's dispatch of ~280 kernels and their launches, one after another from
the host. A captured graph replays all of them with a single ``cuGraphLaunch``, so a step
costs its device time plus one upload and one launch.

What makes a replay compute the same thing as the call it was captured from:
- **Intermediates.** A cuda library built with ``_metadata["cuda_graph"]`` had its planned
  intermediates lifted into one allocation per VM (passes/pipeline.py), so the addresses a
  graph captured stay the forward's own for the model's lifetime.
- **Inputs.** Each graph owns its per-call arrays (token ids, the forward's metadata), one
  device tensor each, refilled before each launch by asynchronous host-to-device copies on
  the stream the graph is launched on: they land after the last launch read the old
  contents and before this one reads the new, with no synchronisation.
- **Outputs** (the embedding, the step's logits or hidden states) come from the VM's pooled
  allocator on every call, which hands out the block of a size freed last. The graphs of a
  model share blocks, kept here per output class (dtype and row width; each class has one
  planned size): a capture lets the kept blocks go, the last first, so its own call takes
  the same blocks back in order (the VM keeps its last call's result until its next call,
  so a ``flush`` call that allocates nothing comes between); then the model's ``reserve`` call of each class (an
  embedding for hidden-state rows, a get_logits for logits, ``max_rows`` rows) takes them
  again, as tensors big enough to view any graph's outputs, and keeps them. Were another
  block to come back, the graphs captured earlier would write memory the pool may give to
  someone else: they are dropped. An output the compiler placed in the lifted allocation
  (forward_tokens_hidden's hidden states) is the VM's own and needs no block. A result holds
  until the next forward of the model (a step reads its logits within the step, as with
  Uploads).
- **Shapes** are fixed per graph: the key is the entry point, the shapes of its arrays and
  the KV tensor's address; runtime/model.py pads the page table to a fixed width, so a
  sequence keeps one decode graph as it grows. Forwards of more than ``max_rows`` rows
  (prompt chunks) run as before: launches are a small share of their time.
- **When:** a shape's graph is captured at its second use (``CAPTURE_AT``); its first runs as
  a call. A capture costs about five forwards (two uncaptured calls, the recording, the
  reserve calls, the checked replay) plus instantiation, and a one-shot process meets shapes
  it forwards only once (a verify of a draft length met once) beside the few it forwards
  dozens of times (decode, the usual verify): capturing on first sight paid a capture for
  each once-used shape; now a shape used twice or more pays one call more.
- **Checked:** a new graph's first replay must give the bits of the uncaptured call on the
  same inputs (the kernels are deterministic), or it is not used.
Any failure to capture turns graphs off for the model (with one warning) and the call runs
as before: the same kernels, so the same bits.
"""
from __future__ import annotations

import ctypes
import time
import warnings
from typing import Any, Callable

import numpy as np

import tvm

CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2  # allocations by the pool during a capture are not errors
KDL_CUDA = 2


class GraphError(RuntimeError):
    pass


class _Driver:
    """The few CUDA driver calls a capture needs, and TVM's stream switch (tvm-ffi's C API)."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        try:
            self.ffi = ctypes.CDLL(None)
            self.ffi.TVMFFIEnvSetStream  # noqa: B018 -- exported by the already-loaded libtvm_ffi
        except AttributeError:
            import tvm_ffi.libinfo

            self.ffi = ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi())
        vp = ctypes.c_void_p
        self.ffi.TVMFFIEnvSetStream.argtypes = [ctypes.c_int32, ctypes.c_int32, vp, ctypes.POINTER(vp)]
        self.ffi.TVMFFIEnvGetStream.argtypes = [ctypes.c_int32, ctypes.c_int32]
        self.ffi.TVMFFIEnvGetStream.restype = vp

    def check(self, rc: int, what: str) -> None:
        if rc:
            msg = ctypes.c_char_p()
            self.cu.cuGetErrorString(rc, ctypes.byref(msg))
            raise GraphError(f"{what}: CUDA error {rc} ({(msg.value or b'?').decode()})")

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self.check(self.cu.cuStreamCreate(ctypes.byref(s), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return s

    def set_stream(self, device_id: int, stream) -> ctypes.c_void_p:
        old = ctypes.c_void_p()
        if self.ffi.TVMFFIEnvSetStream(KDL_CUDA, device_id, stream, ctypes.byref(old)):
            raise GraphError("TVMFFIEnvSetStream failed")
        return old


class _Graph:
    """One captured forward: its executable graph, its own input tensors, and where each of its
    outputs sits among the kept blocks ((class, index) per output)."""

    def __init__(self, driver: _Driver, inputs: list):
        self.driver, self.inputs = driver, inputs
        self.ptrs = [t.data_ptr() for t in inputs]
        self.exe = None
        self.slots: list[tuple[tuple | None, int]] = []  # (None, i): output i in g.persistent
        self.persistent: dict[int, Any] = {}  # outputs in the VM's lifted allocation, as captured
        self.out_shapes: list[tuple] = []
        self.outs: list | None = None  # views of the kept blocks, remade after a capture

    def upload(self, cu, arrays: list[np.ndarray]) -> None:
        for ptr, a in zip(self.ptrs, arrays):
            a = np.ascontiguousarray(a)
            if a.nbytes:  # pageable source: copied to a staging buffer before the call returns
                rc = cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(ptr), a.ctypes.data_as(ctypes.c_void_p),
                                             ctypes.c_size_t(a.nbytes), None)
                if rc:
                    self.driver.check(rc, "cuMemcpyHtoDAsync")

    def destroy(self) -> None:
        if self.exe:
            self.driver.cu.cuGraphExecDestroy(self.exe)
            self.exe = None


def _out_class(t) -> tuple:
    return str(t.dtype), int(t.shape[-1])


def _free(tensors: list) -> None:
    """Drop tensors the last first: the pool's free list of a class then has the first on top."""
    while tensors:
        tensors.pop()


class CudaGraphs:
    """The captured forwards of one model (see the module's docstring). ``enabled`` may be
    switched off and on (graphs are kept); ``failed`` says why capturing stopped, if it did."""

    MAX = 64  # graphs kept (one per entry point and shape); past it they are all dropped
    CAPTURE_AT = 2  # the use of a shape at which its graph is captured (the first runs as a call)

    def __init__(self, device, max_rows: int, driver: _Driver | None = None):
        self.device, self.max_rows = device, max_rows
        self.device_id = int(device.index)
        self.driver = driver or _Driver()
        self.capture_stream = self.driver.stream()
        self.graphs: dict[tuple, _Graph] = {}
        self.kept: dict[tuple, list] = {}  # output class -> blocks, as tensors of max_rows rows
        self.enabled, self.failed = True, None
        self.captures = self.replays = 0
        self.uses: dict[tuple, int] = {}  # forwards per key not yet captured
        self.capture_seconds = 0.0  # wall time of captures: two calls, the recording, instantiation, the check

    @staticmethod
    def available(device, meta: dict) -> bool:
        return device.dlpack_device_type() == KDL_CUDA and bool(meta.get("cuda_graph"))

    def run(self, key: tuple, arrays: list[np.ndarray], call: Callable[[list], list],
            reserve: Callable[[int, int], Any], flush: Callable[[], Any]) -> list | None:
        """``call(input tensors)`` -> the forward's outputs, replayed from the graph keyed by
        ``key`` (captured at its CAPTURE_AT-th use): views of the kept blocks, valid until the
        next replay. None when graphs are off or the key's graph is not captured yet (the
        caller runs the forward itself).
        ``reserve(width, rows)``: a call whose output has the planned size of ``call``'s
        outputs ``width`` wide, ``rows`` rows (a capture keeps its block). ``flush()``: a call
        of the same VM that allocates nothing, after which the VM no longer holds the result of
        its last call (a relax VM keeps it until the next). All are passed per call, so this
        object holds no reference to the model that owns it."""
        if not self.enabled or self.failed:
            return None
        g = self.graphs.get(key)
        if g is None:
            if len(self.uses) >= 4 * self.MAX:
                self.uses.clear()
            self.uses[key] = self.uses.get(key, 0) + 1
            if self.uses[key] < self.CAPTURE_AT:
                return None  # the caller runs the forward itself
            t0 = time.perf_counter()
            try:
                g = self._capture(key, arrays, call, reserve, flush)  # replayed once already, and checked
            except Exception as err:  # noqa: BLE001 -- any failure: decode without graphs, same kernels
                self.close(f"{type(err).__name__}: {err}")
                warnings.warn(f"CUDA graph capture failed, decoding without graphs: {self.failed}", RuntimeWarning,
                              stacklevel=3)
                return None
            finally:
                self.capture_seconds += time.perf_counter() - t0
        else:
            g.upload(self.driver.cu, arrays)
            self._launch(g)
        return self._outputs(g)

    def _launch(self, g: _Graph) -> None:
        self.driver.check(self.driver.cu.cuGraphLaunch(g.exe, None), "cuGraphLaunch")
        self.replays += 1

    def _outputs(self, g: _Graph) -> list:
        if g.outs is None:
            g.outs = [g.persistent[i] if c is None else self.kept[c][i]._create_view(shape)
                      for (c, i), shape in zip(g.slots, g.out_shapes)]
        return g.outs

    def _capture(self, key: tuple, arrays: list[np.ndarray], call, reserve, flush) -> _Graph:
        if len(self.graphs) >= self.MAX:
            self._drop_all()
        g = _Graph(self.driver, [tvm.runtime.empty(a.shape, a.dtype.name, self.device) for a in arrays])
        g.upload(self.driver.cu, arrays)
        before = {c: [t.data_ptr() for t in ts] for c, ts in self.kept.items()}
        flush()  # the VM may hold a kept block as its last result (a reserve call's)
        self._release()
        # Two uncaptured calls, the first's outputs held while the second runs. They load the
        # kernels and make the VM's lifted intermediates; an output at the same address in both
        # lives in that lifted allocation (RewriteCUDAGraph lifts an output whose planned
        # storage intermediates share: forward_tokens_hidden's), not in a pool block; the
        # first's results are what the graph must reproduce. Both write the KV slots the
        # graph will write, with the same values.
        first = list(call(g.inputs))
        expect = [x.numpy() for x in first]
        second = list(call(g.inputs))
        persistent = [x.data_ptr() == y.data_ptr() for x, y in zip(first, second)]
        _free(second)
        flush()  # the VM lets go of its last result (second's); then first's blocks go on top, in order
        _free(first)
        self.device.sync()
        g.exe, outs = self._record(call, g.inputs)
        g.out_shapes = [tuple(t.shape) for t in outs]
        pooled = []
        for i, lifted in enumerate(persistent):
            if lifted:
                g.persistent[i] = outs[i]  # the VM's own storage: holding it takes nothing from the pool
                g.slots.append((None, i))
            else:
                c = _out_class(outs[i])
                g.slots.append((c, sum(1 for s in g.slots if s[0] == c)))
                pooled.append(outs[i])
        classes = [c for c, _ in g.slots if c is not None]
        written = [t.data_ptr() for t in pooled]
        outs.clear()
        _free(pooled)
        flush()  # the VM's hold on the call's last result too: every block back on top, in order
        need = {c: max(len(before.get(c, ())), classes.count(c)) for c in dict.fromkeys([*before, *classes])}
        self.kept = {c: [reserve(c[1], self.max_rows) for _ in range(n)] for c, n in need.items()}
        got = [self.kept[c][i].data_ptr() for c, i in g.slots if c is not None]
        if got != written:
            g.destroy()
            raise GraphError(f"the output blocks the graph writes ({classes}: {[hex(p) for p in written]}) could "
                             f"not be kept (the pool gave {[hex(p) for p in got]})")
        if any([t.data_ptr() for t in self.kept[c][:len(p)]] != p for c, p in before.items()):
            self._drop_all()  # the earlier graphs write blocks this object no longer keeps
        # The first replay must give the uncaptured call's bits, or the graph is not used.
        self._launch(g)
        got = [t.numpy() for t in self._outputs(g)]
        if any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(got, expect)):
            g.destroy()
            raise GraphError("the captured graph's first replay differs from the call it was captured from")
        self.graphs[key] = g
        self.captures += 1
        return g

    def _record(self, call, inputs: list) -> tuple[ctypes.c_void_p, list]:
        """(the executable graph of ``call(inputs)`` captured on the side stream, its outputs)."""
        drv, graph = self.driver, ctypes.c_void_p()
        old = drv.set_stream(self.device_id, self.capture_stream)
        try:
            drv.check(drv.cu.cuStreamBeginCapture_v2(self.capture_stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                      "cuStreamBeginCapture")
            try:
                outs = list(call(inputs))
            finally:
                rc = drv.cu.cuStreamEndCapture(self.capture_stream, ctypes.byref(graph))
        finally:
            drv.set_stream(self.device_id, old)
        drv.check(rc, "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        try:
            drv.check(drv.cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
                      "cuGraphInstantiate")
        finally:
            drv.cu.cuGraphDestroy(graph)
        return exe, outs

    def _release(self) -> None:
        for g in self.graphs.values():
            g.outs = None  # views hold their block: first the views, then the blocks, the last first
        for ts in self.kept.values():
            _free(ts)
        self.kept = {}

    def _drop_all(self) -> None:
        for g in self.graphs.values():
            g.destroy()
        self.graphs.clear()

    def close(self, why: str) -> None:
        """Capturing stops (``failed`` = why): every graph dropped, the kept blocks back to the pool."""
        self.failed = why
        self._drop_all()
        self._release()

    def stats(self) -> dict:
        return {"enabled": self.enabled, "failed": self.failed, "graphs": len(self.graphs),
                "captures": self.captures, "capture_seconds": round(self.capture_seconds, 4), "replays": self.replays}
