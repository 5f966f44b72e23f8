"""CUDA graphs (runtime/cuda_graph.py): where they apply and how they are turned off. Replays
themselves run on a CUDA device only: ``make gpu-check`` decodes with and without them and
compares the tokens (bench/results/gpu-check-*.json, ``cuda_graph``)."""
import ctypes

import numpy as np
import pytest
import tvm

from test_tiny_model import IDS

from speccompile.runtime.cuda_graph import CudaGraphs
from speccompile.runtime.engine import Engine, GenerationError
from speccompile.runtime.model import Model
from speccompile.runtime.options import EngineConfig


def test_graphs_only_for_cuda_libraries_that_allow_them():
    assert not CudaGraphs.available(tvm.cpu(), {"cuda_graph": True})
    assert not CudaGraphs.available(tvm.cuda(0), {"cuda_graph": False})
    assert not CudaGraphs.available(tvm.cuda(0), {})  # a library built before graphs: its buffers move per call
    assert CudaGraphs.available(tvm.cuda(0), {"cuda_graph": True})


def test_the_option_takes_on_or_off():
    assert EngineConfig().cuda_graph == "on" and EngineConfig(cuda_graph="off").cuda_graph == "off"
    with pytest.raises(ValueError, match="cuda_graph takes one of on, off"):
        EngineConfig(cuda_graph="yes")


def test_a_cpu_library_has_no_graphs_and_a_bad_option_is_refused_before_loading(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib, cuda_graph="on")
    assert eng.model.graphs is None and eng.model.page_width is None and eng.sizes.cuda_graph == "on"
    with pytest.raises(GenerationError, match="cuda_graph"):
        Engine(built.model_dir, built.lib, cuda_graph=True)


class _HostDriver:
    """The driver calls CudaGraphs makes outside a capture, for CPU tensors (device addresses
    are host addresses there)."""

    class cu:
        @staticmethod
        def cuMemcpyHtoDAsync_v2(dst, src, nbytes, _stream):
            ctypes.memmove(dst.value, src, nbytes.value)
            return 0

        @staticmethod
        def cuGraphExecDestroy(_exe):
            return 0

    def stream(self):
        return None

    def check(self, rc, what):
        assert rc == 0, what


class Replayed(CudaGraphs):
    """CudaGraphs with the capture emulated on the CPU: a "graph" re-runs the call it recorded
    and writes its outputs where a replay writes them (the kept blocks). Everything else --
    the inputs' uploads, the pooled allocator's blocks kept and reserved, the views, the
    first-replay check, the keys -- is the class's own code, on TVM's real pooled allocator."""

    def __init__(self, device, max_rows):
        super().__init__(device, max_rows, driver=_HostDriver())
        self.recorded = {}

    def _record(self, call, inputs):
        outs = list(call(inputs))
        exe = ctypes.c_void_p(len(self.recorded) + 1)
        self.recorded[exe.value] = (call, inputs)
        return exe, outs

    def _launch(self, g):
        call, inputs = self.recorded[g.exe.value]
        for out, view in zip(call(inputs), self._outputs(g)):
            out.copyto(view)
        self.replays += 1


def _outputs_of(model, graphs, kv):
    """Greedy decode, chain verify and hidden-state steps of one sequence: every output."""
    model.graphs, model.page_width = graphs, (40 if graphs is not None else None)
    kv.add_sequence(0)
    out = [model.prefill(kv, [0], [IDS[:9]])]
    tok = int(out[-1][0].argmax())
    for _ in range(6):  # decode; then a 4-token and a 2-token chain; then hidden states + logits
        out.append(model.decode(kv, [0], [tok]))
        tok = int(out[-1][0].argmax())
    for chunk in ([tok, 5, 6, 7], [8, 9]):
        out.append(model.forward(kv, [0], [chunk]))
    for chunk in ([3, 4, 5], [6, 7, 8]):
        hidden, logits = model.forward(kv, [0], [chunk], outputs=("hidden", "logits"))
        out += [hidden.numpy(), logits.numpy()]
    out.append(model.decode(kv, [0], [1]))
    kv.remove_sequence(0)
    return out


def _tiny(build_tiny):
    """(a tiny q4 model, its KV cache, the outputs of ``_outputs_of`` without graphs, emulated graphs)."""
    built = build_tiny("tiny-llama", "q4f32_1")
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(512)
    return model, kv, _outputs_of(model, None, kv), Replayed(model.device, 64)


