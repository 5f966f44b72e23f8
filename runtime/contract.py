"""The compiler/runtime contract: what a library built by ``speccompile compile`` and the
runtimes that load it agree on, stated once.

Why a module of its own: these facts used to be written wherever they were needed -- the
KV page size three times, the entry points once per side, the argument order of the
per-forward token metadata re-read by position, the config file name twice -- and
nothing failed when one copy moved: a library and a runtime that disagreed ran and
gave wrong tokens. Here each fact has one definition; the compiler exports what this
module says (models/exports.py checks every compiled method against the table), records
it in the library's ``_metadata``, and the loaders refuse a library whose record
differs (:func:`check_library`) before any weight is read.

Plain Python with no TVM import: the runtime side imports only the TVM runtime, never
the compiler, and the compiler (models/, passes/, speccompile/compiler/compile.py) may import
this. The C API cannot import Python, so it mirrors the parts it uses in
``runtime/capi/src/contract.h`` and reads the page size from ``_metadata``;
tests/compiler/test_contract.py checks that the two agree.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

# ----------------------------------------------------------------- model directory
# A converted model directory holds these two files (plus tokenizer files and shards).
MODEL_CONFIG_FILE = "speccompile-config.json"  # written by gen_config; read by compile and the runtimes
TENSOR_CACHE_FILE = "tensor-cache.json"  # written by convert_weight: the shards' index

# ------------------------------------------------------------------ paged KV cache
# Tokens per KV page. The attention kernel turns a row into a slot as
# ``page_table[row // KV_PAGE_SIZE] * KV_PAGE_SIZE + row % KV_PAGE_SIZE`` with the size
# compiled in, while the host bookkeeping (runtime/kv_cache.py, the C API) hands out
# pages and builds page tables: both must use the same number or tokens read other
# tokens' keys. The library records it as ``kv_page_size``.
KV_PAGE_SIZE = 16

# The per-forward token metadata every forward entry point takes after the KV tensor,
# in this order: name -> (symbolic shape, dtype). "n" is the forward's token count and
# "b" its sequence count, so arrays whose shape starts with "n" are per token (a subset
# of tokens takes their rows) and the page table is per sequence. runtime/kv_cache.py
# builds them by name; models/llama.py declares its forwards' arguments from this table.
FORWARD_META: dict[str, tuple[tuple[str, ...], str]] = {
    "positions": (("n",), "int32"),  # RoPE position of each token
    "write_slots": (("n",), "int32"),  # KV slot each token's k/v is written to
    "page_table": (("b", "pages"), "int32"),  # page ids of each sequence in the batch
    "token_seq": (("n",), "int32"),  # page-table row of each token
    "token_prefix": (("n",), "int32"),  # rows 0..prefix-1 of its sequence each token attends
    "extra_slots": (("n", "e"), "int32"),  # further slots it attends (tree ancestors, itself)
    "extra_len": (("n",), "int32"),  # how many of extra_slots' columns each token uses
}

# ------------------------------------------------------- bounds of symbolic dimensions
# Every symbolic dimension of the entry points' arguments, with its upper bound as a multiple
# of the library's prefill_chunk_size T (the most tokens one forward may take): name ->
# (factor, offset), bound = factor * T + offset; None where no compile-time bound exists.
#
# Why: the compiler hands these bounds to TVM's memory planning (StaticPlanBlockMemory, via
# each function's ``tir_var_upper_bound``), which then gives every buffer an entry point
# allocates -- intermediates and outputs -- one size fixed at compile time, enough for the
# bound. Without them every buffer's size is a function of the token count, and the relax
# VM's pooled allocator, which keeps each freed buffer for reuse by its exact size, kept a
# new set of buffers for every new token count and never gave them back: a process's memory
# grew with every new prompt length or batch shape (SmolLM2 q0f32: +350 MB over 55 prompt
# lengths; a Qwen2.5-1.5B data-generation job: 2.8 -> 8 GB). The runtimes keep the bounds:
# no forward takes more than T tokens (runtime/model.py refuses, and splits long prefills),
# and a batch has at most T sequences (each brings at least one token).
# Dimensions without a bound must shape no buffer an entry point allocates: the compiler
# fails if one does (speccompile/compiler/compile.py).
SYMBOLIC_DIM_BOUNDS: dict[str, tuple[int, int] | None] = {
    "n": (1, 0),  # tokens of one forward (rows of embed, get_logits, sampling, acceptance)
    "nl": (1, 0),  # prefill logit rows: one per sequence of the forward
    "b": (1, 0),  # sequences of one forward (page-table rows; Medusa's feature rows)
    "b1": (1, 1),  # b + 1 (seq_indptr of the acceptance kernels)
    "nq": (1, 0),  # draft distribution rows: n, or 1 when every draft is one-hot
    "nu": (2, 0),  # uniforms of rejection sampling: n + b
    "c": (1, 0),  # slot moves of a tree commit: at most the verified tree's rows
    "s": (1, 0),  # scored rows of draft_catch_up: one per sequence of the forward
    # rows of the features draft_step's parents are taken from (the last draft call's output): an
    # input, gathered into [n, hidden], shapes no allocation
    "m": None,
    # the page-table width grows with a sequence (and with a tree's scratch rows past the
    # context window); the page table is an input and shapes no allocation
    "pages": None,
    # extra slots per token: an EAGLE head's new rows attend ancestors written by earlier
    # forwards, so not bounded by this forward's tokens; an input, shapes no allocation
    "e": None,
    # KV capacity in slots, chosen at run time (max_total_seq_length); the KV tensor is
    # written in place, never allocated by an entry point
    "slots": None,
}


def symbolic_dim_bounds(prefill_chunk_size: int) -> dict[str, int]:
    """The upper bound of each bounded symbolic dimension for a library whose forwards take
    at most ``prefill_chunk_size`` tokens (see SYMBOLIC_DIM_BOUNDS)."""
    return {name: factor * prefill_chunk_size + offset
            for name, rule in SYMBOLIC_DIM_BOUNDS.items() if rule is not None for factor, offset in [rule]}


# ------------------------------------------------------------------- entry points
# Argument names of the compiled functions, in calling order. PARAMS is the packed tuple
# of the library's parameters (in the order of ``_metadata["params"]``), always last; KV
# is the KV cache tensor, updated in place.
PARAMS = "params"
KV = "kv"
_FORWARD = (KV, *FORWARD_META, PARAMS)

# Library kinds: a target (or small draft) model, an EAGLE-1 head, an EAGLE-3 head, a set of
# Medusa heads.
TARGET, EAGLE, EAGLE3, MEDUSA = "target", "eagle", "eagle3", "medusa"
HEAD_KINDS = (EAGLE, EAGLE3, MEDUSA)

# kind -> entry point -> its arguments. The compiler exports exactly these (with these
# argument orders) and records them in ``_metadata["entry_points"]``; the loaders
# (runtime/model.py, eagle.py, medusa.py, the C API) require them and call them so.
ENTRY_POINTS: dict[str, dict[str, tuple[str, ...]]] = {
    TARGET: {
        # token ids [n] -> embeddings [n, hidden]; every forward starts from these
        "embed": ("input_ids", PARAMS),
        # a chunk of prompt tokens; logits [nl, vocab] at logit_positions only (the last
        # token of each sequence), so a long prompt never materializes [n, vocab]
        "prefill": ("input_embeds", "logit_positions", *_FORWARD),
        # one token per sequence -> logits [b, vocab]
        "decode": ("input_embeds", *_FORWARD),
        # several tokens per sequence, a chain or a token tree -> logits at every row [n, vocab]
        "forward_tokens": ("input_embeds", *_FORWARD),
        # as forward_tokens, but the final-normed hidden states [n, hidden] a draft head reads
        "forward_tokens_hidden": ("input_embeds", *_FORWARD),
        # as forward_tokens_hidden, plus the outputs of the decoder layers _metadata's
        # feature_layers names (low, mid, high), concatenated [n, 3 * hidden]: an EAGLE-3 head's input
        "forward_tokens_features": ("input_embeds", *_FORWARD),
        # hidden states [n, hidden] -> [n, 3 * hidden], the shape (so the planned size) of
        # forward_tokens_features' features: what a CUDA graph of that forward keeps its features'
        # block with (runtime/cuda_graph.py), as get_logits keeps the logits' block
        "feature_buffer": ("hidden_states", PARAMS),
        # hidden states [n, hidden] -> logits [n, vocab], bit-identical to the fused forwards'
        "get_logits": ("hidden_states", PARAMS),
        # kv[:, :, dst[i]] = kv[:, :, src[i]]: commits the accepted path of a token tree
        "copy_kv_slots": (KV, "src", "dst"),
        # greedy acceptance on device: argmax and tree walk -> [b + 1, n + 2]
        "accept_greedy": ("logits", "tokens", "parents", "seq_indptr"),
        # logits -> probabilities with temperature, top-k, top-p per row
        "sampling_probs": ("logits", "temperature", "top_k", "top_p"),
        # rejection sampling over chains and trees on device -> [b + 1, n + 2]
        "accept_sampled": ("p", "q", "one_hot", "tokens", "parents", "seq_indptr", "uniforms"),
    },
    EAGLE: {
        # (embedding of token i+1, target feature f_i) pairs -> predicted features f_{i+1}
        "eagle_forward": ("input_embeds", "hidden", *_FORWARD),
        # predicted features -> logits over the head's reduced draft vocabulary
        "draft_logits": ("hidden", PARAMS),
        # one draft depth in one call (runtime/drafters/eagle.py): token ids [n] of the rows, their parents'
        # features hidden[hidden_rows] ([m, hidden], [n]), target_embed = the target's embedding
        # tensors (_metadata's target_embed) -> (predicted features [n, hidden], the draft_top_k best
        # target token ids [n, k] of each row, their log-softmax over the draft vocabulary [n, k])
        "draft_step": ("input_ids", "hidden", "hidden_rows", "target_embed", *_FORWARD),
        # the catch-up on target features [n, hidden]: as draft_step, the top-k only at score_rows [s]
        # (each sequence's last row) -> (features [s, hidden], ids [s, k], log-probabilities [s, k])
        "draft_catch_up": ("input_ids", "hidden", "score_rows", "target_embed", *_FORWARD),
    },
    EAGLE3: {
        # the target's low/mid/high layer features [n, 3 * hidden] -> fc -> [n, hidden]
        "fuse_features": ("features", PARAMS),
        # (embedding of token i+1, fused target feature or the head's own output at i) pairs ->
        # the head's output at i [n, hidden], before its final norm (fed back at the next depth)
        "eagle_forward": ("input_embeds", "hidden", *_FORWARD),
        # the head's outputs -> its final norm and lm_head -> logits over its draft vocabulary
        "draft_logits": ("hidden", PARAMS),
        # as EAGLE's: embedding, layer, norm, lm_head and top-k in one call; hidden[hidden_rows] is
        # the head's own output at each row's parent -> (outputs [n, hidden], ids [n, k], log-probs [n, k])
        "draft_step": ("input_ids", "hidden", "hidden_rows", "target_embed", *_FORWARD),
        # the catch-up from target layer features [n, 3 * hidden]: fc, then as draft_step, the
        # top-k at score_rows [s] -> (outputs [s, hidden], ids [s, k], log-probs [s, k])
        "draft_catch_up": ("input_ids", "features", "score_rows", "target_embed", *_FORWARD),
    },
    MEDUSA: {
        # target features [b, hidden] -> every head's logits [K, b, vocab]
        "medusa_heads": ("hidden", PARAMS),
    },
}

# Entry points only some libraries of their kind export: (kind, name) -> the ``_metadata``
# key whose nonzero (non-empty) value says the library has it (and the loaders then require
# it). An EAGLE-1 head has ``draft_logits`` exactly when it carries a reduced draft
# vocabulary, and ``draft_step``/``draft_catch_up`` then too (``draft_top_k`` > 0: with the
# target's lm_head it drafts through the separate calls); a target has
# ``forward_tokens_features`` when it records its feature layers (libraries built before
# EAGLE-3 support, or before draft steps on device, lack them and keep loading: the runtime
# takes the separate calls), and ``feature_buffer`` when ``_metadata["feature_buffer"]`` is
# true (without it the features forward runs as calls, not as a CUDA graph).
OPTIONAL_ENTRY_POINTS: dict[tuple[str, str], str] = {(EAGLE, "draft_logits"): "draft_vocab_size",
                                                     (EAGLE, "draft_step"): "draft_top_k",
                                                     (EAGLE, "draft_catch_up"): "draft_top_k",
                                                     (TARGET, "forward_tokens_features"): "feature_layers",
                                                     (TARGET, "feature_buffer"): "feature_buffer"}

# --------------------------------------------------------------------- _metadata
# The ``_metadata`` keys the runtimes rely on, and why. ``compile`` writes more (TVM
# version, q4 kernel ISA...) for people; these are the ones code reads. Values may be
# null where they do not apply (``mcpu`` of a GPU library), but the keys are present.
METADATA_KEYS: dict[str, str] = {
    "speccompile_version": "written first: the runtime finds the JSON in a library's bytes by this key, "
                           "to explain a library it cannot load",
    "model_type": "checked against the config's (and a head's against the speculative mode)",
    "quantization": "named when weights and library disagree",
    "target": "the device kind the kernels run on; a library for another kind is refused",
    "device": "named in refusals (e.g. a cuda library on a machine with no GPU)",
    "cuda_archs": "named in refusals of a CUDA library",
    "mcpu": "named in refusals of a CPU library",
    "mtriple": "a CPU library for another architecture is refused",
    "cpu_features": "instructions the code may use; refused on a CPU without them (runtime/cpu.py)",
    "vocab_size": "range check of token ids; draft heads must match their target",
    "hidden_size": "draft heads must match their target",
    "model_dtype": "dtype of activations and the KV cache",
    "num_hidden_layers": "KV cache shape",
    "num_key_value_heads": "KV cache shape",
    "head_dim": "KV cache shape",
    "context_window_size": "longest sequence the library was compiled for",
    "prefill_chunk_size": "most tokens (and sequences) one forward may take: the buffers are planned for that "
                          "many (SYMBOLIC_DIM_BOUNDS)",
    "params": "name, shape, dtype of each parameter in the order the packed tuple is passed",
    "layout_fingerprint": "checked against tensor-cache.json before any weight is read",
    "tiled_params": "stored tensors the runtime permutes into tile-row blocks at load",
    "tile": "the row count of those blocks",
    "kv_page_size": "tokens per KV page the kernels were compiled for (KV_PAGE_SIZE)",
    "entry_points": "each exported function's argument names in calling order (ENTRY_POINTS)",
}
KIND_METADATA_KEYS: dict[str, dict[str, str]] = {
    TARGET: {},  # plus, optionally, feature_layers and feature_buffer (OPTIONAL_ENTRY_POINTS)
    # plus, optionally, draft_top_k and target_embed as EAGLE3's (OPTIONAL_ENTRY_POINTS)
    EAGLE: {"draft_vocab_size": "0, or the size of the reduced vocabulary (d2t, draft_logits)"},
    EAGLE3: {"draft_vocab_size": "the size of its draft vocabulary (d2t, draft_logits)",
             "feature_layers": "the target layers its fc reads: the target's must be the same",
             "draft_top_k": "k of draft_step/draft_catch_up: the widest tree they serve",
             "target_embed": "name, shape, dtype of the target's embedding tensors draft_step takes "
                             "(the target's own are passed; a target storing them otherwise drafts "
                             "through the separate calls)"},
    MEDUSA: {"draft_vocab_size": "0, or the size of the heads' shared reduced vocabulary (d2t)",
             "medusa_num_heads": "K: the first dimension of medusa_heads' output"},
}

REBUILD = "rebuild it with `speccompile compile <model_dir>/speccompile-config.json`"


class ContractError(ValueError):
    """A model directory or library that does not follow this contract."""


def library_kind(meta: dict) -> str:
    """Which of ENTRY_POINTS' kinds a library's ``_metadata`` describes."""
    model_type = meta.get("model_type")
    return model_type if model_type in HEAD_KINDS else TARGET


def required_metadata(kind: str) -> tuple[str, ...]:
    """Every ``_metadata`` key a library of ``kind`` must carry."""
    return (*METADATA_KEYS, *KIND_METADATA_KEYS[kind])


def entry_point_names(kind: str, meta: dict) -> list[str]:
    """The entry points a library of ``kind`` with this ``_metadata`` must export (and a
    loader binds): the kind's, optional ones only where the metadata says so."""
    return [name for name in ENTRY_POINTS[kind]
            if (kind, name) not in OPTIONAL_ENTRY_POINTS or meta.get(OPTIONAL_ENTRY_POINTS[kind, name])]


