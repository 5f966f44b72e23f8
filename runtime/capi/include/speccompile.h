/*
 * speccompile C API: embed a compiled model in an application.
 *
 * The runtime is thin: it loads a model library built by `speccompile compile`
 * (a shared object for llvm/cuda/opencl/vulkan, or objects linked into the app for
 * iOS) and the converted weights (tensor-cache.json + params_shard_*.bin), and runs
 * greedy or sampled generation, plain or with speculation: the suffix index (the default),
 * n-gram lookup, a smaller draft model, an EAGLE-1/EAGLE-3 head or Medusa heads, as chains or
 * token trees, and the suffix index merged per step with a draft model or head.
 * It links only the TVM runtime (libtvm_runtime + libtvm_ffi), never the compiler.
 *
 * Text in, text out: the model folder's tokenizer.json (byte-level BPE: SmolLM2, Qwen2,
 * Llama 3) is read by a tokenizer that gives HF `tokenizers`' ids, and the chat format
 * gen_config records renders a conversation as the model's chat template does. Token ids
 * in and out work too (spc_generate), for apps that tokenize themselves.
 *
 * Errors: every function returning int returns SPC_OK (0) or a negative SPC_ERR_*
 * code; spc_last_error() then describes the failure (per thread, valid until the
 * next failing call on that thread). A NULL, freed or foreign handle is
 * SPC_ERR_INVALID_ARGUMENT, never a crash, and freeing a handle twice is harmless.
 * Handles are not thread-safe: use one session per thread, or serialize calls.
 * Several sessions may share one model sequentially but not concurrently.
 *
 * Greedy generation (temperature 0) is token-identical to `speccompile generate`
 * (Python Engine.generate), with or without speculation: the library's own
 * verification kernel accepts exactly the drafts plain greedy decoding would emit.
 * Sampled generation follows the target's distribution (rejection sampling).
 */
#ifndef SPECCOMPILE_H_
#define SPECCOMPILE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPC_API __declspec(dllexport)
#else
#define SPC_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------ errors */
enum {
  SPC_OK = 0,
  SPC_ERR_INVALID_ARGUMENT = -1, /* NULL handle, bad option, empty/over-long prompt, bad token id, invalid UTF-8 */
  SPC_ERR_IO = -2,               /* a missing, unreadable or truncated file */
  SPC_ERR_INCOMPATIBLE = -3,     /* library built for other weights, another device, or too old */
  SPC_ERR_KV_FULL = -4,          /* the KV cache cannot hold the prompt (raise max_total_seq_len) */
  SPC_ERR_RUNTIME = -5           /* any other failure inside the TVM runtime */
};

/* Message of the last failure on this thread ("" if none). */
SPC_API const char* spc_last_error(void);

/* The CPU threads TVM's kernels run on in this process: TVM_NUM_THREADS or OMP_NUM_THREADS
 * when the app set one, else the physical cores this process may run on, which
 * spc_model_load puts in TVM_NUM_THREADS before the first kernel (TVM's own default is half
 * the logical CPUs, one thread on a 2-vCPU machine without SMT). */
SPC_API int spc_cpu_threads(void);

/* ------------------------------------------------------------------- model */
typedef struct spc_model spc_model;

/* Load a compiled library and its converted weights.
 *   model_dir: folder with speccompile-config.json, tensor-cache.json and the shards;
 *   lib_path:  the library from `speccompile compile` (must match the weights: the
 *              library's _metadata is checked against tensor-cache.json first);
 *   device:    "auto" or NULL: the kind the library was built for (its _metadata
 *              "target"), device 0; or "cpu" (llvm libraries), "cuda", "opencl",
 *              "metal", "vulkan", optionally with ":<id>" ("opencl:1").
 * The device runtime of a cuda or opencl library (libtvm_runtime_cuda.so beside the
 * linked libtvm_runtime; libspeccompile_opencl.so from $SPECCOMPILE_OPENCL_RUNTIME, the
 * path baked in at build time, or the library path) is loaded first; a missing one is
 * SPC_ERR_IO naming the file and how to get it (see README.md).
 * Refuses a library built for another device kind, or a device that is not present,
 * with SPC_ERR_INCOMPATIBLE. */
