// runtime/drafters/eagle_heads.py in C++: a compiled EAGLE-1 or EAGLE-3 head bound to its
// target, drafting through its fused entry points (draft_catch_up, draft_step: embedding,
// layer, norm, lm_head and top-k in one call, the features staying on the device), and the
// checks load_head and the head's bind make before any drafting. The C runtime has no
// separate-calls path: a head without draft_step, wider trees than its compiled top-k, or a
// target storing its embedding otherwise are refused with the reason, as bind states it.
#ifndef SPECCOMPILE_CAPI_DRAFTERS_EAGLE_HEADS_H_
#define SPECCOMPILE_CAPI_DRAFTERS_EAGLE_HEADS_H_

#include <tvm/ffi/container/array.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../kv_cache.h"
#include "../model.h"

namespace spc {

// proposers.py load_head: a head library of a kind the mode drives (kinds: the model_types it
// takes), built for this target (hidden size, vocabulary, activation dtype). Throws
// IncompatibleError with the Python runtime's words.
void CheckHead(const Model& head, const Model& target, const std::vector<std::string>& kinds, const std::string& mode);

// eagle_heads.py draft_vocab_ids: the head's draft vocabulary as target ids (row j -> j + d2t[j]);
// empty when it drafts over the full vocabulary. check_draft_vocab's refusal included.
std::vector<int64_t> DraftVocabIds(const Model& head, int64_t target_vocab, const std::string& kind);

// One head call's result: features [rows, hidden] on the device, and the `width` best target
// token ids [rows, width] and their log-probabilities [rows, width] on the host.
struct HeadOut {
  Tensor feats;
  std::vector<int64_t> ids;
  std::vector<double> logp;
  int64_t rows = 0, width = 0;
};

// eagle_heads.py VocabCoverage, for one sequence: how often its recent tokens lay in a head's
// reduced draft vocabulary (a head can only be right on tokens its vocabulary holds); a plan's
// first-token estimate is scaled by it before a catch-up or a head call is paid for.
class VocabCoverage {
 public:
  static constexpr double kDecay = 0.9;  // COVERAGE_DECAY
  explicit VocabCoverage(const std::vector<int64_t>& vocab_ids);
  void Add(const std::vector<int32_t>& prompt) {
    rate_ = 1.0;
    seen_ = prompt.size();
  }
  // The coverage after counting the tokens committed since the last call.
  double Update(const std::vector<int32_t>& history);
  // The expansion a plan's first ShouldDraft weighs: (1, first-token estimate times coverage).
  std::pair<double, double> FirstToken(const std::vector<int32_t>& history, double first);

 private:
  std::vector<bool> mask_;  // token id -> in the draft vocabulary (empty: the full vocabulary)
  double rate_ = 1.0;
  size_t seen_ = 0;
};

class EagleHead {
 public:
  // Checks the head against the target and binds the target's embedding tensors (eagle_heads.py
  // check_target and bind); width: the tree width it will be asked for.
  EagleHead(Model* head, const Model& target, int width);
  // "hidden" (EAGLE-1: final hidden states) or "layers" (EAGLE-3: low/mid/high layer outputs).
  const std::string& features() const { return features_; }
  int64_t feature_width() const { return feature_width_; }
  Model* model() const { return head_; }
  const std::vector<int64_t>& vocab_ids() const { return vocab_ids_; }
  // Head rows built from the target's features feats [n, feature_width] (host bytes) paired with
  // tokens [n]; the top-k at rows `last` of the call.
  HeadOut CatchUp(const Tensor& kv_tensor, const ForwardBatch& fb, const std::vector<int32_t>& tokens,
                  const std::vector<char>& feats, const std::vector<int32_t>& last, int width);
  // One draft depth: rows of tokens whose parent features are hidden[rows].
  HeadOut Step(const Tensor& kv_tensor, const ForwardBatch& fb, const std::vector<int32_t>& tokens,
               const Tensor& hidden, const std::vector<int32_t>& rows, int width);

 private:
  HeadOut Result(const tvm::ffi::Any& out, int width) const;
  void CheckRows(size_t n) const;

  Model* head_;
  const Model& target_;
  std::string features_;
  int64_t feature_width_ = 0, top_k_ = 0;
  std::vector<int64_t> vocab_ids_;
  tvm::ffi::Array<Tensor> target_embed_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_EAGLE_HEADS_H_