def check_library(meta: dict, kind: str, lib_path: Path | str) -> None:
    """Refuse a library that breaks the contract, naming what differs and how to fix it.

    Run by every loader before any weight is read: a library of another kind, one built
    by an older speccompile (a required key or entry point missing), one compiled with
    another KV page size, or one whose entry points take their arguments in another
    order -- each would otherwise load and compute garbage."""
    have = library_kind(meta)
    if have != kind:
        raise ContractError(f"{lib_path} is a {meta.get('model_type')} library ({have} entry points); "
                            f"a {kind} library is needed here")
    missing = [key for key in required_metadata(kind) if key not in meta]
    if missing:
        raise ContractError(f"{lib_path} lacks {', '.join(missing)} in its _metadata: it was built by an older "
                            f"speccompile; {REBUILD}")
    if meta["kv_page_size"] != KV_PAGE_SIZE:
        raise ContractError(f"{lib_path} was compiled for KV pages of {meta['kv_page_size']} tokens, this runtime "
                            f"uses {KV_PAGE_SIZE}; {REBUILD}")
    exported = meta["entry_points"]
    if not isinstance(exported, dict):
        raise ContractError(f"{lib_path} does not record its entry points' arguments: it was built by an older "
                            f"speccompile; {REBUILD}")
    for name in entry_point_names(kind, meta):
        if name not in exported:
            raise ContractError(f"{lib_path} lacks the entry point {name!r}: it was built by an older speccompile; "
                                f"{REBUILD}")
        if tuple(exported[name]) != ENTRY_POINTS[kind][name]:
            raise ContractError(f"{lib_path}'s entry point {name} takes ({', '.join(exported[name])}), this runtime "
                                f"passes ({', '.join(ENTRY_POINTS[kind][name])}); {REBUILD}")