SPC_API int spc_model_load(const char* model_dir, const char* lib_path, const char* device, spc_model** out);
SPC_API void spc_model_free(spc_model* model);
SPC_API int32_t spc_model_vocab_size(const spc_model* model);
SPC_API int32_t spc_model_context_window(const spc_model* model);
/* The library's _metadata JSON (owned by the model). */
SPC_API const char* spc_model_metadata(const spc_model* model);
/* Where this load read the weights: "image" (the weights image the Python runtime and the C API
 * share, mapped, not copied: CPU libraries once a model was loaded twice) or "shards" (copied
 * out of the converted shards); "" for an invalid handle. */
SPC_API const char* spc_model_weights_from(const spc_model* model);

/* ----------------------------------------------------------------- session */
typedef struct spc_session spc_session;

/* Where drafts come from (runtime/speculative.py's modes):
 *   SPC_SPEC_DISABLE:     plain decoding;
 *   SPC_SPEC_NGRAM:       n-gram lookup in the sequence so far;
 *   SPC_SPEC_SMALL_DRAFT: a smaller draft model with the target's vocabulary (draft_model);
 *   SPC_SPEC_SUFFIX:      the suffix index (the most frequent continuations of the longest
 *                         matching context); with a draft_model (a draft model, an EAGLE head
 *                         or Medusa heads) both draft every step, merged into one token tree;
 *   SPC_SPEC_EAGLE:       an EAGLE-1 or EAGLE-3 head (draft_model) on the target's features;
 *   SPC_SPEC_MEDUSA:      Medusa heads (draft_model) on the target's last hidden state.
 * A head is a library `speccompile compile` built from `convert_weight --model-type
 * eagle|eagle3|medusa --target ...`, loaded with spc_model_load like any model. */
enum {
  SPC_SPEC_DISABLE = 0,
  SPC_SPEC_NGRAM = 1,
  SPC_SPEC_SMALL_DRAFT = 2,
  SPC_SPEC_SUFFIX = 3,
  SPC_SPEC_EAGLE = 4,
  SPC_SPEC_MEDUSA = 5
};

typedef struct {
  int speculative_mode;     /* SPC_SPEC_SUFFIX (default), or another SPC_SPEC_* above */
  int ngram_min, ngram_max; /* SPC_SPEC_NGRAM: suffix n-gram sizes tried, longest first (default 1..4) */
  int draft_length;         /* chain length, or tree depth, >= 1 (default 4) */
  int64_t max_total_seq_len; /* KV cache capacity in tokens; 0 = the context window */
  /* 1 (default): the prefix cache keeps the last generation's KV, and a next prompt that starts
   * with the same tokens (a chat's next turn, the whole conversation resent) prefills only
   * what is new; 0: every prompt is prefilled whole. (A session holds one sequence.) */
  int prefix_cache_max_num_recycling_seqs;
  /* The additional model the mode drafts with, loaded with spc_model_load: a draft model (same
   * vocabulary as the target) for SPC_SPEC_SMALL_DRAFT, an EAGLE head for SPC_SPEC_EAGLE, Medusa
   * heads for SPC_SPEC_MEDUSA, any of them (or NULL) for SPC_SPEC_SUFFIX. A head built for
   * another target, or of another kind than the mode drives, is SPC_ERR_INCOMPATIBLE. One
   * additional model may serve several sessions; free it after them. NULL otherwise. */
  spc_model* draft_model;
  /* Token trees (suffix, eagle, medusa): candidates per tree level (1, the default: a chain),
   * and the most draft nodes verified per step (1..256, default 64). */
  int spec_tree_width;
  int spec_tree_nodes;
} spc_session_config;

/* Fill a config with the defaults above. */
SPC_API void spc_session_config_default(spc_session_config* config);
/* A session owns one KV cache and runs one generation at a time. The model must
 * outlive the session. config NULL = defaults. */
SPC_API int spc_session_create(spc_model* model, const spc_session_config* config, spc_session** out);
SPC_API void spc_session_free(spc_session* session);

