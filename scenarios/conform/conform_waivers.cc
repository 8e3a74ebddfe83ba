// scenarios/conform/conform_waivers.cc
//
// Waivers of a tolerance file (scenarios/conform/conform.h ConformWaiver, docs/conform.md
// "Waivers"): a known, explained failure of one (component, layer range, step range) is recorded
// as waived with its reason instead of failing, so that it neither fails the run nor hides a
// second, independent failure behind it.
#include <climits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>

#include "base/json_context.h"
#include "base/error.h"
#include "reference/model/hooks.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_internal.h"

namespace dsv41::scenarios::conform {

using json = nlohmann::json;

bool ConformWaiver::covers(const reports::MetricRow& r) const {
  return (component == "*" || component == r.component) && (metric.empty() || metric == r.metric) &&
         r.layer >= layer_lo && r.layer <= layer_hi && r.step >= step_lo && r.step <= step_hi;
}

std::string ConformWaiver::describe() const {
  std::string s = component;
  if (layer_lo != -1 || layer_hi != (1 << 30)) s += ", layers " + std::to_string(layer_lo) + "-" + std::to_string(layer_hi);
  if (step_lo != 0 || step_hi != (int64_t{1} << 62)) s += ", steps " + std::to_string(step_lo) + "-" + std::to_string(step_hi);
  if (!metric.empty()) s += ", metric " + metric;
  return s;
}

namespace {

// [lo, hi] of two integers >= min_value with lo <= hi.
std::pair<int64_t, int64_t> range_of(const json& v, const std::string& where, int64_t min_value) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer()) {
    DSV41_FAIL(where, ": expected [lo, hi] (two integers), got ", v.dump());
  }
  const int64_t lo = v[0].get<int64_t>(), hi = v[1].get<int64_t>();
  if (lo < min_value || hi < lo) DSV41_FAIL(where, ": range [", lo, ", ", hi, "] must have ", min_value, " <= lo <= hi");
  return {lo, hi};
}

bool known_component(const std::string& c) {
  return c == "*" || c == "logits" || c == "engram_ids" || c.rfind("cache.", 0) == 0 ||
         reference::model::component_from_name(c).has_value();
}

}  // namespace

std::vector<ConformWaiver> parse_conform_waivers(const std::string& text, const std::string& where_file) {
  const json j = conform_detail::parse_tolerance_json(text, where_file);
  std::vector<ConformWaiver> out;
  if (!j.is_object() || !j.contains("waivers")) return out;
  const json& list = j["waivers"];
  if (!list.is_array()) DSV41_FAIL(where_file, ", key 'waivers': expected a list of waivers");
  static const std::set<std::string> keys = {"component", "layers", "steps", "metric", "reason"};
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = where_file + ", waivers[" + std::to_string(i) + "]";
    const json& w = list[i];
    if (!w.is_object()) DSV41_FAIL(where, ": expected an object");
    for (const auto& [k, v] : w.items()) {
      if (!keys.count(k)) DSV41_FAIL(where, ": unknown key '", k, "' (known: component, layers, steps, metric, reason)");
    }
    ConformWaiver c;
    if (!w.contains("component") || !w["component"].is_string()) DSV41_FAIL(where, ": no \"component\"");
    c.component = w["component"].get<std::string>();
    if (!known_component(c.component)) {
      DSV41_FAIL(where, ": component '", c.component, "' is not one of reference/model/hooks.h, logits, engram_ids, "
                 "cache.<kind> or \"*\"");
    }
    if (!w.contains("reason") || !w["reason"].is_string() || w["reason"].get<std::string>().empty()) {
      DSV41_FAIL(where, ": no \"reason\": every waiver says why the failure is known and accepted");
    }
    c.reason = w["reason"].get<std::string>();
    if (w.contains("metric")) {
      if (!w["metric"].is_string() || w["metric"].get<std::string>().empty()) DSV41_FAIL(where, ": \"metric\" must be a name");
      c.metric = w["metric"].get<std::string>();
    }
    if (w.contains("layers")) {
      const auto [lo, hi] = range_of(w["layers"], where + ", layers", -1);
      if (hi > (1 << 30)) DSV41_FAIL(where, ", layers: ", hi, " is not a layer");
      c.layer_lo = static_cast<int>(lo);
      c.layer_hi = static_cast<int>(hi);
    }
    if (w.contains("steps")) std::tie(c.step_lo, c.step_hi) = range_of(w["steps"], where + ", steps", 0);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<ConformWaiver> load_conform_waivers(const std::string& path) {
  const std::string text = conform_detail::read_tolerance_file(path);
  const std::string where = "--tolerances '" + path + "'";
  return json_context(where, [&] { return parse_conform_waivers(text, where); });
}

}  // namespace dsv41::scenarios::conform