def model_config_path(model_dir: Path | str) -> Path:
    """The config file of a model directory (a path to the file itself is kept as is)."""
    path = Path(model_dir)
    return path if path.suffix == ".json" or path.is_file() else path / MODEL_CONFIG_FILE


def read_model_config(model_dir: Path | str) -> dict:
    """``speccompile-config.json`` of a converted model directory, as a dict.

    The one reader of that file (compile, the runtimes, the tools), so a missing or
    broken file gets the same error everywhere: it names the file and the command
    that writes it."""
    path = model_config_path(model_dir)
    if not path.exists():
        raise ContractError(f"{path} not found: run `speccompile gen_config SRC -o {path.parent}`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ContractError(f"{path} is not valid JSON ({err}): rerun `speccompile gen_config SRC -o "
                            f"{path.parent}`") from None


def baked_metadata(lib_path: Path) -> dict | None:
    """The ``_metadata`` JSON read from the file's bytes, without loading the library.

    A library whose device runtime is missing here (a cuda or opencl build on a CPU-only
    machine) cannot be loaded at all, yet its error should still name what it was built
    for; ``.tar`` archives are never loadable. The JSON sits verbatim in the packed blob.
    Here, with no TVM import, so that a process without TVM's compiler can read a library's
    parameter layout (``convert_weight --layout-from``).
    """
    lib_path = Path(lib_path)
    if tarfile.is_tarfile(lib_path):
        with tarfile.open(lib_path) as tar:
            data = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    else:
        data = lib_path.read_bytes()
    at = data.find(b'{"speccompile_version"')
    if at < 0:
        return None
    try:
        meta, _ = json.JSONDecoder().raw_decode(data[at:at + (8 << 20)].decode("utf-8", "replace"))
    except ValueError:
        return None
    return meta
