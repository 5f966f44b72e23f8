// See eagle_heads.h.
#include "eagle_heads.h"

#include <algorithm>
#include <set>

#include "../json_util.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

namespace {
std::string MetaText(const fj::Object& meta, const char* key) {
  if (!json::Has(meta, key)) return "None";
  Any v = json::Get(meta, key);
  if (auto s = v.try_cast<tvm::ffi::String>()) return std::string(*s);
  if (auto i = v.try_cast<int64_t>()) return std::to_string(*i);
  return "?";
}
}  // namespace

VocabCoverage::VocabCoverage(const std::vector<int64_t>& vocab_ids) {
  if (vocab_ids.empty()) return;
  mask_.assign(static_cast<size_t>(*std::max_element(vocab_ids.begin(), vocab_ids.end())) + 2, false);
  for (int64_t id : vocab_ids) mask_[id] = true;
}

double VocabCoverage::Update(const std::vector<int32_t>& history) {
  if (!mask_.empty()) {
    for (size_t i = std::min(seen_, history.size()); i < history.size(); ++i) {
      size_t t = std::min<size_t>(static_cast<size_t>(std::max(history[i], 0)), mask_.size() - 1);  // the last entry is False
      rate_ = kDecay * rate_ + (1.0 - kDecay) * (mask_[t] ? 1.0 : 0.0);
    }
  }
  seen_ = history.size();
  return rate_;
}

std::pair<double, double> VocabCoverage::FirstToken(const std::vector<int32_t>& history, double first) {
  double rate = Update(history);
  return {1.0, first * (mask_.empty() ? 1.0 : rate)};
}

void CheckHead(const Model& head, const Model& target, const std::vector<std::string>& kinds, const std::string& mode) {
  const std::string& kind = head.kind();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    throw IncompatibleError(head.lib_path() + " is a " + json::GetString(head.meta(), "model_type") +
                            " library, --speculative-mode " + mode + " needs a " + mode + " head (convert_weight "
                            "--model-type " + mode + ")");
  }
  const fj::Object& hm = head.meta();
  const fj::Object& tm = target.meta();
  for (const char* key : {"hidden_size", "vocab_size", "model_dtype"}) {
    std::string have = MetaText(hm, key), want = MetaText(tm, key);
    if (have != want) {
      throw IncompatibleError("the " + mode + " head " + head.lib_path() + " has " + key + " " + have +
                              " but the target has " + want + ": it was built for another model");
    }
  }
}

std::vector<int64_t> DraftVocabIds(const Model& head, int64_t target_vocab, const std::string& kind) {
  const fj::Object& meta = head.meta();
  if (!json::Has(meta, "draft_vocab_size") || json::Get(meta, "draft_vocab_size") == nullptr ||
      json::GetInt(meta, "draft_vocab_size") == 0) {
    return {};
  }
  std::vector<char> raw = Model::ToHost(head.Param("d2t"));
  const DLTensor* t = head.Param("d2t").GetDLTensorPtr();
  size_t n = raw.size() / DTypeBytes(t->dtype);
  std::vector<int64_t> ids(n);
  for (size_t j = 0; j < n; ++j) {
    int64_t d = t->dtype.bits == 64 ? reinterpret_cast<const int64_t*>(raw.data())[j]
                                    : reinterpret_cast<const int32_t*>(raw.data())[j];
    ids[j] = static_cast<int64_t>(j) + d;
  }
  std::set<int64_t> seen(ids.begin(), ids.end());
  if (*seen.begin() < 0 || *seen.rbegin() >= target_vocab || seen.size() != ids.size()) {
    throw IncompatibleError("the " + kind + " head's d2t maps its draft vocabulary outside the target's vocabulary "
                            "(size " + std::to_string(target_vocab) + ") or twice onto one token: it was trained for "
                            "another model");
  }
  return ids;
}