/* -------------------------------------------------------------- generation */
typedef struct {
  int32_t max_tokens; /* upper bound on generated tokens (> 0; also capped by the context) */
  float temperature;  /* 0 = greedy (default); > 0 samples */
  float top_p;        /* (0, 1], default 1 */
  int32_t top_k;      /* 0 = off */
  uint64_t seed;      /* sampling seed */
  int ignore_eos;     /* nonzero: do not stop at the config's stop_token_ids */
  /* Stop strings (UTF-8): generation ends where the text first contains one, and the text
   * returned ends before it. They are matched on the text, so they need the model's tokenizer. */
  const char* const* stop;
  size_t n_stop;
  /* Changes to the target's logits before a token is chosen, as runtime/penalties.py makes them:
   * each verify row is adjusted as of its own prefix, so speculation stays exact. */
  float min_p;              /* drop tokens below min_p x the likeliest one's probability; 0 = off (default) */
  float frequency_penalty;  /* -2..2: minus this x a token's count in the output so far; 0 = off */
  float presence_penalty;   /* -2..2: minus this for a token already in the output; 0 = off */
  float repetition_penalty; /* (0, 10]: a prompt or output token's positive logit / it, negative x it; 1 (or 0) = off */
  const int32_t* logit_bias_tokens; /* n_logit_bias token ids ... */
  const float* logit_bias;          /* ... and the bias added to each, -100..100 (-100 bans it) */
  size_t n_logit_bias;
} spc_generate_params;

SPC_API void spc_generate_params_default(spc_generate_params* params);

/* Called after each decode step with the tokens emitted by that step (the first call
 * carries the token sampled after prefill). Return nonzero to stop generation
 * (finish reason SPC_FINISH_CANCELLED). */
typedef int (*spc_token_callback)(const int32_t* tokens, size_t n_tokens, void* user_data);

enum { SPC_FINISH_NONE = 0, SPC_FINISH_STOP = 1, SPC_FINISH_LENGTH = 2, SPC_FINISH_CANCELLED = 3 };

/* Generate a continuation of prompt[0..n_prompt). Generated ids (without the stop
 * token) are written to out_tokens (up to out_capacity; out_tokens may be NULL when
 * out_capacity is 0) and their total number to *out_len (may exceed out_capacity:
 * the rest were only streamed). callback may be NULL. Stats of this call are then
 * available from spc_session_stats(). */
SPC_API int spc_generate(spc_session* session, const int32_t* prompt, size_t n_prompt,
                         const spc_generate_params* params, spc_token_callback callback, void* user_data,
                         int32_t* out_tokens, size_t out_capacity, size_t* out_len);

typedef struct {
  int64_t prefill_tokens;     /* prompt tokens prefilled */
  int64_t cached_prompt_tokens; /* prompt tokens whose KV the prefix cache held (not prefilled) */
  int64_t decode_tokens;      /* tokens emitted by decode steps (after the first token) */
  int64_t draft_tokens;       /* draft tokens proposed and verified */
  int64_t accepted_tokens;    /* draft tokens the target accepted */
  int64_t verify_steps;       /* target forwards that verified >= 1 draft */
  int64_t plain_steps;        /* target forwards with no draft */
  double prefill_seconds, decode_seconds;
  double prefill_tokens_per_s, decode_tokens_per_s;
  double accept_rate;          /* accepted / draft tokens */
  double mean_accepted_length; /* tokens emitted per verify step, bonus included */
  int finish_reason;           /* SPC_FINISH_* */
} spc_stats;

/* Stats of the session's last spc_generate call. */
SPC_API int spc_session_stats(const spc_session* session, spc_stats* out);

/* The session's last generation, valid until the next one or until the session is freed:
 * the prompt's token ids (what spc_generate_text / spc_generate_chat tokenized) and the
 * generated ones. Any pointer pair may be NULL. */
SPC_API int spc_session_last_tokens(const spc_session* session, const int32_t** prompt_ids, size_t* n_prompt,
                                    const int32_t** ids, size_t* n_ids);
/* The text of the session's last generation (what spc_generate_text / spc_generate_chat
 * returned; "" after spc_generate without stop strings), with the same lifetime. */
SPC_API int spc_session_last_text(const spc_session* session, const char** text, size_t* n_bytes);

