/*
 * speccompile C API: embed a compiled model in an application.
 *
 * The runtime is thin: it loads a model library built by `speccompile compile`
 * (a shared object for llvm/cuda/opencl/vulkan, or objects linked into the app for
 * iOS) and the converted weights (tensor-cache.json + params_shard_*.bin), and runs
 * greedy or sampled generation, plain or with n-gram speculation (prompt lookup).
 * It links only the TVM runtime (libtvm_runtime + libtvm_ffi), never the compiler.
 *
 * Token ids in, token ids out: apps tokenize with their platform's tokenizer. A small
 * byte-level BPE detokenizer (GPT-2 style tokenizer.json, as SmolLM2 and Qwen use) is
 * included so that examples can print text.
 *
 * Errors: every function returning int returns SPC_OK (0) or a negative SPC_ERR_*
 * code; spc_last_error() then describes the failure (per thread, valid until the
 * next failing call on that thread). Handles are not thread-safe: use one session
 * per thread, or serialize calls. Several sessions may share one model sequentially
 * but not concurrently.
 *
 * Greedy generation (temperature 0) is token-identical to `speccompile generate`
 * (Python Engine.generate), with or without speculation: the library's own
 * verification kernel accepts exactly the drafts plain greedy decoding would emit.
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
  SPC_ERR_INVALID_ARGUMENT = -1, /* NULL handle, bad option, empty/over-long prompt, bad token id */
  SPC_ERR_IO = -2,               /* a missing, unreadable or truncated file */
  SPC_ERR_INCOMPATIBLE = -3,     /* library built for other weights, another device, or too old */
  SPC_ERR_KV_FULL = -4,          /* the KV cache cannot hold the prompt (raise max_total_seq_len) */
  SPC_ERR_RUNTIME = -5           /* any other failure inside the TVM runtime */
};

/* Message of the last failure on this thread ("" if none). */
SPC_API const char* spc_last_error(void);

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

/* ----------------------------------------------------------------- session */
typedef struct spc_session spc_session;

enum { SPC_SPEC_DISABLE = 0, SPC_SPEC_NGRAM = 1 };

typedef struct {
  int speculative_mode;     /* SPC_SPEC_DISABLE (plain decoding) or SPC_SPEC_NGRAM */
  int ngram_min, ngram_max; /* suffix n-gram sizes tried, longest first (default 1..4) */
  int draft_length;         /* drafts verified per step, >= 1 (default 4) */
  int64_t max_total_seq_len; /* KV cache capacity in tokens; 0 = the context window */
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
  int64_t prefill_tokens;     /* prompt tokens */
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

/* ----------------------------------------------- detokenizer (byte-level BPE) */
typedef struct spc_detokenizer spc_detokenizer;

/* Load model.vocab and added_tokens of a tokenizer.json whose decoder is ByteLevel
 * (GPT-2 style: SmolLM2, Qwen2, Llama 3); other decoders give SPC_ERR_INCOMPATIBLE. */
SPC_API int spc_detokenizer_load(const char* tokenizer_json_path, spc_detokenizer** out);
SPC_API void spc_detokenizer_free(spc_detokenizer* detok);
/* UTF-8 bytes of ids (special added tokens skipped when skip_special is nonzero),
 * NUL-terminated in buf if it fits; *out_len = bytes needed without the NUL. A token
 * cut in the middle of a multi-byte character yields its raw bytes. */
SPC_API int spc_detokenize(const spc_detokenizer* detok, const int32_t* ids, size_t n_ids, int skip_special,
                           char* buf, size_t buf_size, size_t* out_len);

#ifdef __cplusplus
}
#endif

#endif /* SPECCOMPILE_H_ */
