// spc_policy_replay: the draft-length policy's decisions (src/adaptive.cc) on a recorded trace.
//
// A trace (JSON on stdin) is what the Python runtime's policy (runtime/adaptive.py) was asked
// during real generations, and what it answered: the cost profile it started from, then every
// top-level call in order -- a step's plan, each should_draft with its expansions, the nodes a
// proposer drafted and the seconds it spent, select over the drafts, hopeless, each step's
// record, and the acceptance model's per-sequence events. This tool replays those calls on the
// C++ Policy and prints its own answers, one per call that had one, as a JSON list of
// {"i": event index, "out": answer}; tests/runtime/test_capi_policy.py holds them equal to Python's.
#include <tvm/ffi/extra/json.h>

#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../src/adaptive.h"
#include "../src/costs.h"
#include "../src/json_util.h"

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;
using tvm::ffi::String;

namespace {

std::vector<double> Doubles(const Any& v) {
  std::vector<double> out;
  for (const Any& x : v.cast<fj::Array>()) out.push_back(x.cast<double>());
  return out;
}

std::vector<int32_t> Ints(const Any& v) {
  std::vector<int32_t> out;
  for (const Any& x : v.cast<fj::Array>()) out.push_back(static_cast<int32_t>(x.cast<int64_t>()));
  return out;
}

std::vector<int64_t> Seqs(const Any& v) {
  std::vector<int64_t> out;
  for (const Any& x : v.cast<fj::Array>()) out.push_back(x == nullptr ? -1 : x.cast<int64_t>());
  return out;
}

int64_t Seq(const Any& v) { return v == nullptr ? -1 : v.cast<int64_t>(); }

spc::Draft DraftOf(const fj::Object& d) {
  spc::Draft out;
  out.tokens = Ints(spc::json::Get(d, "tokens"));
  for (const char* key : {"parents", "conf", "source"}) {
    Any v = spc::json::Get(d, key);
    if (v == nullptr) continue;
    if (std::string(key) == "parents") out.parents = Ints(v);
    if (std::string(key) == "conf") out.conf = Doubles(v);
    if (std::string(key) == "source") out.source = Ints(v);
  }
  return out;
}

fj::Object DraftJson(const spc::Draft& d) {
  fj::Array tokens, parents;
  for (int32_t t : d.tokens) tokens.push_back(static_cast<int64_t>(t));
  for (int32_t p : d.ParentList()) parents.push_back(static_cast<int64_t>(p));
  fj::Object o;
  o.Set("tokens", tokens);
  o.Set("parents", parents);
  return o;
}

}  // namespace

