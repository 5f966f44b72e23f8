// The compiler/runtime contract as the C API uses it: the C++ mirror of
// runtime/contract.py, which states it for both sides (tests/compiler/test_contract.py checks
// that the names and argument lists here equal the Python ones).
//
// Why a mirror and not a copy of numbers: the KV page size is read from the library's
// `_metadata` (`kv_page_size`), so the C API follows whatever the kernels were compiled
// with; what stays fixed here are names -- the model directory's files, the metadata
// keys, and the entry points the C API calls with their argument order, which the
// library records in `_metadata["entry_points"]` and Model checks before any call.
#ifndef SPECCOMPILE_CAPI_CONTRACT_H_
#define SPECCOMPILE_CAPI_CONTRACT_H_

#include <string>
#include <vector>

namespace spc {
namespace contract {

inline constexpr const char* kModelConfigFile = "speccompile-config.json";
inline constexpr const char* kTensorCacheFile = "tensor-cache.json";
inline constexpr const char* kPageSizeKey = "kv_page_size";
inline constexpr const char* kEntryPointsKey = "entry_points";
inline constexpr const char* kRebuild = "rebuild it with `speccompile compile <model_dir>/speccompile-config.json`";

struct EntryPoint {
  const char* kind;               // the library kind (runtime/contract.py TARGET, EAGLE, EAGLE3, MEDUSA)
  const char* name;
  std::vector<std::string> args;  // in calling order; "params" is the packed parameter tuple
  // contract.py OPTIONAL_ENTRY_POINTS: the _metadata key whose nonzero value says the library
  // has it ("" = every library of its kind has it)
  const char* present_if = "";
};

// The entry points the C API calls, by kind (a subset of contract.ENTRY_POINTS: it drafts with
// a head only through the fused draft_step/draft_catch_up, and samples on the host).
inline const std::vector<EntryPoint>& CapiEntryPoints() {
  static const std::vector<EntryPoint> kEntryPoints = {
      {"target", "embed", {"input_ids", "params"}},
      {"target", "prefill", {"input_embeds", "logit_positions", "kv", "positions", "write_slots", "page_table",
                             "token_seq", "token_prefix", "extra_slots", "extra_len", "params"}},
      {"target", "decode", {"input_embeds", "kv", "positions", "write_slots", "page_table", "token_seq",
                            "token_prefix", "extra_slots", "extra_len", "params"}},
      {"target", "forward_tokens", {"input_embeds", "kv", "positions", "write_slots", "page_table", "token_seq",
                                    "token_prefix", "extra_slots", "extra_len", "params"}},
      {"target", "forward_tokens_hidden", {"input_embeds", "kv", "positions", "write_slots", "page_table",
                                           "token_seq", "token_prefix", "extra_slots", "extra_len", "params"}},
      {"target", "forward_tokens_features", {"input_embeds", "kv", "positions", "write_slots", "page_table",
                                             "token_seq", "token_prefix", "extra_slots", "extra_len", "params"},
       "feature_layers"},
      {"target", "get_logits", {"hidden_states", "params"}},
      {"target", "copy_kv_slots", {"kv", "src", "dst"}},
      {"target", "accept_greedy", {"logits", "tokens", "parents", "seq_indptr"}},
      {"eagle", "draft_step", {"input_ids", "hidden", "hidden_rows", "target_embed", "kv", "positions",
                               "write_slots", "page_table", "token_seq", "token_prefix", "extra_slots", "extra_len",
                               "params"}, "draft_top_k"},
      {"eagle", "draft_catch_up", {"input_ids", "hidden", "score_rows", "target_embed", "kv", "positions",
                                   "write_slots", "page_table", "token_seq", "token_prefix", "extra_slots",
                                   "extra_len", "params"}, "draft_top_k"},
      {"eagle3", "draft_step", {"input_ids", "hidden", "hidden_rows", "target_embed", "kv", "positions",
                                "write_slots", "page_table", "token_seq", "token_prefix", "extra_slots", "extra_len",
                                "params"}},
      {"eagle3", "draft_catch_up", {"input_ids", "features", "score_rows", "target_embed", "kv", "positions",
                                    "write_slots", "page_table", "token_seq", "token_prefix", "extra_slots",
                                    "extra_len", "params"}},
      {"medusa", "medusa_heads", {"hidden", "params"}},
  };
  return kEntryPoints;
}

}  // namespace contract
}  // namespace spc

#endif  // SPECCOMPILE_CAPI_CONTRACT_H_