def test_replays_give_the_calls_bits_with_blocks_kept_across_graphs(build_tiny):
    model, kv, plain, graphs = _tiny(build_tiny)
    replayed = _outputs_of(model, graphs, kv)
    assert graphs.failed is None, graphs.failed
    # a graph per shape at its second use: decode (7 uses) and hidden states of 3 (2 uses); the
    # chains of 4 and 2 (1 use each) run as calls. Each capture replays once (checked), then 5
    # decodes; none is dropped by a later capture
    stats = graphs.stats()
    assert stats.pop("capture_seconds") > 0
    assert stats == {"enabled": True, "failed": None, "graphs": 2, "captures": 2, "replays": 2 + 5}
    assert all(np.array_equal(a, b) for a, b in zip(plain, replayed))
    kept = {c: [t.data_ptr() for t in ts] for c, ts in graphs.kept.items()}
    # logits; embeddings and hidden states (on cuda the hidden states live in the VM's lifted allocation)
    assert sorted(len(v) for v in kept.values()) == [1, 2]
    again = _outputs_of(model, graphs, kv)  # the same sequence again: the chains' second use captures them
    assert graphs.captures == 4 and graphs.replays == 7 + (7 + 2 + 2)
    assert all(np.array_equal(a, b) for a, b in zip(plain, again))
    assert {c: [t.data_ptr() for t in ts] for c, ts in graphs.kept.items()} == kept
    model.graphs = None
    assert all(np.array_equal(a, b) for a, b in zip(plain, _outputs_of(model, None, kv)))


def test_a_graph_whose_blocks_cannot_be_kept_turns_graphs_off_and_changes_nothing(build_tiny):
    model, kv, plain, graphs = _tiny(build_tiny)
    real, held = model._reserve, []

    def reserve(width, rows):  # someone else takes each block the capture freed first
        held.append(real(width, rows))
        return real(width, rows)

    model._reserve = reserve
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed, decoding without graphs: GraphError"):
        out = _outputs_of(model, graphs, kv)
    assert graphs.failed and "could not be kept" in graphs.failed and graphs.graphs == {} and graphs.kept == {}
    assert all(np.array_equal(a, b) for a, b in zip(plain, out))


def test_an_eagle3_step_replays_its_features_and_logits_from_one_graph(build_tiny):
    """Model.forward of hidden, features and logits (what a step with an EAGLE-3 head verifies with) is one graph: the
    features' block is kept through feature_buffer, as the logits' through get_logits. On the CPU
    the planned intermediates come from the same pool as the outputs (a cuda library lifts them),
    so a later capture may move the blocks and drop earlier graphs here; what must hold is the
    bits, and that a graph's own steps replay it."""
    model, kv, _, graphs = _tiny(build_tiny)
    assert "feature_buffer" in model._fn and model.feature_layers

    def steps(g):
        model.graphs, model.page_width = g, (40 if g is not None else None)
        kv.add_sequence(0)
        out = [model.prefill(kv, [0], [IDS[:9]])]
        for chunk in ([9, 10], [11, 12], [13, 14, 15]):
            out += [t.numpy() for t in model.forward(kv, [0], [chunk], outputs=("hidden", "features", "logits"))]
            if g is not None and chunk == [9, 10]:  # a shape's first step: a call
                assert (g.captures, g.replays) == (0, 0)
            if g is not None and chunk == [11, 12]:  # its second: captured, and replayed once (checked)
                assert (g.captures, g.replays) == (1, 1)
        out += [model.decode(kv, [0], [1]), model.forward(kv, [0], [[2, 3]])]
        out += [t.numpy() for t in model.forward(kv, [0], [[4, 5]], outputs=("hidden", "features", "logits"))]
        kv.remove_sequence(0)
        return out

    plain = steps(None)
    replayed = steps(graphs)
    assert graphs.failed is None, graphs.failed
    width = len(model.feature_layers) * model.hidden_size
    assert ("float32", width) in graphs.kept and graphs.kept[("float32", width)][0].shape == (64, width)
    assert len(plain) == len(replayed) and all(np.array_equal(a, b) for a, b in zip(plain, replayed))
    # the unfused calls give the same bits: hidden and features, then get_logits of its hidden states
    kv.add_sequence(1)
    model.graphs, model.page_width = None, None
    model.prefill(kv, [1], [IDS[:9]])
    hidden, feats = model.forward(kv, [1], [[9, 10]], outputs=("hidden", "features"))
    assert np.array_equal(hidden.numpy(), plain[1]) and np.array_equal(feats.numpy(), plain[2])
    assert np.array_equal(model.get_logits(hidden).numpy(), plain[3])


def test_the_gpu_checks_features_step_compares_graph_and_calls(build_tiny):
    """speccompile/gpu_check/graphs.py's features_step, run on the emulated graphs: it records
    both timings, that the graph exists, and the bit comparison (which replays of other bits fail)."""
    from speccompile.gpu_check.graphs import features_step

    model, kv, _, graphs = _tiny(build_tiny)
    model.graphs, model.page_width = graphs, 40
    step = features_step(model, kv, 8)
    assert step["identical_to_no_graph"] and step["graphed"] and step["failed"] is None
    assert step["graph_ms"] > 0 and step["calls_ms"] > 0 and graphs.replays >= 8 and graphs.enabled

    class Skewed(Replayed):  # replays after a graph's checked first one write other bits than the call
        def _launch(self, g):
            super()._launch(g)
            g.launched = getattr(g, "launched", 0) + 1
            if g.launched > 1:
                for out in self._outputs(g):
                    out.copyfrom(out.numpy() + 1)

    model.graphs = Skewed(model.device, 64)
    step = features_step(model, kv, 8)
    assert step["failed"] is None and not step["identical_to_no_graph"]
