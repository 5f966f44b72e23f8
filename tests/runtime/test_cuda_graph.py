"""CUDA graphs (runtime/cuda_graph.py): where they apply and how they are turned off. Replays
themselves run on a CUDA device only: ``make gpu-check`` decodes with and without them and
compares the tokens (bench/results/gpu-check-*.json, ``cuda_graph``)."""
import pytest
import tvm

from speccompile.runtime.cuda_graph import CudaGraphs
from speccompile.runtime.engine import Engine, GenerationError
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