/* --------------------------------------------------- tokenizer (byte-level BPE) */
typedef struct spc_tokenizer spc_tokenizer;

/* Load a tokenizer.json (path to the file, or to a folder holding it). Byte-level BPE with
 * the pre-tokenizers of GPT-2, SmolLM2, Qwen2 and Llama 3 and an NFC normalizer or none;
 * anything else is SPC_ERR_INCOMPATIBLE, naming the part it cannot run. */
SPC_API int spc_tokenizer_load(const char* path, spc_tokenizer** out);
SPC_API void spc_tokenizer_free(spc_tokenizer* tokenizer);
/* The model folder's tokenizer, loaded on first use and owned by the model. */
SPC_API int spc_model_tokenizer(spc_model* model, const spc_tokenizer** out);
/* UTF-8 text[0..text_len) -> ids, as HF `Tokenizer.encode(text, add_special_tokens=False)`:
 * special tokens written in the text ("<|im_start|>") are recognized. Up to capacity ids go
 * to out_ids, their total number to *out_len. Invalid UTF-8 is SPC_ERR_INVALID_ARGUMENT. */
SPC_API int spc_tokenize(const spc_tokenizer* tokenizer, const char* text, size_t text_len, int32_t* out_ids,
                         size_t capacity, size_t* out_len);
/* ids -> UTF-8 text, as HF `Tokenizer.decode` (special tokens skipped when skip_special is
 * nonzero; bytes that do not form a character become U+FFFD). NUL-terminated in buf if it
 * fits; *out_len = bytes needed without the NUL. */
SPC_API int spc_detokenize(const spc_tokenizer* tokenizer, const int32_t* ids, size_t n_ids, int skip_special, char* buf,
                           size_t buf_size, size_t* out_len);
/* The id of a token's exact text ("<|im_end|>"), or -1. */
SPC_API int32_t spc_token_id(const spc_tokenizer* tokenizer, const char* token);

/* ------------------------------------------------------------ text and chat */
typedef struct {
  const char* role;    /* "system", "user", "assistant", or "tool" where the model's format has it */
  const char* content; /* UTF-8 */
} spc_chat_message;

/* The conversation rendered as the model's chat template renders it (`speccompile generate`
 * uses the Jinja template; the C API the chat format gen_config derived from it and checked
 * equal), with the assistant's generation prompt when add_generation_prompt is nonzero.
 * NUL-terminated in buf if it fits; *out_len = bytes needed without the NUL. A model folder
 * converted before chat formats existed, or whose template cannot be expressed as one, is
 * SPC_ERR_INCOMPATIBLE (pass raw text instead). */
SPC_API int spc_chat_render(spc_model* model, const spc_chat_message* messages, size_t n_messages,
                            int add_generation_prompt, char* buf, size_t buf_size, size_t* out_len);

/* Called after each decode step with the text it added (UTF-8, possibly empty while a
 * character is incomplete); return nonzero to stop (SPC_FINISH_CANCELLED). */
typedef int (*spc_text_callback)(const char* delta, size_t n_bytes, void* user_data);

/* Generate from text, as `speccompile generate --prompt TEXT [--raw]`: raw = 0 renders the
 * prompt as one user message with the chat format, raw != 0 tokenizes it as it is. The text
 * (without a stop string) goes to out_text, NUL-terminated if it fits, its length to *out_len;
 * the token ids are then spc_session_last_tokens. callback may be NULL. */
SPC_API int spc_generate_text(spc_session* session, const char* prompt, int raw, const spc_generate_params* params,
                              spc_text_callback callback, void* user_data, char* out_text, size_t out_capacity,
                              size_t* out_len);

/* Generate the assistant's next message in a conversation (rendered with the chat format and
 * the generation prompt), otherwise as spc_generate_text. */
SPC_API int spc_generate_chat(spc_session* session, const spc_chat_message* messages, size_t n_messages,
                              const spc_generate_params* params, spc_text_callback callback, void* user_data,
                              char* out_text, size_t out_capacity, size_t* out_len);

#ifdef __cplusplus
}
#endif

#endif /* SPECCOMPILE_H_ */