EagleHead::EagleHead(Model* head, const Model& target, int width) : head_(head), target_(target) {
  CheckHead(*head, target, {"eagle", "eagle3"}, "eagle");
  const fj::Object& hm = head->meta();
  vocab_ids_ = DraftVocabIds(*head, target.vocab_size(), "EAGLE");  // refuses a d2t that does not fit the target
  if (head->kind() == "eagle3") {  // eagle_heads.py Eagle3HeadModel.check_target
    std::vector<int64_t> want = json::GetIntList(hm, "feature_layers");
    const std::vector<int64_t>& have = target.feature_layers();
    auto list = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    if (have.empty()) {
      throw IncompatibleError("the EAGLE-3 head " + head->lib_path() + " reads the target's layer features, which " +
                              target.lib_path() + " does not export (it was built before EAGLE-3 support): rebuild it "
                              "with `speccompile compile`");
    }
    if (have != want) {
      throw IncompatibleError("the EAGLE-3 head " + head->lib_path() + " was trained on the outputs of target layers " +
                              list(want) + ", " + target.lib_path() + " exports layers " + list(have) +
                              ": it was built for another model");
    }
    features_ = "layers";
    feature_width_ = static_cast<int64_t>(have.size()) * target.hidden_size();
  } else {
    features_ = "hidden";
    feature_width_ = target.hidden_size();
  }
  // eagle_heads.py bind: the fused entry points, with the target's own embedding tensors
  top_k_ = json::Has(hm, "draft_top_k") && json::Get(hm, "draft_top_k") != nullptr ? json::GetInt(hm, "draft_top_k") : 0;
  std::string why;
  if (!top_k_ || !head->Has("draft_step") || !json::Has(hm, "target_embed")) {
    why = "the head has no draft_step (a full-vocabulary head, or built before draft steps on device)";
  } else if (width > top_k_) {
    why = "--spec-tree-width " + std::to_string(width) + " is wider than the head's compiled top-" +
          std::to_string(top_k_);
  } else if (MetaText(target.meta(), "target") != MetaText(hm, "target")) {
    why = "the head was compiled for " + MetaText(hm, "target") + ", the target for " + MetaText(target.meta(), "target");
  } else {
    std::vector<Tensor> tensors;
    for (const Any& w : json::GetArray(hm, "target_embed")) {
      fj::Object want = json::AsObject(w, "target_embed");
      std::string name = json::GetString(want, "name");
      bool found = false;
      for (const Any& p : json::GetArray(target.meta(), "params")) {
        fj::Object have = json::AsObject(p, "param");
        if (json::GetString(have, "name") != name) continue;
        if (json::GetIntList(have, "shape") == json::GetIntList(want, "shape") &&
            json::GetString(have, "dtype") == json::GetString(want, "dtype")) {
          tensors.push_back(target.Param(name));
          found = true;
        }
        break;
      }
      if (!found) {
        why = "the head reads the target's " + name + ", which this target (" + MetaText(target.meta(), "quantization") +
              ") does not store: compile the head with the target's quantization";
        break;
      }
    }
    target_embed_ = tvm::ffi::Array<Tensor>(tensors.begin(), tensors.end());
  }
  if (!why.empty()) {
    throw IncompatibleError("the C runtime drafts with an EAGLE head through its fused draft_step, and " + why +
                            " (" + head->lib_path() + "); the Python runtime drafts with it through separate calls");
  }
}

void EagleHead::CheckRows(size_t n) const {
  if (static_cast<int64_t>(n) > head_->config().prefill_chunk_size) {
    throw std::invalid_argument("one call of " + head_->lib_path() + " takes at most " +
                                std::to_string(head_->config().prefill_chunk_size) + " tokens, got " + std::to_string(n));
  }
}

HeadOut EagleHead::Result(const Any& out, int width) const {
  auto tuple = out.cast<tvm::ffi::Array<Any>>();
  HeadOut r;
  r.feats = tuple[0].cast<Tensor>();
  Tensor ids = tuple[1].cast<Tensor>(), logp = tuple[2].cast<Tensor>();
  const DLTensor* it = ids.GetDLTensorPtr();
  const DLTensor* lt = logp.GetDLTensorPtr();
  r.rows = it->shape[0];
  int64_t k = it->shape[1];
  r.width = std::min<int64_t>(width, k);
  std::vector<char> ih = Model::ToHost(ids), lh = Model::ToHost(logp);
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t j = 0; j < r.width; ++j) {
      int64_t at = i * k + j;
      r.ids.push_back(it->dtype.bits == 64 ? reinterpret_cast<const int64_t*>(ih.data())[at]
                                           : reinterpret_cast<const int32_t*>(ih.data())[at]);
      r.logp.push_back(lt->dtype.bits == 64 ? reinterpret_cast<const double*>(lh.data())[at]
                                            : static_cast<double>(reinterpret_cast<const float*>(lh.data())[at]));
    }
  return r;
}

HeadOut EagleHead::CatchUp(const Tensor& kv_tensor, const ForwardBatch& fb, const std::vector<int32_t>& tokens,
                           const std::vector<char>& feats, const std::vector<int32_t>& last, int width) {
  CheckRows(tokens.size());
  target_.CheckTokenIds(tokens.data(), tokens.size());  // committed tokens; the embedding gather does not bounds-check
  int64_t n = static_cast<int64_t>(tokens.size());
  Tensor ids = head_->Upload(tokens, {n});
  Tensor f = head_->Upload(feats.data(), {n, feature_width_}, head_->dtype());
  Tensor rows = head_->Upload(last, {static_cast<int64_t>(last.size())});
  std::vector<Tensor> m = MetaTensors(*head_, fb);
  Any out = head_->Fn("draft_catch_up")(ids, f, rows, target_embed_, kv_tensor, m[0], m[1], m[2], m[3], m[4], m[5],
                                        m[6], head_->params());
  return Result(out, width);
}

HeadOut EagleHead::Step(const Tensor& kv_tensor, const ForwardBatch& fb, const std::vector<int32_t>& tokens,
                        const Tensor& hidden, const std::vector<int32_t>& rows, int width) {
  CheckRows(tokens.size());
  int64_t n = static_cast<int64_t>(tokens.size());
  Tensor ids = head_->Upload(tokens, {n});
  Tensor r = head_->Upload(rows, {n});
  std::vector<Tensor> m = MetaTensors(*head_, fb);
  Any out = head_->Fn("draft_step")(ids, hidden, r, target_embed_, kv_tensor, m[0], m[1], m[2], m[3], m[4], m[5], m[6],
                                    head_->params());
  return Result(out, width);
}

}  // namespace spc
