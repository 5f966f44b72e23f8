// The extern "C" surface of speccompile.h: argument checks, and every C++ exception
// turned into an SPC_ERR_* code plus a per-thread message (spc_last_error), so that no
// exception ever crosses the C boundary.
#include <tvm/ffi/error.h>

#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <string>
#include <vector>

#include "chat_format.h"
#include "contract.h"
#include "json_util.h"
#include "model.h"
#include "session.h"
#include "speccompile.h"
#include "threads.h"
#include "tokenizer.h"

namespace {

thread_local std::string g_last_error;

// Every handle handed out and not yet freed. Why: an app calling with a freed (or never
// created) handle gets SPC_ERR_INVALID_ARGUMENT instead of a crash, and a second free is harmless.
std::mutex g_handles_mu;
std::unordered_set<const void*> g_handles;

void Register(const void* h) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_handles.insert(h);
}
bool Unregister(const void* h) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_handles.erase(h) > 0;
}
bool Live(const void* h) {
  if (!h) return false;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_handles.count(h) > 0;
}
const char* const kBadHandle = ": NULL argument, or a handle that was freed or not made by this library";

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

struct spc_tokenizer {
  std::unique_ptr<spc::Tokenizer> impl;
  bool owned_by_model = false;  // spc_model_tokenizer's: freed with its model
};
struct spc_model {
  std::unique_ptr<spc::Model> impl;
  std::string dir;
  // Text in and out, loaded on first use: an app passing token ids never pays for them.
  std::unique_ptr<spc_tokenizer> tokenizer;
  std::unique_ptr<spc::ChatFormat> chat_format;
  tvm::ffi::json::Object config;  // speccompile-config.json, read at load
  bool add_bos_token = false;
  int32_t bos_token_id = -1;

  spc_tokenizer* Tokenizer() {
    if (!tokenizer) {
      auto t = std::make_unique<spc_tokenizer>();
      t->impl = std::make_unique<spc::Tokenizer>(dir + "/tokenizer.json");
      t->owned_by_model = true;
      Register(t.get());
      tokenizer = std::move(t);
    }
    return tokenizer.get();
  }
  const spc::ChatFormat& Chat() {
    if (!chat_format) chat_format = std::make_unique<spc::ChatFormat>(spc::ChatFormat::FromConfig(config));
    return *chat_format;
  }
  // runtime/generation.py encode_prompt: one user message through the chat format (or the text
  // as it is), tokenized, with the BOS token in front when the config asks for one.
  std::vector<int32_t> EncodePrompt(const std::string& text) {
    std::vector<int32_t> ids = Tokenizer()->impl->Encode(text);
    if (add_bos_token && bos_token_id >= 0 && (ids.empty() || ids[0] != bos_token_id)) ids.insert(ids.begin(), bos_token_id);
    return ids;
  }
};
struct spc_session {
  std::unique_ptr<spc::Session> impl;
  spc_model* model = nullptr;
  spc_model* draft = nullptr;  // small_draft's draft model, or null
  spc::Result last;
};


