"""Bad input gets a clear error naming the problem, before any long work."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import make_hf_checkpoint
from speccompile.cli.main import main
from speccompile.compiler.convert_weight import convert_weight
from speccompile.compiler.gen_config import gen_config
from speccompile.models.config import ConfigError
from speccompile.runtime.engine import Engine, GenerationError
from speccompile.compiler.sources import SourceError


@pytest.fixture()
def hf_dir(tmp_path):
    make_hf_checkpoint(tmp_path / "hf", "tiny-llama")
    return tmp_path / "hf"


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_missing_config_field(hf_dir, tmp_path):
    _edit_config(hf_dir, hidden_size=None)
    with pytest.raises(ConfigError, match="missing required field.*hidden_size"):
        convert_weight(hf_dir, "q0f32", tmp_path / "out", progress=False)


def test_wrong_config_field_type(hf_dir, tmp_path):
    _edit_config(hf_dir, num_hidden_layers="two")
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        convert_weight(hf_dir, "q0f32", tmp_path / "out", progress=False)


def test_unsupported_architecture(hf_dir, tmp_path):
    _edit_config(hf_dir, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError, match="unsupported architecture"):
        convert_weight(hf_dir, "q0f32", tmp_path / "out", progress=False)


def test_unsupported_quantization_via_cli(hf_dir, tmp_path):
    res = CliRunner().invoke(main, ["convert_weight", str(hf_dir), "--quantization", "q3f16", "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unsupported quantization 'q3f16'" in res.output
    assert not (tmp_path / "o").exists()


def test_missing_tokenizer(hf_dir, tmp_path):
    (hf_dir / "tokenizer.json").unlink()
    with pytest.raises(SourceError, match="tokenizer.json"):
        gen_config(hf_dir, "q0f32", tmp_path / "out")


def test_truncated_safetensors(hf_dir, tmp_path):
    f = hf_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(SourceError, match="truncated"):
        convert_weight(hf_dir, "q0f32", tmp_path / "out", progress=False)


def test_missing_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    hf = tmp_path / "hf"
    make_hf_checkpoint(hf, "tiny-llama")
    w = load_file(str(hf / "model.safetensors"))
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, str(hf / "model.safetensors"))
    with pytest.raises(SourceError, match="up_proj"):
        convert_weight(hf, "q0f32", tmp_path / "out", progress=False)


def test_pytorch_bin_checkpoint_converts_like_safetensors(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_hf_checkpoint(a, "tiny-qwen2")
    make_hf_checkpoint(b, "tiny-qwen2", fmt="bin")
    convert_weight(a, "q0f32", tmp_path / "oa", progress=False)
    convert_weight(b, "q0f32", tmp_path / "ob", progress=False)
    ra = json.loads((tmp_path / "oa" / "tensor-cache.json").read_text())
    rb = json.loads((tmp_path / "ob" / "tensor-cache.json").read_text())
    md5 = lambda idx: [r["md5"] for s in idx["records"] for r in s["records"]]  # noqa: E731
    assert md5(ra) == md5(rb)


def test_prompt_longer_than_context_and_bad_token_ids(build_tiny, tmp_path):
    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib)
    with pytest.raises(GenerationError, match="context window is 512"):
        eng.generate([5] * 600, max_tokens=4)
    with pytest.raises(ValueError, match="token id 9999 is out of range"):
        eng.generate([5, 9999], max_tokens=4)
    with pytest.raises(ValueError, match="out of range"):
        eng.model.embed(np.array([-1], np.int32))


def test_missing_library_and_missing_weights(build_tiny, tmp_path):
    built = build_tiny("tiny-llama", "q0f32")
    with pytest.raises(ValueError, match="not found"):
        Engine(built.model_dir, tmp_path / "nope.so")
    empty = tmp_path / "empty"
    shutil.copytree(built.model_dir, empty)
    (empty / "tensor-cache.json").unlink()
    with pytest.raises(ValueError, match="convert_weight"):
        Engine(empty, built.lib)


def test_truncated_gguf(tmp_path):
    """A GGUF file cut short is refused by name (written with the gguf package)."""
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 4000])
    with pytest.raises(SourceError, match="truncated or corrupt"):
        convert_weight(path, "q0f32", tmp_path / "out", progress=False)