int main() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  fj::Object trace = spc::json::AsObject(spc::json::Parse(text, "trace"), "trace");
  fj::Object profile = spc::json::GetObject(trace, "cost");
  std::map<int64_t, double> target, draft;
  for (const auto& kv : spc::json::GetObject(profile, "target"))
    target[std::stoll(std::string(kv.first.cast<String>()))] = kv.second.cast<double>();
  for (const auto& kv : spc::json::GetObject(profile, "draft"))
    draft[std::stoll(std::string(kv.first.cast<String>()))] = kv.second.cast<double>();
  spc::CostModel cost(spc::CostTable(target), spc::CostTable(draft),
                      spc::json::Get(profile, "catch_up_per_token").cast<double>(), "");
  if (auto a = spc::json::Get(profile, "acceptance").try_cast<fj::Object>()) cost.acceptance = *a;
  int64_t fixed_k = spc::json::GetInt(trace, "fixed_k");
  spc::AcceptanceModel acceptance;
  if (!fixed_k) acceptance.Restore(cost.acceptance);
  spc::Policy policy(&cost, std::move(acceptance), fixed_k);

  std::optional<spc::StepPlan> plan;
  fj::Array answers;
  int64_t i = 0;
  for (const Any& e : spc::json::GetArray(trace, "events")) {
    fj::Object ev = spc::json::AsObject(e, "event");
    std::string kind = spc::json::GetString(ev, "ev");
    Any out = nullptr;
    bool answered = true;
    if (kind == "plan") {
      plan.emplace(policy.NewPlan(spc::json::GetInt(ev, "batch"), Seqs(spc::json::Get(ev, "seqs"))));
      answered = false;
    } else if (kind == "should_draft") {
      std::vector<std::pair<double, double>> expansions;
      for (const Any& x : spc::json::GetArray(ev, "expansions")) {
        std::vector<double> pair = Doubles(x);
        expansions.emplace_back(pair[0], pair[1]);
      }
      out = plan->ShouldDraft(spc::json::GetInt(ev, "rows"), expansions, spc::json::GetInt(ev, "catch_up"),
                              spc::json::Get(ev, "free").cast<bool>());
    } else if (kind == "drafted") {
      plan->Drafted(Doubles(spc::json::Get(ev, "probs")));
      answered = false;
    } else if (kind == "spent") {
      plan->Spent(spc::json::Get(ev, "seconds").cast<double>());
      answered = false;
    } else if (kind == "select") {
      std::vector<spc::Draft> drafts;
      for (const Any& d : spc::json::GetArray(ev, "drafts")) drafts.push_back(DraftOf(spc::json::AsObject(d, "draft")));
      fj::Array kept;
      for (const spc::Draft& d : plan->Select(drafts)) kept.push_back(DraftJson(d));
      out = kept;
    } else if (kind == "p") {
      out = plan->p(spc::json::Get(ev, "conf").cast<double>(), Seq(spc::json::Get(ev, "seq")),
                    static_cast<int>(spc::json::GetInt(ev, "source")));
    } else if (kind == "first") {
      out = plan->first(Seq(spc::json::Get(ev, "seq")));
    } else if (kind == "hopeless") {
      out = policy.Hopeless(spc::json::GetInt(ev, "batch"), spc::json::Get(ev, "free").cast<bool>());
    } else if (kind == "expects_drafting") {
      out = policy.ExpectsDrafting(Seqs(spc::json::Get(ev, "seqs")));
    } else if (kind == "expected_output") {
      out = policy.ExpectedOutput(spc::json::GetInt(ev, "budget"), spc::json::GetInt(ev, "emitted"));
    } else if (kind == "draft_prefill_pays") {
      out = policy.DraftPrefillPays(spc::json::GetInt(ev, "prompt_tokens"),
                                    spc::json::Get(ev, "output_tokens").cast<double>(), spc::json::GetInt(ev, "batch"),
                                    Seq(spc::json::Get(ev, "seq")));
    } else if (kind == "observe") {
      std::vector<spc::Draft> drafts;
      for (const Any& d : spc::json::GetArray(ev, "drafts")) drafts.push_back(DraftOf(spc::json::AsObject(d, "draft")));
      spc::StepRecord step;
      for (const spc::Draft& d : drafts) step.drafts.push_back(&d);
      for (const Any& p : spc::json::GetArray(ev, "paths")) step.paths.push_back(Ints(p));
      for (const Any& n : spc::json::GetArray(ev, "emitted")) step.emitted.push_back(n.cast<int64_t>());
      for (const Any& s : spc::json::GetArray(ev, "speculative")) step.speculative.push_back(s.cast<bool>());
      step.draft_forwards = spc::json::GetInt(ev, "draft_forwards");
      step.draft_seconds = spc::json::Get(ev, "draft_seconds").cast<double>();
      step.target_seconds = spc::json::Get(ev, "target_seconds").cast<double>();
      step.other_seconds = spc::json::Get(ev, "other_seconds").cast<double>();
      step.seq_ids = Seqs(spc::json::Get(ev, "seqs"));
      policy.Observe(step, spc::json::Get(ev, "plan").cast<bool>() ? &*plan : nullptr);
      // what the step taught, compared after it: the pace, the host time, the guard
      fj::Object state;
      state.Set("pace", cost.pace);
      state.Set("host", policy.host);
      state.Set("draft_overhead", cost.draft_overhead);
      out = state;
    } else if (kind == "observe_output") {
      policy.ObserveOutput(spc::json::GetInt(ev, "emitted"));
      answered = false;
    } else if (kind == "new_prompt") {
      policy.acceptance.NewPrompt(Seq(spc::json::Get(ev, "seq")));
      answered = false;
    } else if (kind == "forget") {
      policy.acceptance.Forget(Seq(spc::json::Get(ev, "seq")));
      answered = false;
    } else {
      std::cerr << "spc_policy_replay: unknown event " << kind << "\n";
      return 2;
    }
    if (answered) {
      fj::Object a;
      a.Set("i", i);
      a.Set("out", out);
      answers.push_back(a);
    }
    ++i;
  }
  std::cout << std::string(fj::Stringify(answers)) << "\n";
  return 0;
}
