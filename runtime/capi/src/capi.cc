// The extern "C" surface of speccompile.h: argument checks, and every C++ exception
// turned into an SPC_ERR_* code plus a per-thread message (spc_last_error), so that no
// exception ever crosses the C boundary.
#include <tvm/ffi/error.h>

#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "detokenizer.h"
#include "model.h"
#include "session.h"
#include "speccompile.h"

struct spc_model {
  std::unique_ptr<spc::Model> impl;
};
struct spc_session {
  std::unique_ptr<spc::Session> impl;
};
struct spc_detokenizer {
  std::unique_ptr<spc::Detokenizer> impl;
};

namespace {

thread_local std::string g_last_error;

int Fail(int code, const std::string& msg) {
  g_last_error = msg;
  return code;
}

// Runs fn, mapping exceptions to error codes; the most specific classes come first.
template <typename F>
int Guard(F&& fn) {
  try {
    fn();
    return SPC_OK;
  } catch (const spc::KVCacheFull& e) {
    return Fail(SPC_ERR_KV_FULL, std::string("the KV cache cannot hold this generation (") + e.what() +
                                     "); raise max_total_seq_len");
  } catch (const spc::IoError& e) {
    return Fail(SPC_ERR_IO, e.what());
  } catch (const spc::IncompatibleError& e) {
    return Fail(SPC_ERR_INCOMPATIBLE, e.what());
  } catch (const std::invalid_argument& e) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, e.what());
  } catch (const tvm::ffi::Error& e) {
    return Fail(SPC_ERR_RUNTIME, e.kind() + ": " + e.message());
  } catch (const std::exception& e) {
    return Fail(SPC_ERR_RUNTIME, e.what());
  } catch (...) {
    return Fail(SPC_ERR_RUNTIME, "unknown error");
  }
}

}  // namespace

extern "C" {

const char* spc_last_error(void) { return g_last_error.c_str(); }

int spc_model_load(const char* model_dir, const char* lib_path, const char* device, spc_model** out) {
  if (!model_dir || !lib_path || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_model_load: NULL argument");
  *out = nullptr;
  return Guard([&] {
    auto m = std::make_unique<spc_model>();
    m->impl = std::make_unique<spc::Model>(model_dir, lib_path, device ? device : "auto");
    *out = m.release();
  });
}

void spc_model_free(spc_model* model) { delete model; }

int32_t spc_model_vocab_size(const spc_model* model) {
  return model ? static_cast<int32_t>(model->impl->vocab_size()) : 0;
}

int32_t spc_model_context_window(const spc_model* model) {
  return model ? static_cast<int32_t>(model->impl->config().context_window_size) : 0;
}

const char* spc_model_metadata(const spc_model* model) {
  return model ? model->impl->metadata_json().c_str() : "";
}

void spc_session_config_default(spc_session_config* config) {
  if (!config) return;
  config->speculative_mode = SPC_SPEC_DISABLE;
  config->ngram_min = 1;
  config->ngram_max = 4;
  config->draft_length = 4;
  config->max_total_seq_len = 0;
}

int spc_session_create(spc_model* model, const spc_session_config* config, spc_session** out) {
  if (!model || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_session_create: NULL argument");
  *out = nullptr;
  spc_session_config cfg;
  spc_session_config_default(&cfg);
  if (config) cfg = *config;
  return Guard([&] {
    auto s = std::make_unique<spc_session>();
    s->impl = std::make_unique<spc::Session>(model->impl.get(), cfg);
    *out = s.release();
  });
}

void spc_session_free(spc_session* session) { delete session; }

void spc_generate_params_default(spc_generate_params* params) {
  if (!params) return;
  params->max_tokens = 128;
  params->temperature = 0.0f;
  params->top_p = 1.0f;
  params->top_k = 0;
  params->seed = 0;
  params->ignore_eos = 0;
}

int spc_generate(spc_session* session, const int32_t* prompt, size_t n_prompt, const spc_generate_params* params,
                 spc_token_callback callback, void* user_data, int32_t* out_tokens, size_t out_capacity,
                 size_t* out_len) {
  if (!session || (!prompt && n_prompt) || (!out_tokens && out_capacity)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_generate: NULL argument");
  }
  spc_generate_params p;
  spc_generate_params_default(&p);
  if (params) p = *params;
  if (out_len) *out_len = 0;
  return Guard([&] {
    std::vector<int32_t> emitted;
    std::function<bool(const int32_t*, size_t)> on_tokens;
    if (callback) on_tokens = [&](const int32_t* t, size_t n) { return callback(t, n, user_data) != 0; };
    session->impl->Generate(std::vector<int32_t>(prompt, prompt + n_prompt), p, on_tokens, &emitted);
    size_t n = std::min(out_capacity, emitted.size());
    if (n) std::memcpy(out_tokens, emitted.data(), n * sizeof(int32_t));
    if (out_len) *out_len = emitted.size();
  });
}

int spc_session_stats(const spc_session* session, spc_stats* out) {
  if (!session || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_session_stats: NULL argument");
  *out = session->impl->stats();
  return SPC_OK;
}

int spc_detokenizer_load(const char* path, spc_detokenizer** out) {
  if (!path || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_detokenizer_load: NULL argument");
  *out = nullptr;
  return Guard([&] {
    auto d = std::make_unique<spc_detokenizer>();
    d->impl = std::make_unique<spc::Detokenizer>(path);
    *out = d.release();
  });
}

void spc_detokenizer_free(spc_detokenizer* detok) { delete detok; }

int spc_detokenize(const spc_detokenizer* detok, const int32_t* ids, size_t n_ids, int skip_special, char* buf,
                   size_t buf_size, size_t* out_len) {
  if (!detok || (!ids && n_ids) || (!buf && buf_size)) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_detokenize: NULL argument");
  return Guard([&] {
    std::string text = detok->impl->Decode(ids, n_ids, skip_special != 0);
    if (out_len) *out_len = text.size();
    if (buf_size) {
      size_t n = std::min(buf_size - 1, text.size());
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
  });
}

}  // extern "C"
