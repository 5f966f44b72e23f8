"""Checkpoint sources: an HF folder (safetensors or pytorch .bin) or a GGUF file.

Every source gives the model config and a lazy ``get(hf_name) -> float32 ndarray`` so the
converter can stream one tensor at a time. GGUF tensors are renamed to HF names and
dequantized with the ``gguf`` package; llama-arch Q/K rows are un-permuted back to HF's
rotate-half RoPE order (llama.cpp permutes them on export).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from speccompile.models.config import LlamaConfig


class SourceError(ValueError):
    """A checkpoint that cannot be read; the message says what is wrong."""


class Source(Protocol):
    """What the converter needs from a checkpoint: its config and lazy tensors."""

    config: LlamaConfig
    path: Path

    def names(self) -> list[str]: ...

    def get(self, name: str) -> np.ndarray: ...


# ------------------------------------------------------------------ HF folders
def _check_safetensors_header(path: Path) -> None:
    """Fail early on a truncated file: the header's offsets must fit in the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SourceError(f"{path} is truncated (no safetensors header)")
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > size - 8:
            raise SourceError(f"{path} is truncated or corrupt (header length {hlen} > file size {size})")
        try:
            header = json.loads(f.read(hlen))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise SourceError(f"{path} has a corrupt safetensors header: {err}") from err
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + hlen + end > size:
        raise SourceError(
            f"{path} is truncated: tensors need {8 + hlen + end} bytes, the file has {size}. Re-download it."
        )


