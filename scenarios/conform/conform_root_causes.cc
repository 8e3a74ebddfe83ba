// scenarios/conform/conform_root_causes.cc
//
// Independent root causes of a teacher-forced comparison (conform_internal.h group_root_causes,
// docs/conform.md "Root causes").
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "scenarios/conform/conform_internal.h"

namespace dsv41::scenarios::conform::conform_detail {
namespace {

bool is_reader(const std::string& c) {
  return c == "attn_out" || c == "index_scores" || c == "topk" || c == "candidates" || c == "dspark_attn_out";
}

// Whether the port's `f` may be wrong because it read the port's state that `by` shows wrong.
bool reads_state_of(const Failure& f, const Failure& by, const std::vector<reference::LayerInfo>& schedule) {
  if (by.step > f.step || !is_cache(by.component)) return false;
  if (f.component == by.component && f.layer == by.layer) return false;  // the same group
  const auto owner = [&](int l) {
    return l >= 0 && l < static_cast<int>(schedule.size()) ? schedule[static_cast<size_t>(l)].kv_owner : -1;
  };
  if (is_reader(f.component)) return by.layer == f.layer || (owner(f.layer) >= 0 && by.layer == owner(f.layer));
  // A compressed cache's entries come from the compressor's pending rows (the same layer).
  if (is_cache(f.component)) return by.component == "cache.compressor" && by.layer == f.layer;
  return false;
}

}  // namespace

void group_root_causes(const std::vector<Failure>& failures, const reference::ModelConfig& c,
                       std::vector<RootCauseGroup>& roots, std::vector<ExplainedFailure>& explained) {
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  std::map<std::pair<int, std::string>, size_t> group_of;  // (layer, component) -> its root
  std::vector<const Failure*> seen;
  for (const Failure& f : failures) {
    const auto by = std::find_if(seen.begin(), seen.end(), [&](const Failure* g) { return reads_state_of(f, *g, schedule); });
    const Failure* cause = by == seen.end() ? nullptr : *by;
    seen.push_back(&f);
    if (cause != nullptr) {
      explained.push_back({f, *cause});
      continue;
    }
    const auto it = group_of.find({f.layer, f.component});
    if (it != group_of.end()) {
      std::vector<int64_t>& also = roots[it->second].also_steps;
      if (also.empty() || also.back() != f.step) also.push_back(f.step);
      continue;
    }
    group_of[{f.layer, f.component}] = roots.size();
    roots.push_back({f, {}});
  }
}

}  // namespace dsv41::scenarios::conform::conform_detail

namespace dsv41::scenarios::conform {

std::vector<IndependentRootCause> root_causes(const reports::RunReport& report) {
  std::vector<IndependentRootCause> out;
  for (const reports::ScenarioResult& s : report.scenarios) {
    if (s.scenario_json.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(s.scenario_json, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("root_causes") || !j["root_causes"].is_array()) continue;
    for (const nlohmann::json& r : j["root_causes"]) {
      IndependentRootCause c;
      c.cause.mode = kConformTeacherForced;
      c.cause.step = r.value("step", int64_t{0});
      c.cause.layer = r.value("layer", -1);
      c.cause.component = r.value("component", "");
      c.cause.metric = r.value("metric", "");
      c.cause.value = r["value"].is_number() ? r["value"].get<double>() : std::nan("");
      c.cause.detail = r.value("detail", "");
      c.cause.repro = r.value("repro", "");
      c.also_steps = r.value("also_steps", std::vector<int64_t>{});
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace dsv41::scenarios::conform
