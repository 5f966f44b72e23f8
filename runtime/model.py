"""A compiled model library plus its converted weights, loaded on a device.

Imports only the TVM *runtime* (``tvm.runtime``, ``relax.VirtualMachine``), never the
compiler, so applications can embed it. Before any weight is read the library's
``_metadata`` is checked against the compiler/runtime contract (runtime/contract.py: its
kind, KV page size and entry points' arguments) and against ``tensor-cache.json``.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime import tensor as to_device
from tvm.runtime.vm import VirtualMachine

from .contract import (FORWARD_META, KV_PAGE_SIZE, TARGET, ContractError, baked_metadata, check_library,
                       entry_point_names)
from .cuda_graph import CudaGraphs
from .cpu import CPUFeatureError, check_cpu_features
from .device import DeviceError, parse_device
from .device_runtime import DeviceRuntimeError, ensure_device_runtime, opencl_has_fp16, vulkan_device_info
from .kv_cache import ForwardBatch, PagedKV, split_forwards
from .params_image import image_path, map_image, wanted, write_image
from .tensor_cache import TensorCacheError, load_params, read_index
from .threads import configure_threads

# Entry points replayed from CUDA graphs (runtime/cuda_graph.py): the forwards of a step, whose
# logits the step reads before the next forward, and, with their logits, the hidden states or layer
# features a step of a head reads (Model.forward with outputs ("hidden", ..., "logits")). Others
# (prompt chunks, features without logits) run as calls.
GRAPHED = ("decode", "forward_tokens")
GRAPH_ROWS = 64  # most token rows of a graphed forward
_PAGE_TABLE = list(FORWARD_META).index("page_table")


class ModelLoadError(ValueError):
    pass


def _device_hint(meta: dict) -> str:
    kind = meta.get("target", "?")
    detail = ", ".join(meta.get("cuda_archs") or ([f"-mcpu {meta['mcpu']}"] if meta.get("mcpu") else []))
    return f"{meta.get('device', kind)} ({kind}{', ' + detail if detail else ''})"


def read_metadata(lib_path: Path) -> tuple[Any, dict]:
    lib_path = Path(lib_path)
    if not lib_path.exists():
        raise ModelLoadError(f"model library {lib_path} not found: build it with `speccompile compile`")
    if lib_path.suffix == ".tar":
        meta = baked_metadata(lib_path) or {}
        raise ModelLoadError(f"{lib_path} is an archive of objects built for {_device_hint(meta)}, meant to be "
                             "linked into an app (runtime/capi/README.md); to run here, compile a .so with --device llvm")
    baked = baked_metadata(lib_path)
    if baked is not None:  # refuse a CPU library this machine cannot run before it is even opened
        _check_cpu(baked, lib_path)
        try:  # the device runtime must be in the process before the library's kernels can load
            ensure_device_runtime(baked.get("target", "llvm"))
        except DeviceRuntimeError as err:
            raise ModelLoadError(f"{lib_path} was built for {_device_hint(baked)}: {err}") from None
    try:
        lib = tvm.runtime.load_module(str(lib_path))
    except Exception as err:  # noqa: BLE001 - any dlopen or device-loader failure
        meta = baked
        kind = meta.get("target") if meta is not None else None
        if kind in ("opencl", "vulkan") and _has_loader(kind):  # our runtime is here and refused the kernels: say why
            raise ModelLoadError(f"cannot load {lib_path} ({_device_hint(meta)}): {err}") from err
        if meta is not None and meta.get("target") != "llvm":
            raise ModelLoadError(
                f"{lib_path} was built for {_device_hint(meta)}, and this machine's TVM runtime cannot load "
                f"{meta.get('target')} kernels (no {meta.get('target')} device runtime here). Run it on a machine "
                "with that GPU, or compile for this CPU with `speccompile compile --device llvm`") from err
        raise ModelLoadError(f"cannot load {lib_path}: {err}") from err
    vm = VirtualMachine(lib, tvm.cpu())
    try:
        meta = json.loads(str(vm["_metadata"]()))
    except Exception as err:  # noqa: BLE001
        raise ModelLoadError(f"{lib_path} has no speccompile _metadata; it was not built by `speccompile compile`") from err
    if baked is None:  # the JSON was not found in the file's bytes: check the VM's copy
        _check_cpu(meta, lib_path)
    return lib, meta


def _has_loader(kind: str) -> bool:
    import tvm_ffi

    return tvm_ffi.get_global_func(f"ffi.Module.load_from_bytes.{kind}", allow_missing=True) is not None


def _check_cpu(meta: dict, lib_path: Path) -> None:
    """runtime/cpu.py's check, raised as the loader's error type (the CLI reports those)."""
    try:
        check_cpu_features(meta, lib_path)
    except CPUFeatureError as err:
        raise ModelLoadError(str(err)) from None


def resolve_device(meta: dict, requested: str, lib_path: Path):
    """The device to run on: the library's own kind, at the index asked for (``cuda:1``).

    ``requested`` is any MLC-LLM device form (runtime/device.py); ``auto`` takes the
    library's kind, device 0. A kind other than the library's is refused by name."""
    kind = meta["target"]
    try:
        spec = parse_device(requested)
    except DeviceError as err:
        raise ModelLoadError(str(err)) from None
    if spec.kind not in ("auto", kind):
        if spec.kind == "llvm":
            raise ModelLoadError(f"{lib_path} was built for {_device_hint(meta)}, not for this CPU; "
                                 "compile with --device llvm")
        raise ModelLoadError(f"--device {requested}: {lib_path} was built for {_device_hint(meta)}; run it with "
                             f"--device {'cpu' if kind == 'llvm' else kind} or compile it for {spec.kind}")
    dev = tvm.cpu() if kind == "llvm" else tvm.device(kind, spec.index or 0)
    if not dev.exist:
        which = f"{kind}:{spec.index}" if spec.index else kind
        hint = {"opencl": " (install an OpenCL driver for it; PoCL gives a CPU device: apt-get install pocl-opencl-icd)",
                "vulkan": " (install a Vulkan driver for it; Mesa's lavapipe gives a CPU device: apt-get install "
                          "mesa-vulkan-drivers)",
                "cuda": " (check nvidia-smi and CUDA_VISIBLE_DEVICES)"}.get(kind, "")
        raise ModelLoadError(f"{lib_path} was built for {_device_hint(meta)}, but no {which} device is visible "
                             f"on this machine{hint}")
    if kind == "opencl" and "f16" in meta.get("quantization", "") and not opencl_has_fp16(spec.index or 0):
        raise ModelLoadError(f"{lib_path} computes in fp16 ({meta['quantization']}), which {dev.device_name} "
                             "(opencl) does not support (no cl_khr_fp16): compile the model with q4f32_1 or q0f32 "
                             "for this device")
    if kind == "vulkan" and "f16" in meta.get("quantization", "") and \
            not vulkan_device_info(spec.index or 0).get("shaderFloat16"):
        raise ModelLoadError(f"{lib_path} computes in fp16 ({meta['quantization']}), which {dev.device_name} "
                             "(vulkan) does not support (no shaderFloat16): compile the model with q4f32_1 or q0f32 "
                             "for this device")
    return dev


class Uploads:
    """Host arrays into device tensors that are reused call after call.

    Why: ``tvm.runtime.tensor`` allocates a fresh device tensor per array (cudaMalloc, and a
    cudaFree -- which synchronises the device -- when it dies) and parses its dtype in
    Python; a decode step uploads about a dozen small arrays (token ids, the forward's
    metadata, the verifier's rows), which the H200 check measured as part of ~1.4 ms of
    host time per step against 0.8 ms of device time. Here each call site (``site``) keeps
    one tensor per shape and dtype and copies into it.

    Safe to reuse because a copy into device memory is ordered on the stream after the
    kernels that read the previous contents, and the runtime hands an upload to the very
    next library call (nobody keeps it across calls of the same site)."""

    MAX = 256  # tensors kept before the cache is dropped (shapes vary with row counts and page-table widths)

    def __init__(self, device):
        self.device, self.cache = device, {}
        self._copy = tvm.runtime._ffi_api.TVMTensorCopyFromBytes

    def put(self, site: str, array):
        a = np.ascontiguousarray(array)
        key = (site, a.shape, a.dtype.char)
        t = self.cache.get(key)
        if t is None:
            if len(self.cache) >= self.MAX:
                self.cache.clear()
            t = self.cache[key] = tvm.runtime.empty(a.shape, a.dtype.name, self.device)
        if a.nbytes:
            self._copy(t, a.ctypes.data_as(ctypes.c_void_p), a.nbytes)
        return t


def tiled(arr: np.ndarray, tile: int) -> np.ndarray:
    """[N, C] -> a view [N/tile, C, tile]: the order the CPU kernels read rows in (kernels/cpu_matmul.py)."""
    n, c = arr.shape
    return arr.reshape(n // tile, tile, c).transpose(0, 2, 1)


def upload_param(arr: np.ndarray, tile: int | None, device):
    """One weight (memory-mapped) into a new tensor on ``device``, its rows in ``tiled``'s order
    (``tile`` None: as stored). On the CPU it is written once, straight into the
    tensor's memory through a numpy view of it: the tiled (or contiguous) copy and then the
    upload were two passes over fresh pages (a 1.5B model's load: 1.1-1.4 -> 0.9 s, Zen 4)."""
    src = tiled(arr, tile) if tile else arr
    if device.dlpack_device_type() != 1:  # not the CPU: no view of the tensor's memory
        return to_device(np.ascontiguousarray(src).reshape(arr.shape), device)
    out = tvm.runtime.empty(arr.shape, arr.dtype.name, device)
    np.copyto(np.from_dlpack(out).reshape(src.shape), src)
    return out


def check_compatible(meta: dict, index: dict, model_dir: Path, lib_path: Path) -> None:
    """Refuse a library compiled for other weights, naming the first difference."""
    tmeta = index.get("metadata", {})
    if tmeta.get("layout_fingerprint") == meta["layout_fingerprint"]:
        return
    lib_params = {p["name"]: (p["shape"], p["dtype"]) for p in meta["params"]}
    have = {r["name"]: (r["shape"], r["dtype"]) for s in index["records"] for r in s["records"]}
    detail = ""
    for name, spec in lib_params.items():
        if name not in have:
            detail = f"the library needs {name}, absent from the weights"
            break
        if list(have[name][0]) != list(spec[0]) or have[name][1] != spec[1]:
            detail = f"{name}: library expects {spec[0]} {spec[1]}, weights have {have[name][0]} {have[name][1]}"
            break
    raise ModelLoadError(
        f"{lib_path} was compiled for other weights ({meta['model_type']} {meta['quantization']}) than "
        f"{model_dir} ({tmeta.get('model_type')} {tmeta.get('quantization')}): {detail or 'layout fingerprint differs'}. "
        "Recompile with `speccompile compile <model_dir>/speccompile-config.json`."
    )


class Model:
    """Entry points of one compiled model, bound to its parameters."""

    kind = TARGET  # the contract's library kind; a draft head's loader (runtime/drafters/eagle.py, medusa.py) names its own

    def __init__(self, model_dir: Path, lib_path: Path, device: str = "auto", verify_md5: bool = True,
                 cuda_graph: bool = True):
        configure_threads()  # before this model's first kernel starts TVM's thread pool (runtime/threads.py)
        self.model_dir, self.lib_path = Path(model_dir), Path(lib_path)
        index = read_index(self.model_dir)
        lib, self.meta = read_metadata(self.lib_path)
        try:
            check_library(self.meta, self.kind, self.lib_path)
        except ContractError as err:
            raise ModelLoadError(str(err)) from None
        check_compatible(self.meta, index, self.model_dir, self.lib_path)
        self.device = resolve_device(self.meta, device, self.lib_path)
        self.uploads = Uploads(self.device)  # the per-call arrays (token ids, forward metadata, verifier rows)
        self.vm = VirtualMachine(lib, self.device)
        self.params = self._load_params(index, verify_md5)
        self.vocab_size = int(self.meta["vocab_size"])
        self.hidden_size = int(self.meta["hidden_size"])
        self.dtype = self.meta["model_dtype"]
        self.context_window_size = int(self.meta["context_window_size"])
        self.prefill_chunk_size = int(self.meta["prefill_chunk_size"])  # an engine may lower it (its chunks)
        # The most tokens (and sequences) one call may take: the library's buffers were planned
        # for this many (runtime/contract.py SYMBOLIC_DIM_BOUNDS); more would not fit them.
        self.max_forward_tokens = self.prefill_chunk_size
        self._fn = {}
        for name in entry_point_names(self.kind, self.meta):  # _metadata lists them all (check_library)
            try:
                self._fn[name] = self.vm[name]
            except AttributeError as err:
                raise ModelLoadError(f"{lib_path} lists the entry point {name!r} in its _metadata but does not "
                                     "export it; recompile it with `speccompile compile`") from err
        # CUDA graphs where the library allows them: fixed shapes need a fixed page-table width
        self.page_width: int | None = None  # page tables padded to this many columns (None: as planned)
        self.graphs: CudaGraphs | None = None
        if cuda_graph and CudaGraphs.available(self.device, self.meta):
            self.page_width = -(-self.context_window_size // KV_PAGE_SIZE)
            self.graphs = CudaGraphs(self.device, min(GRAPH_ROWS, self.max_forward_tokens))
        # Each decode step makes short-lived Python objects; without this, the cyclic GC keeps
        # re-traversing everything loaded so far (7% of a 1.5B decode step was gc_collect_main).
        gc.collect()
        gc.freeze()

    # ---------------------------------------------------------------- helpers
    def _load_params(self, index: dict, verify_md5: bool) -> list:
        """The parameters as tensors on the device, in the library's order. On the CPU, views
        of the weights' image where one is valid (runtime/params_image.py: mapped, not copied),
        else copied out of the shards (and, the second time, written as the image)."""
        cpu = self.device.dlpack_device_type() == 1
        image = image_path(self.model_dir, index, self.meta) if cpu else None
        views = map_image(image, self.meta) if cpu else None
        self.weights_from = "image" if views is not None else "shards"  # where this load read them
        if views is not None:
            return [tvm.runtime.from_dlpack(v) for v in views]
        names = [p["name"] for p in self.meta["params"]]
        try:
            arrays = load_params(self.model_dir, names, verify_md5=verify_md5)
        except TensorCacheError as err:
            raise ModelLoadError(str(err)) from err
        tiled = set(self.meta.get("tiled_params", []))
        tile = int(self.meta.get("tile", 16))
        # on the CPU the weights are copied by numpy, which lets go of the GIL: all cores at once
        # (0.9 -> 0.5 s for a 1.5B model on 2 cores); device uploads stay in one thread
        workers = (os.cpu_count() or 1) if cpu else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            params = list(pool.map(lambda n: upload_param(arrays[n], tile if n in tiled else None, self.device),
                                   names))
        if cpu and wanted(image):  # loaded before: the next process maps them
            write_image(image, [np.from_dlpack(t) for t in params], self.meta)
        return params

    def create_kv_cache(self, max_total_tokens: int) -> PagedKV:
        """A paged KV cache able to hold max_total_tokens across all sequences."""
        num_pages = -(-max_total_tokens // KV_PAGE_SIZE)
        shape = [self.meta["num_hidden_layers"], 2, num_pages * KV_PAGE_SIZE, self.meta["num_key_value_heads"],
                 self.meta["head_dim"]]
        tensor = tvm.runtime.empty(shape, self.dtype, self.device)
        return PagedKV(tensor, num_pages)

    def check_token_ids(self, ids: np.ndarray) -> None:
        """The embedding kernel does not bounds-check: refuse bad ids here."""
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"token id {int(bad)} is out of range for vocab size {self.vocab_size}")

    def check_rows(self, n: int, what: str = "tokens") -> None:
        """Refuse a call over more rows than the library's buffers were planned for."""
        if n > self.max_forward_tokens:
            raise ValueError(f"one call of {self.lib_path.name} takes at most {self.max_forward_tokens} {what} "
                             f"(its prefill_chunk_size, which its buffers are planned for), got {n}: split the "
                             "forward, or rerun gen_config --prefill-chunk-size and compile")

    def embed(self, ids) -> Any:
        ids = np.asarray(ids, dtype=np.int32)
        self.check_rows(ids.size)
        self.check_token_ids(ids)
        return self._fn["embed"](self.uploads.put("embed", ids), self.params)

    def stage(self, site: str, arrays: list[np.ndarray]) -> list:
        """Host arrays as the device tensors of one call from ``site``.

        On the CPU they become zero-copy views (DLPack) of one fresh 64-byte aligned buffer:
        ``tvm.runtime.tensor`` allocates and copies at ~15 us an array, and a draft depth
        passes ten small ones (its tokens, rows and FORWARD_META), which made the uploads cost
        more than the proposer's own bookkeeping. The views live as long as the tensors (the
        buffer is not reused). Other devices copy into the site's reused tensors (Uploads)."""
        if not self.cpu_kernels:
            return [self.uploads.put(f"{site}.{i}", a) for i, a in enumerate(arrays)]
        sizes = [-(-a.nbytes // 64) * 64 for a in arrays]
        buf = np.empty(sum(sizes) + 64, np.uint8)
        at = -buf.ctypes.data % 64
        out = []
        for a, size in zip(arrays, sizes):
            view = buf[at: at + a.nbytes].view(a.dtype).reshape(a.shape)
            view[...] = a
            out.append(tvm.runtime.from_dlpack(view))
            at += size
        return out

    def _run(self, name: str, ids: np.ndarray, kv: PagedKV, batch: ForwardBatch, *extra, on_device: bool = False):
        out = self._forward(name, ids, kv, batch, *extra)[1]
        return out if on_device else out.numpy()

    def _forward(self, name: str, ids: np.ndarray, kv: PagedKV, batch: ForwardBatch, *extra,
                 logits: bool = False) -> list:
        """[embeddings, the entry point's outputs(, get_logits of the first)] on device: replayed from a
        CUDA graph where one applies, else called."""
        # ids were range-checked (and counted: check_rows) by the caller before the KV cache was touched
        arrays = batch.arrays
        if self.page_width is not None and arrays[_PAGE_TABLE].shape[1] < self.page_width:
            table = arrays[_PAGE_TABLE]  # the extra columns name page 0; no token reads past its own pages
            arrays = list(arrays)
            arrays[_PAGE_TABLE] = np.pad(table, ((0, 0), (0, self.page_width - table.shape[1])))
        # with logits: hidden states and their logits; layer features too where feature_buffer keeps their block
        if self.graphs is not None and ids.size <= self.graphs.max_rows and not extra and (name in GRAPHED or (
                logits and (name != "forward_tokens_features" or "feature_buffer" in self._fn))):
            key = (name, logits, kv.tensor.data_ptr(), kv.tensor.shape, ids.shape, *(a.shape for a in arrays))
            outs = self.graphs.run(key, [ids, *arrays], lambda t: self._call(name, t[0], kv, t[1:], logits=logits),
                                   self._reserve, self.vm["_metadata"])
            if outs is not None:
                return outs
        return self._call(name, self.uploads.put("ids", ids), kv,
                          [self.uploads.put(f"meta{i}", a) for i, a in enumerate(arrays)], *extra, logits=logits)

    def _call(self, name: str, ids, kv: PagedKV, meta: list, *extra, logits: bool = False) -> list:
        """[embeddings, the entry point's outputs (a tuple's in order; the first is the hidden
        states where there are several), then, with ``logits``, get_logits of that first]."""
        emb = self._fn["embed"](ids, self.params)
        # contract.ENTRY_POINTS' order: input_embeds, [logit_positions], kv, FORWARD_META..., params
        out = self._fn[name](emb, *extra, kv.tensor, *meta, self.params)
        outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
        return [emb, *outs, self._fn["get_logits"](outs[0], self.params)] if logits else [emb, *outs]

    def _reserve(self, width: int, rows: int):
        """A tensor of ``rows`` rows from the call whose output has the planned size of a graphed
        forward's output ``width`` wide: embed for hidden-state rows, get_logits for logits,
        feature_buffer for layer features (CudaGraphs keeps its block)."""
        if width == self.hidden_size:
            return self._fn["embed"](to_device(np.zeros(rows, np.int32), self.device), self.params)
        hidden = to_device(np.zeros((rows, self.hidden_size), self.dtype), self.device)
        if width == self.vocab_size:
            return self._fn["get_logits"](hidden, self.params)
        if "feature_buffer" in self._fn and width == len(self.feature_layers) * self.hidden_size:
            return self._fn["feature_buffer"](hidden, self.params)
        raise ValueError(f"no call makes outputs {width} wide (hidden {self.hidden_size}, vocab {self.vocab_size})")

    # ------------------------------------------------------------ forwards
    def prefill(self, kv: PagedKV, seq_ids: list[int], token_lists: list[list[int]]) -> np.ndarray:
        """Append each sequence's tokens; logits at each sequence's last token [b, vocab].

        More than ``max_forward_tokens`` tokens in all are appended over consecutive
        forwards (the same kernels per token, so the same logits); a KV cache that cannot
        hold them all raises KVCacheFull before anything is written."""
        flat = np.concatenate([np.asarray(t, np.int32) for t in token_lists])
        self.check_token_ids(flat)
        counts = [len(t) for t in token_lists]
        if flat.size <= self.max_forward_tokens:
            return self._prefill(kv, seq_ids, counts, flat)
        kv.check_room(seq_ids, counts)
        logits = np.empty((len(seq_ids), self.vocab_size), np.float32)
        for pieces in split_forwards(counts, self.max_forward_tokens):
            ids = np.concatenate([np.asarray(token_lists[i][a:e], np.int32) for i, a, e in pieces])
            out = self._prefill(kv, [seq_ids[i] for i, _, _ in pieces], [e - a for _, a, e in pieces], ids)
            for row, (i, _, e) in enumerate(pieces):
                if e == counts[i]:
                    logits[i] = out[row]
        return logits

    def _prefill(self, kv: PagedKV, seq_ids: list[int], counts: list[int], flat: np.ndarray) -> np.ndarray:
        self.check_rows(flat.size)
        batch = kv.plan_chain(seq_ids, counts)
        last = self.uploads.put("prefill.last", (np.cumsum(batch.counts) - 1).astype(np.int32))
        return self._run("prefill", flat, kv, batch, last)

    def decode(self, kv: PagedKV, seq_ids: list[int], tokens: list[int], on_device: bool = False):
        """One token per sequence; logits [b, vocab]."""
        ids = np.asarray(tokens, np.int32)
        self.check_rows(ids.size, "sequences")
        self.check_token_ids(ids)
        return self._run("decode", ids, kv, kv.plan_chain(seq_ids, [1] * len(tokens)), on_device=on_device)

    # what one multi-token forward can give, and the entry point (and get_logits) that gives it
    OUTPUTS = {("logits",): ("forward_tokens", False), ("hidden",): ("forward_tokens_hidden", False),
               ("hidden", "logits"): ("forward_tokens_hidden", True),
               ("hidden", "features"): ("forward_tokens_features", False),
               ("hidden", "features", "logits"): ("forward_tokens_features", True)}

    def forward(self, kv: PagedKV, seq_ids: list[int], token_lists: list[list[int]],
                tree_parents: list[list[int]] | None = None, outputs: str | tuple[str, ...] = "logits",
                on_device: bool = False):
        """Several tokens per sequence in one forward (a prompt chunk, a verify, a head's
        catch-up): the ``outputs`` asked for, at every token, as one array (``outputs`` a name)
        or a tuple in the order asked:

        - ``"logits"`` [n, vocab];
        - ``"hidden"``: the final-normed hidden states [n, hidden] (draft heads read them;
          :meth:`get_logits` turns them into the very logits the fused entry point gives);
        - ``"features"``: the outputs of the decoder layers ``feature_layers`` names,
          concatenated low/mid/high [n, 3 * hidden] (what an EAGLE-3 head reads; with hidden).

        Asked together, logits come from the same call (one CUDA graph where they apply).
        Chains are appended (roll back with ``kv.popn``); trees are written to scratch rows and
        need :meth:`commit_tree` afterwards. Logits alone come back on the host unless
        ``on_device``; hidden states and features stay on the device: read them before the
        model's next forward (on cuda they live in the VM's lifted allocation)."""
        names = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        order = tuple(o for o in ("hidden", "features", "logits") if o in names)
        if order not in self.OUTPUTS or len(order) != len(names):
            raise ValueError(f"a forward gives {' | '.join('+'.join(k) for k in self.OUTPUTS)}, not {outputs!r}")
        entry, logits = self.OUTPUTS[order]
        if entry not in self._fn:
            raise ModelLoadError(f"{self.lib_path} exports no {entry} (it was built before "
                                 f"{'EAGLE-3' if 'features' in order else 'draft head'} support): rebuild it with "
                                 "`speccompile compile`")
        outs = self._forward(entry, *self._plan(kv, seq_ids, token_lists, tree_parents), logits=logits)[1:]
        got = dict(zip(order, outs))
        if order == ("logits",) and not on_device:
            got["logits"] = got["logits"].numpy()
        return got[names[0]] if isinstance(outputs, str) else tuple(got[n] for n in names)

    @property
    def cpu_kernels(self) -> bool:
        """Whether this model's kernels run on this thread's TVM CPU thread pool."""
        return self.device.dlpack_device_type() == tvm.cpu().dlpack_device_type()

    @property
    def feature_layers(self) -> list[int] | None:
        """The decoder layers whose outputs :meth:`forward` gives as "features" (None: no such entry point)."""
        return self.meta.get("feature_layers")

    def _plan(self, kv: PagedKV, seq_ids: list[int], token_lists: list[list[int]],
              tree_parents: list[list[int]] | None) -> tuple[np.ndarray, PagedKV, ForwardBatch]:
        """(checked flat token ids, kv, the chain or tree plan) of a multi-token forward."""
        flat = np.concatenate([np.asarray(t, np.int32) for t in token_lists])
        self.check_rows(flat.size)
        self.check_token_ids(flat)
        if tree_parents is None:
            return flat, kv, kv.plan_chain(seq_ids, [len(t) for t in token_lists])
        return flat, kv, kv.plan_tree(seq_ids, tree_parents)

    def get_logits(self, hidden):
        """Device hidden states [n, hidden] (device tensor or numpy) -> device logits [n, vocab]."""
        if isinstance(hidden, np.ndarray):
            hidden = self.uploads.put("get_logits", np.asarray(hidden, self.dtype))
        self.check_rows(int(hidden.shape[0]), "rows")
        return self._fn["get_logits"](hidden, self.params)

    def accept_greedy(self, logits, token_lists: list[list[int]],
                      parents: list[list[int]]) -> list[tuple[list[int], int]]:
        """The library's greedy verification kernel on device logits [n, vocab].

        token_lists[i] = [last] + drafts of sequence i; parents[i] = local parent row of each
        (-1 for row 0). Returns (accepted draft nodes, bonus token) per sequence."""
        tokens = np.concatenate([np.asarray(t, np.int32) for t in token_lists])
        self.check_rows(tokens.size, "rows")
        par = np.concatenate([np.asarray(p, np.int32) for p in parents])
        indptr = np.concatenate([[0], np.cumsum([len(t) for t in token_lists])]).astype(np.int32)
        up = self.uploads.put
        out = self._fn["accept_greedy"](logits, up("accept.tokens", tokens), up("accept.parents", par),
                                        up("accept.indptr", indptr)).numpy()
        return [(out[i, 2: 2 + out[i, 0]].tolist(), int(out[i, 1])) for i in range(len(token_lists))]

    def sampling_probs(self, logits, temps, top_ks, top_ps):
        """The library's sampling kernel: device logits [n, vocab] -> device probs [n, vocab].

        temps, top_ks, top_ps: one value per row (repeat a sequence's parameters over its
        rows). Temperature/top-k/top-p as ``probs_from_logits``; temperature 0 gives the
        one-hot of the argmax. Apply it to target and draft logits alike."""
        n = len(temps)
        self.check_rows(n, "rows")
        up = self.uploads.put
        return self._fn["sampling_probs"](logits, up("probs.temp", np.asarray(temps, np.float32).reshape(n)),
                                          up("probs.top_k", np.asarray(top_ks, np.int32).reshape(n)),
                                          up("probs.top_p", np.asarray(top_ps, np.float32).reshape(n)))

    def accept_sampled(self, p, q, one_hot, token_lists: list[list[int]], parents: list[list[int]],
                        uniforms: list) -> list[tuple[list[int], int]]:
        """The library's rejection-sampling kernel on device target probs p [n, vocab].

        q: the draft distribution of each row [n, vocab] (device or numpy; row 0 of each
        sequence unused), or None when every draft is one-hot. one_hot[i]: per sequence, a
        bool for all its rows or a list of per-row flags (q is the one-hot of the row's
        token). token_lists, parents: as :meth:`accept_greedy`. uniforms[i]: [k_i + 1] in
        [0, 1), as runtime/acceptance.py's ``uniforms`` (node j's accept test, then the bonus).
        Returns (accepted draft nodes, final sampled token) per sequence."""
        sizes = [len(t) for t in token_lists]
        n, b = sum(sizes), len(token_lists)
        self.check_rows(n, "rows")
        tokens = np.concatenate([np.asarray(t, np.int32) for t in token_lists])
        par = np.concatenate([np.asarray(x, np.int32) for x in parents])
        indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        flags = np.concatenate([np.broadcast_to(np.asarray(f if q is not None else True, np.int32), (rows,))
                                for f, rows in zip(one_hot if one_hot is not None else [True] * b, sizes)])
        flat_u = np.zeros(n + b, np.float32)
        for i, (u, start) in enumerate(zip(uniforms, indptr[:-1])):
            u = np.asarray(u, np.float32)
            if len(u) != sizes[i]:
                raise ValueError(f"sequence {i}: {len(u)} uniforms for {sizes[i] - 1} drafts, expected {sizes[i]}")
            flat_u[start + 1: start + sizes[i]] = u[:-1]
            flat_u[n + i] = u[-1]
        flat_u = np.minimum(flat_u, np.float32(1 - 2 ** -24))  # a float64 draw may round up to 1 in float32
        if q is None:
            q = np.zeros((1, self.vocab_size), np.float32)
        if isinstance(q, np.ndarray):
            q = self.uploads.put("accept_sampled.q", np.asarray(q, np.float32))
        dev = [self.uploads.put(f"accept_sampled.{i}", a) for i, a in enumerate((flags, tokens, par, indptr, flat_u))]
        out = self._fn["accept_sampled"](p, q, *dev).numpy()
        return [(out[i, 2: 2 + out[i, 0]].tolist(), int(out[i, 1])) for i in range(b)]

    def commit_tree(self, kv: PagedKV, seq_id: int, path: list[int]) -> None:
        src, dst = kv.tree_commit_moves(seq_id, path)
        if src:
            self.copy_kv(kv, src, dst)

    def copy_kv(self, kv: PagedKV, src, dst) -> None:
        """kv rows at slots ``dst`` = those at slots ``src`` (every layer, K and V)."""
        self._fn["copy_kv_slots"](kv.tensor, self.uploads.put("commit.src", np.asarray(src, np.int32)),
                                  self.uploads.put("commit.dst", np.asarray(dst, np.int32)))
