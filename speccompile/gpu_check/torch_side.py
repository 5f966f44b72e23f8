"""The torch side of ``make gpu-check``: random checkpoints, the reference and the peers.

Why a process of its own. The check's main process runs our libraries through TVM's
runtime; torch and transformers take seconds to import and keep their own CUDA memory
pool. One long-lived worker (``serve``: one JSON task per stdin line, one JSON reply per
stdout line) pays the import once, and sits idle -- no GPU work -- while TVM is timed.
torch.compile runs apart again (``compile``), in a process that can be killed when it
takes longer than the check allows.

"The same weights": every torch model here is built from *our converted* weights (q4
dequantized, the rest as stored), so the logits compare kernels, not quantization, and the
peers decode exactly the model we decode. Random-weight models start as a transformers
random init (``init``), which our converter then quantizes (speccompile/gpu_check/check.py).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CONFIG_FILE = "speccompile-config.json"


class TorchWorker:
    """This module's ``serve`` in a child process (the check's side): one JSON task, one JSON reply."""

    def __init__(self, device: str):
        self.device = device
        self.proc = subprocess.Popen([sys.executable, "-m", "speccompile.gpu_check.torch_side", "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.versions = None  # its first line, read when the first task is sent (it imports torch meanwhile)

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 1))
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError("the torch worker " + ("timed out" if not ready else "exited")
                               + " (its output above says why)")
        return json.loads(line)

    def call(self, task: str, timeout: float, **kwargs) -> dict:
        if self.versions is None:
            self.versions = self._read(300)
        self.proc.stdin.write(json.dumps({"task": task, "device": self.device, **kwargs}) + "\n")
        self.proc.stdin.flush()
        out = self._read(timeout)
        if not out.pop("ok"):
            raise RuntimeError(f"torch {task}: {out['error']}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"task": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()


def hf_config_dict(mc: dict) -> dict:
    """An HF config.json for our ``model_config`` (Llama or Qwen2)."""
    qwen = mc["model_type"] == "qwen2"
    eos = mc.get("eos_token_id") or []
    out = {"architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"], "model_type": mc["model_type"],
           **{k: mc[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta",
                                 "tie_word_embeddings", "max_position_embeddings", "head_dim")},
           "bos_token_id": mc.get("bos_token_id"), "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
           "hidden_act": "silu"}
    if not qwen:
        out.update(attention_bias=bool(mc.get("attention_bias")), mlp_bias=False)
    return out


def model_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / CONFIG_FILE).read_text())["model_config"]


def empty_model(mc: dict, device: str, dtype):
    """A transformers model of this config on ``device`` (its random init is overwritten or is the point)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = hf_config_dict(mc)
    cfg = AutoConfig.for_model(d.pop("model_type"), **{k: v for k, v in d.items() if k != "architectures"})
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def dequantize(q_weight: np.ndarray, q_scale: np.ndarray, device: str):
    """Our q4 storage -> float32 [out, in] on ``device`` (models/quant_codec.py's dequantize_q4,
    in torch: numpy takes tens of seconds for a 1.5B model)."""
    import torch

    words = torch.from_numpy(np.array(q_weight, np.uint32).view(np.int32)).to(device)  # a writable copy
    shifts = torch.arange(0, 32, 4, device=device, dtype=torch.int32)
    nib = (words.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift, then the nibble's own 4 bits
    out = words.shape[0]
    q = nib.reshape(out, -1, 32).float() - 7.0
    scale = torch.from_numpy(np.array(q_scale, np.float32)).to(device)
    return (q * scale.unsqueeze(-1)).reshape(out, -1)


def load_our_weights(model_dir: Path, device: str, dtype):
    """A transformers model holding the converted weights of ``model_dir``."""
    import torch

    from speccompile.models.config import LlamaConfig, hf_source_map
    from speccompile.runtime.tensor_cache import load_params, read_index, records

    mc = model_config(model_dir)
    model = empty_model(mc, device, torch.float32)
    names = [r["name"] for r in records(read_index(Path(model_dir)))]
    arrays = load_params(Path(model_dir), names, verify_md5=False)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    state = {}
    for logical, hf_names in hf_source_map(LlamaConfig.from_dict(mc)).items():
        base = logical[: -len(".weight")]
        if logical.endswith(".weight") and f"{base}.q_weight" in arrays:
            w = dequantize(arrays[f"{base}.q_weight"], arrays[f"{base}.q_scale"], device)
        else:
            w = torch.from_numpy(np.asarray(arrays[logical], np.float32)).to(device)
        for name, part in zip(hf_names, torch.split(w, [shapes[n][0] for n in hf_names], 0)):
            state[name] = part.reshape(shapes[name])
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and mc["tie_word_embeddings"])]
    if missing or result.unexpected_keys:
        raise ValueError(f"our weights do not fill the transformers model: missing {missing[:3]}, "
                         f"unexpected {result.unexpected_keys[:3]}")
    return model.to(dtype)