namespace {

// A request from the C arguments: the stop strings copied, the model's tokenizer attached when
// text is wanted or stop strings need it.
spc::Request MakeRequest(spc_session* session, const spc_generate_params* params, bool text) {
  if (!Live(session->model) || (session->draft && !Live(session->draft))) {
    throw std::invalid_argument("the session's model or draft model was freed before the session");
  }
  spc::Request req;
  spc_generate_params_default(&req.params);
  if (params) req.params = *params;
  if (req.params.n_stop && !req.params.stop) throw std::invalid_argument("n_stop is set but stop is NULL");
  for (size_t i = 0; i < req.params.n_stop; ++i) {
    if (!req.params.stop[i]) throw std::invalid_argument("stop[" + std::to_string(i) + "] is NULL");
    req.stop.emplace_back(req.params.stop[i]);
  }
  req.params.stop = nullptr;  // the copies above are what the session reads
  req.params.n_stop = 0;
  if (req.params.n_logit_bias && (!req.params.logit_bias_tokens || !req.params.logit_bias)) {
    throw std::invalid_argument("n_logit_bias is set but logit_bias_tokens or logit_bias is NULL");
  }
  req.logit_bias_tokens.assign(req.params.logit_bias_tokens, req.params.logit_bias_tokens + req.params.n_logit_bias);
  req.logit_bias.assign(req.params.logit_bias, req.params.logit_bias + req.params.n_logit_bias);
  req.params.logit_bias_tokens = nullptr;  // the session reads the request's own copies
  req.params.logit_bias = nullptr;
  if (text || !req.stop.empty()) req.tokenizer = session->model->Tokenizer()->impl.get();
  return req;
}

void CopyText(const std::string& text, char* buf, size_t cap, size_t* out_len) {
  if (out_len) *out_len = text.size();
  if (cap) {
    size_t n = std::min(cap - 1, text.size());
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
}

int GenerateText(spc_session* session, const std::function<std::string(spc_model*)>& render,
                 const spc_generate_params* params, spc_text_callback callback, void* user_data, char* out_text,
                 size_t out_capacity, size_t* out_len) {
  if (out_len) *out_len = 0;
  if (out_capacity) out_text[0] = '\0';
  return Guard([&] {
    spc::Request req = MakeRequest(session, params, true);
    req.prompt = session->model->EncodePrompt(render(session->model));
    if (callback) {
      req.on_step = [&](const int32_t*, size_t, const std::string& delta) {
        return callback(delta.data(), delta.size(), user_data) != 0;
      };
    }
    session->impl->Generate(req, &session->last);
    CopyText(session->last.text, out_text, out_capacity, out_len);
  });
}

std::vector<spc::ChatMessage> Messages(const spc_chat_message* messages, size_t n) {
  std::vector<spc::ChatMessage> out;
  for (size_t i = 0; i < n; ++i) {
    if (!messages[i].role || !messages[i].content) {
      throw std::invalid_argument("message " + std::to_string(i) + " has a NULL role or content");
    }
    out.push_back({messages[i].role, messages[i].content});
  }
  return out;
}

}  // namespace

extern "C" {

const char* spc_last_error(void) { return g_last_error.c_str(); }

int spc_cpu_threads(void) {
  int chosen = spc::UserThreads();
  return chosen >= 0 ? chosen : spc::PhysicalCores();
}

int spc_model_load(const char* model_dir, const char* lib_path, const char* device, spc_model** out) {
  if (!model_dir || !lib_path || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_model_load: NULL argument");
  *out = nullptr;
  return Guard([&] {
    auto m = std::make_unique<spc_model>();
    m->impl = std::make_unique<spc::Model>(model_dir, lib_path, device ? device : "auto");
    m->dir = model_dir;
    std::string path = m->dir + "/" + spc::contract::kModelConfigFile;  // spc::Model read it already: it exists
    m->config = spc::json::AsObject(spc::json::ParseFile(path), path);
    const tvm::ffi::json::Object& conf = m->config;
    if (spc::json::Has(conf, "add_bos_token")) m->add_bos_token = spc::json::Get(conf, "add_bos_token").cast<bool>();
    if (spc::json::Has(conf, "bos_token_id")) {
      std::vector<int64_t> bos = spc::json::GetIntOrList(conf, "bos_token_id");
      if (!bos.empty()) m->bos_token_id = static_cast<int32_t>(bos[0]);
    }
    Register(m.get());
    *out = m.release();
  });
}

void spc_model_free(spc_model* model) {
  if (!Unregister(model)) return;
  if (model->tokenizer) Unregister(model->tokenizer.get());
  delete model;
}

int32_t spc_model_vocab_size(const spc_model* model) {
  return Live(model) ? static_cast<int32_t>(model->impl->vocab_size()) : 0;
}

int32_t spc_model_context_window(const spc_model* model) {
  return Live(model) ? static_cast<int32_t>(model->impl->config().context_window_size) : 0;
}

const char* spc_model_weights_from(const spc_model* model) {
  return Live(model) ? model->impl->weights_from().c_str() : "";
}

const char* spc_model_metadata(const spc_model* model) {
  return Live(model) ? model->impl->metadata_json().c_str() : "";
}

void spc_session_config_default(spc_session_config* config) {
  if (!config) return;
  config->speculative_mode = SPC_SPEC_SUFFIX;  // the default mode of `speccompile generate`
  config->ngram_min = 1;
  config->ngram_max = 4;
  config->draft_length = 0;  // adaptive, as `speccompile generate`
  config->max_total_seq_len = 0;
  config->prefix_cache_max_num_recycling_seqs = 1;
  config->draft_model = nullptr;
  config->spec_tree_width = 1;
  config->spec_tree_nodes = 64;
}

int spc_session_create(spc_model* model, const spc_session_config* config, spc_session** out) {
  if (!Live(model) || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_session_create") + kBadHandle);
  *out = nullptr;
  spc_session_config cfg;
  spc_session_config_default(&cfg);
  if (config) cfg = *config;
  return Guard([&] {
    auto s = std::make_unique<spc_session>();
    if (cfg.draft_model && !Live(cfg.draft_model)) {
      throw std::invalid_argument("draft_model was freed or not made by this library");
    }
    s->impl = std::make_unique<spc::Session>(model->impl.get(), cfg,
                                             cfg.draft_model ? cfg.draft_model->impl.get() : nullptr);
    s->draft = cfg.draft_model;
    s->model = model;
    Register(s.get());
    *out = s.release();
  });
}

void spc_session_free(spc_session* session) {
  if (Unregister(session)) delete session;
}

void spc_generate_params_default(spc_generate_params* params) {
  if (!params) return;
  params->max_tokens = 128;
  params->temperature = 0.0f;
  params->top_p = 1.0f;
  params->top_k = 0;
  params->seed = 0;
  params->ignore_eos = 0;
  params->stop = nullptr;
  params->n_stop = 0;
  params->min_p = 0.0f;
  params->frequency_penalty = 0.0f;
  params->presence_penalty = 0.0f;
  params->repetition_penalty = 1.0f;
  params->logit_bias_tokens = nullptr;
  params->logit_bias = nullptr;
  params->n_logit_bias = 0;
}

int spc_generate(spc_session* session, const int32_t* prompt, size_t n_prompt, const spc_generate_params* params,
                 spc_token_callback callback, void* user_data, int32_t* out_tokens, size_t out_capacity,
                 size_t* out_len) {
  if (!Live(session) || (!prompt && n_prompt) || (!out_tokens && out_capacity)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_generate") + kBadHandle);
  }
  if (out_len) *out_len = 0;
  return Guard([&] {
    spc::Request req = MakeRequest(session, params, false);
    req.prompt.assign(prompt, prompt + n_prompt);
    if (callback) {
      req.on_step = [&](const int32_t* t, size_t n, const std::string&) { return callback(t, n, user_data) != 0; };
    }
    session->impl->Generate(req, &session->last);
    const std::vector<int32_t>& emitted = session->last.token_ids;
    size_t n = std::min(out_capacity, emitted.size());
    if (n) std::memcpy(out_tokens, emitted.data(), n * sizeof(int32_t));
    if (out_len) *out_len = emitted.size();
  });
}

int spc_generate_text(spc_session* session, const char* prompt, int raw, const spc_generate_params* params,
                      spc_text_callback callback, void* user_data, char* out_text, size_t out_capacity,
                      size_t* out_len) {
  if (!Live(session) || !prompt || (!out_text && out_capacity)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_generate_text") + kBadHandle);
  }
  std::string text(prompt);
  auto render = [&](spc_model* m) { return raw ? text : m->Chat().Render({{"user", text}}, true); };
  return GenerateText(session, render, params, callback, user_data, out_text, out_capacity, out_len);
}

int spc_generate_chat(spc_session* session, const spc_chat_message* messages, size_t n_messages,
                      const spc_generate_params* params, spc_text_callback callback, void* user_data, char* out_text,
                      size_t out_capacity, size_t* out_len) {
  if (!Live(session) || (!messages && n_messages) || (!out_text && out_capacity)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_generate_chat") + kBadHandle);
  }
  auto render = [&](spc_model* m) { return m->Chat().Render(Messages(messages, n_messages), true); };
  return GenerateText(session, render, params, callback, user_data, out_text, out_capacity, out_len);
}

int spc_session_last_tokens(const spc_session* session, const int32_t** prompt_ids, size_t* n_prompt,
                            const int32_t** ids, size_t* n_ids) {
  if (!Live(session) || (!prompt_ids != !n_prompt) || (!ids != !n_ids)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_session_last_tokens: NULL session, or a pointer without its count");
  }
  if (prompt_ids) {
    *prompt_ids = session->last.prompt_token_ids.data();
    *n_prompt = session->last.prompt_token_ids.size();
  }
  if (ids) {
    *ids = session->last.token_ids.data();
    *n_ids = session->last.token_ids.size();
  }
  return SPC_OK;
}

int spc_session_last_text(const spc_session* session, const char** text, size_t* n_bytes) {
  if (!Live(session) || !text || !n_bytes) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_session_last_text") + kBadHandle);
  }
  *text = session->last.text.c_str();
  *n_bytes = session->last.text.size();
  return SPC_OK;
}

int spc_chat_render(spc_model* model, const spc_chat_message* messages, size_t n_messages, int add_generation_prompt,
                    char* buf, size_t buf_size, size_t* out_len) {
  if (!Live(model) || (!messages && n_messages) || (!buf && buf_size)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_chat_render") + kBadHandle);
  }
  if (out_len) *out_len = 0;
  return Guard([&] {
    std::string text = model->Chat().Render(Messages(messages, n_messages), add_generation_prompt != 0);
    CopyText(text, buf, buf_size, out_len);
  });
}

int spc_session_stats(const spc_session* session, spc_stats* out) {
  if (!Live(session) || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_session_stats") + kBadHandle);
  *out = session->impl->stats();
  return SPC_OK;
}

int spc_tokenizer_load(const char* path, spc_tokenizer** out) {
  if (!path || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, "spc_tokenizer_load: NULL argument");
  *out = nullptr;
  return Guard([&] {
    std::string file(path);
    std::ifstream probe(file + "/tokenizer.json");
    if (probe.good()) file += "/tokenizer.json";
    auto t = std::make_unique<spc_tokenizer>();
    t->impl = std::make_unique<spc::Tokenizer>(file);
    Register(t.get());
    *out = t.release();
  });
}

void spc_tokenizer_free(spc_tokenizer* tokenizer) {
  if (!Live(tokenizer) || tokenizer->owned_by_model) return;  // a model's own goes with its model
  Unregister(tokenizer);
  delete tokenizer;
}

int spc_model_tokenizer(spc_model* model, const spc_tokenizer** out) {
  if (!Live(model) || !out) return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_model_tokenizer") + kBadHandle);
  *out = nullptr;
  return Guard([&] { *out = model->Tokenizer(); });
}

int spc_tokenize(const spc_tokenizer* tokenizer, const char* text, size_t text_len, int32_t* out_ids, size_t capacity,
                 size_t* out_len) {
  if (!Live(tokenizer) || (!text && text_len) || (!out_ids && capacity)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_tokenize") + kBadHandle);
  }
  if (out_len) *out_len = 0;
  return Guard([&] {
    std::vector<int32_t> ids = tokenizer->impl->Encode(std::string(text ? text : "", text_len));
    size_t n = std::min(capacity, ids.size());
    if (n) std::memcpy(out_ids, ids.data(), n * sizeof(int32_t));
    if (out_len) *out_len = ids.size();
  });
}

int spc_detokenize(const spc_tokenizer* tokenizer, const int32_t* ids, size_t n_ids, int skip_special, char* buf,
                   size_t buf_size, size_t* out_len) {
  if (!Live(tokenizer) || (!ids && n_ids) || (!buf && buf_size)) {
    return Fail(SPC_ERR_INVALID_ARGUMENT, std::string("spc_detokenize") + kBadHandle);
  }
  if (out_len) *out_len = 0;
  return Guard([&] { CopyText(tokenizer->impl->Decode(ids, n_ids, skip_special != 0), buf, buf_size, out_len); });
}

int32_t spc_token_id(const spc_tokenizer* tokenizer, const char* token) {
  if (!Live(tokenizer) || !token) return -1;
  return tokenizer->impl->TokenId(token);
}

}  // extern "C"