class TensorFiles:
    """The tensors of a folder: ``*.safetensors``, else ``pytorch_model*.bin`` (or Medusa's
    ``medusa_lm_head.pt``), loaded weights-only; no config is read here."""

    def __init__(self, folder: Path, extra_bin: tuple[str, ...] = ()):
        self.path = Path(folder)
        st_files = sorted(self.path.glob("*.safetensors"))
        bin_files = sorted(self.path.glob("pytorch_model*.bin")) + [self.path / n for n in extra_bin
                                                                     if (self.path / n).exists()]
        self._index: dict[str, Path] = {}
        self._bin_cache: dict[Path, dict[str, Any]] = {}
        if st_files:
            from safetensors import safe_open

            for f in st_files:
                _check_safetensors_header(f)
                with safe_open(str(f), framework="numpy") as h:
                    for k in h.keys():
                        self._index[k] = f
            self._kind = "safetensors"
        elif bin_files:
            self._kind = "bin"
            for f in bin_files:
                for k in self._load_bin(f):
                    self._index[k] = f
        else:
            raise SourceError(f"{self.path} has no *.safetensors or pytorch_model*.bin weights")

    def _load_bin(self, f: Path) -> dict[str, Any]:
        if f not in self._bin_cache:
            try:
                import torch
            except ImportError as err:
                raise SourceError(f"{f} is a PyTorch checkpoint: install torch to read it (pip install torch)") from err
            try:
                # weights_only: never unpickle arbitrary objects from a checkpoint
                self._bin_cache = {f: torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)}
            except Exception as err:  # noqa: BLE001 - report any torch failure as a source error
                raise SourceError(f"cannot read {f} safely (weights only): {err}") from err
        return self._bin_cache[f]

    def names(self) -> list[str]:
        return list(self._index)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape without reading its data (checks run before any long work)."""
        if name not in self._index:
            raise SourceError(f"tensor {name!r} is missing from {self.path}")
        f = self._index[name]
        if self._kind == "safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="numpy") as h:
                return tuple(int(d) for d in h.get_slice(name).get_shape())
        return tuple(int(d) for d in self._load_bin(f)[name].shape)

    def get(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise SourceError(f"tensor {name!r} is missing from {self.path}")
        f = self._index[name]
        if self._kind == "safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="numpy") as h:
                    t = h.get_tensor(name)
                    return t if t.dtype.kind in "iu" else np.asarray(t, dtype=np.float32)  # d2t stays integer
            except TypeError:  # bf16 is not a numpy dtype: go through torch-free raw bytes
                return _read_safetensors_bf16(f, name)
        t = self._load_bin(f)[name]
        return t.numpy() if not t.is_floating_point() else t.float().numpy()


class HFSource(TensorFiles):
    def __init__(self, folder: Path):
        self.config = LlamaConfig.from_hf_folder(Path(folder))
        super().__init__(folder)
        self._raw_config = json.loads((self.path / "config.json").read_text())
        if "lm_head.weight" not in self._index and not self.config.tie_word_embeddings:
            if "tie_word_embeddings" in self._raw_config:
                raise SourceError("config says tie_word_embeddings=false but lm_head.weight is missing")
            self.config.tie_word_embeddings = True


def _read_safetensors_bf16(path: Path, name: str) -> np.ndarray:
    with path.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(hlen))
        info = header[name]
        start, end = info["data_offsets"]
        fh.seek(8 + hlen + start)
        raw = np.frombuffer(fh.read(end - start), dtype=np.uint16)
    if info["dtype"] != "BF16":
        raise SourceError(f"unsupported safetensors dtype {info['dtype']} for {name}")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


# ------------------------------------------------------------------------ GGUF
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
# Gemma's four norms: llama.cpp's ffn_norm is the MLP's input norm, transformers' pre_feedforward_layernorm
_GGUF_GEMMA_NAMES = {**_GGUF_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                     "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}


def gguf_to_hf_name(name: str, arch: str = "llama") -> str | None:
    if name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[name]
    parts, table = name.split("."), _GGUF_GEMMA_NAMES if arch == "gemma3" else _GGUF_LAYER_NAMES
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in table:
        return f"model.layers.{parts[1]}.{table[parts[2]]}.{parts[3]}"
    return None


def gguf_field_value(field: Any) -> Any:
    return field.contents()


class GGUFSource:
    def __init__(self, path: Path):
        import gguf

        self.path = Path(path)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as err:  # noqa: BLE001 - gguf raises assorted errors on bad files
            raise SourceError(f"{self.path} is not a readable GGUF file (truncated or corrupt?): {err}") from err
        self.fields = {k: f for k, f in self.reader.fields.items()}
        scalar = {k: gguf_field_value(f) for k, f in self.fields.items()
                  if not k.startswith("tokenizer.ggml.") or k.endswith("_id")}
        scalar["tokenizer.ggml.tokens"] = self.fields["tokenizer.ggml.tokens"].contents() \
            if "tokenizer.ggml.tokens" in self.fields else []
        self.config = LlamaConfig.from_gguf_fields(scalar)
        self._tensors = {}
        for t in self.reader.tensors:
            hf = gguf_to_hf_name(t.name, self.config.model_type)
            if hf is not None:
                self._tensors[hf] = t
        self.config.tie_word_embeddings = "lm_head.weight" not in self._tensors
        self.norms_shifted = self.config.model_type == "gemma3"  # llama.cpp stores Gemma's norms as 1 + w
        freqs = next((t for t in self.reader.tensors if t.name == "rope_freqs.weight"), None)
        if freqs is not None:  # Llama 3's RoPE bands, as llama.cpp writes them: per-pair divisors
            from gguf.quants import dequantize

            full = self.config.rope_parameters["full_attention"]
            if full.get("rope_type", "default") != "default":
                raise SourceError(f"{self.path} has rope_freqs and rope scaling {full['rope_type']}: only one is expected")
            factors = np.asarray(dequantize(freqs.data, freqs.tensor_type), np.float32).ravel()
            full.update(rope_type="freq_factors", factors=[float(f) for f in factors])
            try:
                self.config.rope(0)
            except ValueError as err:
                raise SourceError(f"{self.path}: {err}") from err

    def names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        if name not in self._tensors:
            raise SourceError(f"tensor {name!r} is missing from {self.path}")
        t = self._tensors[name]
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(x) for x in reversed(t.shape)]) if arr.size == int(np.prod(t.shape)) else arr
        cfg = self.config
        if cfg.model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            arr = arr.reshape(heads, arr.shape[0] // heads // 2, 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)
        return arr


def open_source(src: Path) -> Source:
    """Open an HF folder or a .gguf file; the error names what was expected."""
    src = Path(src)
    if not src.exists():
        raise SourceError(f"{src} does not exist")
    if src.is_file() and src.suffix == ".gguf":
        return GGUFSource(src)
    if src.is_dir():
        ggufs = sorted(src.glob("*.gguf"))
        if not (src / "config.json").exists() and len(ggufs) == 1:
            return GGUFSource(ggufs[0])
        return HFSource(src)
    raise SourceError(f"{src} is neither an HF model folder nor a .gguf file")


# ------------------------------------------------------------- draft heads
class HeadSource:
    """An EAGLE-1, EAGLE-3 or Medusa checkpoint folder checked against its target.

    ``config`` is the head's config (models/eagle.py, eagle3.py, medusa.py), built from the
    head's config.json plus the target's sizes; a head trained for another target fails
    here, before any tensor is converted. Medusa's bare ``I.J.*`` keys (its
    ``medusa_lm_head.pt``) are read as ``medusa_head.I.J.*``. Two tensors may be implied
    rather than stored: a draft vocabulary's ``lm_head.weight`` (the target's own rows of
    its tokens, see ``_draft_rows_of_target``) and, for an EAGLE-3 head over the whole
    vocabulary, ``d2t`` (zeros: SafeAILab drops it when the vocabularies are equal)."""

    def __init__(self, kind: str, folder: Path, target: Path | None, config_overrides: dict | None = None):
        from speccompile.models import ConfigError, head_config_class

        folder = Path(folder)
        if target is None:
            raise SourceError(f"a {kind} head needs its target model: pass --target TARGET (HF folder or .gguf)")
        if not folder.is_dir():
            raise SourceError(f"{folder} is not a folder holding a {kind} checkpoint (config.json + weights)")
        self.path, self.kind, self.target_path = folder, kind, Path(target)
        self.target_config = open_source(Path(target)).config
        cfg_path = folder / "config.json"
        raw = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        raw.update(config_overrides or {})  # --overrides: e.g. Medusa sizes the checkpoint's config lacks
        if kind in ("eagle", "eagle3") and not raw:
            raise SourceError(f"{cfg_path} not found: an EAGLE head folder needs its (Llama) config.json")
        self.files = TensorFiles(folder, extra_bin=("medusa_lm_head.pt",) if kind == "medusa" else ())
        self._alias = {}
        if kind == "medusa":
            for n in self.files.names():
                if re.match(r"\d+\.\d+\.", n):
                    self._alias["medusa_head." + n] = n
        if kind == "eagle3":
            self._alias = {eagle3_name(n): n for n in self.files.names() if eagle3_name(n) != n}
        names = self.files.names()
        names = self.names(with_implied=False)
        eagle3 = kind == "eagle3" and "fc.weight" in names  # (else from_checkpoint says what it is not)
        self._identity_d2t = eagle3 and "d2t" not in names
        self._target_rows = "lm_head.weight" not in names and ("d2t" in names or self._identity_d2t)
        try:
            self.config = head_config_class(kind).from_checkpoint(raw, self.target_config, self.names(), self.shape)
        except ConfigError as err:
            raise SourceError(f"{folder}: {err}") from err
        if eagle3:
            self._check_vocabulary_maps()

    def names(self, with_implied: bool = True) -> list[str]:
        extra = (["lm_head.weight"] if self._target_rows else []) + (["d2t"] if self._identity_d2t else []) \
            if with_implied else []
        aliased = set(self._alias.values())
        return [n for n in self.files.names() if not re.match(r"\d+\.\d+\.", n) and n not in aliased] + \
            list(self._alias) + extra

    def shape(self, name: str) -> tuple[int, ...]:
        if name == "lm_head.weight" and self._target_rows:
            return (int(self.shape("d2t")[0]), self.target_config.hidden_size)
        if name == "d2t" and self._identity_d2t:
            return (self.target_config.vocab_size,)
        return self.files.shape(self._alias.get(name, name))

    def get(self, name: str) -> np.ndarray:
        if name == "lm_head.weight" and self._target_rows:
            return self._draft_rows_of_target()
        if name == "d2t" and self._identity_d2t:
            return np.zeros(self.target_config.vocab_size, np.int64)
        return self.files.get(self._alias.get(name, name))

    def draft_token_ids(self) -> np.ndarray:
        """The target token of each draft vocabulary row (``j + d2t[j]``), checked to be
        distinct tokens of the target."""
        from speccompile.runtime.drafters.eagle import check_draft_vocab

        ids = np.arange(self.shape("d2t")[0]) + self.get("d2t").astype(np.int64)
        try:
            check_draft_vocab(ids, self.target_config.vocab_size, self.kind)
        except ValueError as err:
            raise SourceError(f"{self.path}: {err}") from err
        return ids

    def _check_vocabulary_maps(self) -> None:
        """An EAGLE-3 head's ``d2t`` must map onto distinct target tokens, and its ``t2d`` (the
        mask of target tokens in the draft vocabulary, not needed at run time) mark exactly
        those: a checkpoint whose two maps disagree was written wrongly."""
        ids = self.draft_token_ids()
        if "t2d" in self.files.names():
            marked = np.flatnonzero(self.files.get("t2d").astype(bool))
            if marked.size != ids.size or not np.array_equal(marked, np.sort(ids)):
                raise SourceError(f"{self.path}: t2d marks {marked.size} target tokens but d2t maps the draft "
                                  f"vocabulary onto {ids.size} others; the checkpoint's two maps disagree")

    def _draft_rows_of_target(self) -> np.ndarray:
        """A reduced draft vocabulary given only as ``d2t``: its projection is the target's own
        output embedding restricted to those tokens (what our trainer freezes), so the head
        need not ship a copy of it -- the rows are read from ``--target`` here."""
        ids = self.draft_token_ids()
        target = open_source(self.target_path)
        name = "lm_head.weight" if "lm_head.weight" in target.names() else "model.embed_tokens.weight"
        return np.ascontiguousarray(target.get(name)[ids])


def eagle3_name(name: str) -> str:
    """A published EAGLE-3 tensor's name as SafeAILab writes it: vLLM's ``speculators`` format
    and SGLang's loader name the decoder layer ``layers.0`` (SafeAILab, SpecForge and AngelSlim
    ``midlayer``), some exports prefix ``model.``, and SGLang calls SpecForge's per-feature
    norms ``aux_norm_low/mid/high`` (``fc_norm.0/1/2``)."""
    name = name[len("model."):] if name.startswith("model.") else name
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    for i, part in enumerate(("low", "mid", "high")):
        name = name.replace(f"aux_norm_{part}.", f"fc_norm.{i}.")
    return name


def detect_head(src: Path) -> str | None:
    """``eagle``/``eagle3``/``medusa`` when a folder holds such a head (for --model-type auto,
    and to tell EAGLE-3 from EAGLE-1 under --model-type eagle): EAGLE-3 checkpoints have a
    ``hidden_norm`` in their one decoder layer (``midlayer`` or ``layers.0``: :func:`eagle3_name`)
    and an fc three features wide; EAGLE-1 ones ``layers.N`` without it."""
    src = Path(src)
    if not src.is_dir():
        return None
    cfg = src / "config.json"
    raw = json.loads(cfg.read_text()) if cfg.exists() else {}
    if "medusa_num_heads" in raw or (src / "medusa_lm_head.pt").exists():
        return "medusa"
    try:
        names = TensorFiles(src).names()
    except SourceError:
        return None
    canonical = [eagle3_name(n) for n in names]
    if "fc.weight" in canonical:
        return "eagle3" if "midlayer.hidden_norm.weight" in canonical else "eagle"
    if any(n.startswith("medusa_head.") for n in names):
        return "medusa"
    return None