class TokenClock:
    """A generate() streamer that only notes when each token arrives: put() is called with
    the prompt, then once per new token (transformers syncs the device before each)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_tok_s(self) -> float:
        """New tokens after the first (which the prefill made) per second."""
        steps = len(self.times) - 2
        return steps / (self.times[-1] - self.times[1]) if steps > 0 else 0.0


def generate_tok_s(model, prompt: list[int], tokens: int, device: str, repeat: int = 2, **kwargs) -> dict:
    """Greedy decode tok/s of ``tokens`` new tokens (end-of-text suppressed), best of ``repeat``
    after one warm-up run of the same length; also how long that first run took."""
    import torch

    ids = torch.tensor([prompt], device=device)
    runs, first = [], None
    for i in range(repeat + 1):
        clock = TokenClock()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                           min_new_tokens=tokens, do_sample=False, streamer=clock, pad_token_id=0, **kwargs)
        if i == 0:
            first = time.perf_counter() - t0
        else:
            runs.append(clock.decode_tok_s())
    return {"tok_s": max(runs), "runs_tok_s": runs, "first_run_seconds": first}


# ------------------------------------------------------------------------------ tasks
def task_init(model_dir: str, out: str, seed: int, device: str) -> dict:
    """A transformers random init of the model in ``model_dir``'s config, saved as an fp16 HF
    folder for our converter."""
    import torch

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = empty_model(model_config(Path(model_dir)), device, torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    del model
    _free(device)
    return {"params": n, "seconds": time.perf_counter() - t0}


def task_reference(model_dir: str, tokens: list[int], rows: int, logits_out: str, device: str,
                   prompt: list[int] | None = None, generate: int = 0) -> dict:
    """Logits of the last ``rows`` positions of ``tokens`` in float32 (saved to ``logits_out``) and
    float16 (beside it, ``-fp16.npy``), and HF fp16 ``generate`` tok/s on ``prompt``."""
    import torch

    torch.set_float32_matmul_precision("highest")  # no TF32 in the reference
    t0 = time.perf_counter()
    model = load_our_weights(Path(model_dir), device, torch.float32)
    ids = torch.tensor([tokens], device=device)
    with torch.no_grad():
        ref = model(ids).logits[0, -rows:].float().cpu().numpy()
        np.save(logits_out, ref)
        model = model.half()
        half = model(ids).logits[0, -rows:].float().cpu().numpy()
        np.save(str(logits_out).replace(".npy", "-fp16.npy"), half)
    out = {"rows": rows, "fp16_vs_fp32_max_abs_diff": float(np.abs(half - ref).max()),
           "max_abs_logit": float(np.abs(ref).max()), "load_seconds": time.perf_counter() - t0}
    if generate and prompt:
        out["hf_fp16"] = generate_tok_s(model, prompt, generate, device)
    del model
    _free(device)
    return out


def task_bandwidth(device: str, nbytes: int) -> dict:
    """Device-to-device copy bandwidth, bytes read + written per second (best of 10)."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(11):
        _sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del a, b
    _free(device)
    return {"copy_gb_s": 2 * nbytes / best / 1e9, "bytes": nbytes}


def task_compile(model_dir: str, prompt: list[int], tokens: int, device: str) -> dict:
    """transformers' static-cache generate with its forward under torch.compile (its own
    recommended path: ``cache_implementation="static"`` compiles the decoding forward)."""
    import torch
    from transformers import CompileConfig

    model = load_our_weights(Path(model_dir), device, torch.float16)
    config = CompileConfig()
    if device == "cpu":
        config._compile_all_devices = True  # transformers compiles on GPUs only unless told
    res = generate_tok_s(model, prompt, tokens, device, cache_implementation="static", compile_config=config)
    return {"tok_s": res["tok_s"], "runs_tok_s": res["runs_tok_s"], "compile_and_first_run_seconds": res["first_run_seconds"],
            "mode": config.mode}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


TASKS = {"init": task_init, "reference": task_reference, "bandwidth": task_bandwidth, "compile": task_compile}


def serve() -> None:
    """Answer one JSON task per stdin line with one JSON line on the real stdout; everything
    else anything prints (transformers, tqdm, C libraries) goes to stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch  # while the caller's first TVM measurements run: the first task does not wait for it
    import transformers

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    reply.write(json.dumps({"ok": True, "torch": torch.__version__, "transformers": transformers.__version__,
                            "torch_cuda": torch.version.cuda, "torch_gpu": gpu}) + "\n")
    for line in sys.stdin:
        task = json.loads(line)
        name = task.pop("task")
        if name == "quit":
            break
        try:
            out = {"ok": True, **TASKS[name](**task)}
        except Exception as err:  # noqa: BLE001 - reported to the caller, which records it
            out = {"ok": False, "error": f"{type(err).__name__}: {err}"[-2000:]}
        reply.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    elif sys.argv[1:2] == ["compile"]:  # one task, arguments as a JSON object; prints one JSON line
        print(json.dumps(task_compile(**json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit("usage: python -m speccompile.gpu_check.torch_side serve | compile '{json arguments}'")
