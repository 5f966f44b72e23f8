"""Medusa heads (FasterDecoding layout): K extra heads on the target's last hidden state.

Head i is ``num_layers`` residual blocks ``x + SiLU(Linear(x))`` and a bias-free Linear to
the vocabulary; from the target's final-normed hidden state at position t it predicts
token t+i+2 (the target's own lm_head predicts t+1). All K heads run in one forward,
``medusa_heads(hidden [b, h]) -> logits [K, b, vocab]``, so a draft costs one call.

Parameter names equal the official ones (``medusa_head.I.J.linear.weight/bias`` and
``medusa_head.I.{num_layers}.weight``), so ``source_map`` is the identity. The official
config only holds ``medusa_num_heads``/``medusa_num_layers``; hidden size and vocabulary
come from the target (``--target``), and the tensors' shapes are checked against it.

On a CPU the K vocabulary Linears would cost more than half of a SmolLM2 step (each is
the size of its lm_head), so heads may instead share an EAGLE-3 style reduced draft
vocabulary: one ``lm_head.weight`` [draft_vocab, h] with ``d2t`` (draft id j is target
token ``j + d2t[j]``) and no per-head vocabulary weight; each head's matmul then reads
that small matrix. Our trainer writes this form when the projection is frozen
(speccompile/training/medusa.py). Drafts are verified by the target, so it changes speed only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from speccompile.runtime.contract import MEDUSA

from speccompile.models.config import ConfigError, LlamaConfig, reduced_vocabulary_size
from speccompile.models.exports import contract_spec
from speccompile.models.quantization import QLinear, Quantization


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_layers: int
    context_window_size: int
    prefill_chunk_size: int
    draft_vocab_size: int = 0  # 0: a vocabulary Linear per head; else one shared [draft_vocab, h] + d2t
    model_type = "medusa"
    # no KV cache: these keep the metadata schema shared with decoders
    num_hidden_layers = property(lambda self: 0)
    num_key_value_heads = property(lambda self: 0)
    head_dim = property(lambda self: 0)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("hidden_size", "vocab_size", "num_heads", "num_layers",
                                              "context_window_size", "prefill_chunk_size", "draft_vocab_size")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MedusaConfig":
        try:
            return cls(**data)
        except TypeError as err:
            raise ConfigError(f"bad Medusa model config: {err}") from err

    def extra_metadata(self) -> dict[str, Any]:
        return {"head_kind": "medusa", "medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                "draft_vocab_size": self.draft_vocab_size}

    @classmethod
    def from_checkpoint(cls, raw: dict[str, Any], target: LlamaConfig, names: list[str],
                        shape: Callable[[str], tuple[int, ...]]) -> "MedusaConfig":
        """Sizes from the config (or the tensor names), hidden size and vocab from the
        target; the tensors must fit the target before any long work starts."""
        found = [re.match(r"medusa_head\.(\d+)\.(\d+)\.", n) for n in names]
        found = [(int(m.group(1)), int(m.group(2))) for m in found if m]
        if not found:
            raise ConfigError("not a Medusa checkpoint: no medusa_head.I.J.* tensors")
        shared = "d2t" in names  # a reduced draft vocabulary: one projection shared by the heads
        heads = int(raw.get("medusa_num_heads", max(i for i, _ in found) + 1))
        layers = int(raw.get("medusa_num_layers", max(j for _, j in found) + int(shared)))
        if heads <= 0 or layers < 0:
            raise ConfigError(f"bad Medusa config: medusa_num_heads={heads}, medusa_num_layers={layers}")
        have = max(i for i, _ in found) + 1  # the sizes may come from --overrides: fewer heads is fine, more is not
        if heads > have:
            raise ConfigError(f"medusa_num_heads={heads} but the checkpoint holds {have} heads (medusa_head.0..{have - 1})")
        lacking = [j for j in range(layers) if f"medusa_head.0.{j}.linear.weight" not in names]
        if lacking:
            raise ConfigError(f"medusa_num_layers={layers} but the checkpoint lacks medusa_head.0.{lacking[0]}.linear.weight")
        h, v = target.hidden_size, target.vocab_size
        out = f"medusa_head.0.{layers}.weight"
        if shared:
            if any(f"medusa_head.{i}.{layers}.weight" in names for i in range(heads)):
                raise ConfigError("the Medusa checkpoint has d2t (a shared reduced vocabulary) and per-head vocabulary "
                                  f"weights ({out}): keep one or the other")
            dv = reduced_vocabulary_size(raw, target, shape, "the Medusa heads' shared")
            return cls(h, v, heads, layers, target.context_window_size, target.prefill_chunk_size, dv)
        if out not in names:
            raise ConfigError(f"the Medusa checkpoint lacks {out} (config says medusa_num_layers={layers})")
        got = tuple(shape(out))
        if got[1:] != (h,):
            raise ConfigError(f"the Medusa heads have hidden size {got[-1]} ({out} is {list(got)}) but the target "
                              f"has {h}: these heads were trained for another model")
        if got[0] != v:
            raise ConfigError(f"the Medusa heads predict {got[0]} tokens ({out} is {list(got)}) but the target's "
                              f"vocabulary has {v}: these heads were trained for another model")
        return cls(h, v, heads, layers, target.context_window_size, target.prefill_chunk_size)


class ResBlock(nn.Module):
    def __init__(self, h: int, quant: Quantization):
        super().__init__()
        self.linear = QLinear(h, h, quant, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return x + op.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig, quant: Quantization, target=None):
        super().__init__()
        self.cfg, self.quant, self.dtype = cfg, quant, quant.model_dtype
        h = cfg.hidden_size
        dv = cfg.draft_vocab_size
        self.medusa_head = nn.ModuleList([
            nn.ModuleList([ResBlock(h, quant) for _ in range(cfg.num_layers)]
                          + ([] if dv else [QLinear(h, cfg.vocab_size, quant)])) for _ in range(cfg.num_heads)])
        if dv:  # on a CPU the vocabulary projection is the cost of a draft: one small one for all heads
            self.lm_head = QLinear(h, dv, quant)
            self.d2t = nn.Parameter((dv,), "int32")  # read by the runtime at load

    def medusa_heads(self, hidden: Tensor) -> Tensor:
        # hidden: [b, h] target features -> logits [K, b, vocab] (or [K, b, draft_vocab]), float32
        b, k = hidden.shape[0], self.cfg.num_heads
        dv = self.cfg.draft_vocab_size
        outs = []
        for head in self.medusa_head:
            x = hidden
            for block in list(head)[: self.cfg.num_layers]:
                x = block(x)
            # one matmul per head, also when they share the projection: a [K * b, h] input
            # has a composite row count, which our kernels do not take (they gave wrong rows)
            logits = self.lm_head(x) if dv else list(head)[-1](x)
            logits = logits if logits.dtype == "float32" else logits.astype("float32")
            outs.append(op.reshape(logits, (1, b, dv or self.cfg.vocab_size)))
        return outs[0] if k == 1 else op.concat(outs, dim=0)

    def get_spec(self) -> dict[str, Any]:
        return contract_spec(self, MEDUSA, {"hidden": nn.spec.Tensor(["b", self.cfg.hidden_size], self.dtype)})


def source_map(cfg: MedusaConfig) -> dict[str, list[str]]:
    """Our logical weight name -> the official tensor (names are the same)."""
    m: dict[str, list[str]] = {}
    for i in range(cfg.num_heads):
        for j in range(cfg.num_layers):
            for kind in ("weight", "bias"):
                m[f"medusa_head.{i}.{j}.linear.{kind}"] = [f"medusa_head.{i}.{j}.linear.{kind}"]
        if not cfg.draft_vocab_size:
            m[f"medusa_head.{i}.{cfg.num_layers}.weight"] = [f"medusa_head.{i}.{cfg.num_layers}.weight"]
    if cfg.draft_vocab_size:
        m["lm_head.weight"] = ["lm_head.weight"]
        m["d2t"] = ["d2t"]
    return m
