// scenarios/sweep/sweep_plan.cc: a sweep plan parsed, expanded into work items and checked
// (scenarios/sweep/sweep_plan.h, docs/sweep.md).
#include "scenarios/sweep/sweep_plan.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/data_dir.h"
#include "base/error.h"
#include "base/input_file.h"
#include "base/json_context.h"
#include "base/json_keys.h"
#include "base/json_limits.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/runner.h"

namespace dsv41::scenarios::sweep {
namespace {

using nlohmann::json;

// The most items one plan may expand to (a typo such as 10^6 seeds is refused, not run).
constexpr size_t kMaxItems = 100000;

std::string excerpt(const json& j) {
  if (j.is_array()) return "an array of " + std::to_string(j.size()) + " elements";
  if (j.is_object()) return "an object of " + std::to_string(j.size()) + " keys";
  std::string s = j.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

void only_keys(const json& j, const std::string& where, const std::set<std::string>& keys) {
  DSV41_CHECK(j.is_object(), where, ": must be a JSON object, got ", excerpt(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (keys.count(it.key())) continue;
    std::string known;
    for (const std::string& k : keys) known += (known.empty() ? "" : ", ") + k;
    DSV41_FAIL(where, ": unknown key '", it.key(), "' (known: ", known, ")");
  }
}

std::string text(const json& j, const std::string& where) {
  DSV41_CHECK(j.is_string() && !j.get<std::string>().empty(), where, ": must be a non-empty string, got ", excerpt(j));
  return j.get<std::string>();
}

uint64_t seed_value(const json& j, const std::string& where) {
  DSV41_CHECK(j.is_number_unsigned(), where, ": must be a non-negative integer, got ", excerpt(j));
  return j.get<uint64_t>();
}

const json& non_empty_array(const json& j, const std::string& where) {
  DSV41_CHECK(j.is_array() && !j.empty(), where, ": must be a non-empty array, got ", excerpt(j));
  return j;
}

// A name that can be part of a report group name and a shell word.
void check_model_name(const std::string& name, const std::string& where) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '+' || c == '-';
    DSV41_CHECK(ok, where, ": '", name, "' may hold only letters, digits and _ . + -");
  }
  DSV41_CHECK(name != "." && name != "..", where, ": '", name, "' is not a name");
}

// A path of the plan, relative to its folder; preset and built-in names stay as they are.
std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute() || base_dir.empty()) return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}
bool is_path(const std::string& s) { return s.find('/') != std::string::npos || s.find(".json") != std::string::npos; }

std::string default_oracle_weights() {
  return dsv41::data::file("golden/oracle/weights.safetensors");
}

SweepModel parse_model(const json& j, const std::string& where, const std::string& base_dir) {
  only_keys(j, where, {"name", "config", "weights", "weight_seed", "token_map"});
  DSV41_CHECK(j.contains("config"), where, ": missing key 'config' (a preset name or a config .json)");
  SweepModel m;
  const std::string config = text(j["config"], where + ".config");
  m.config = is_path(config) ? resolve(base_dir, config) : config;
  m.name = j.contains("name") ? text(j["name"], where + ".name")
                              : (is_path(config) ? std::filesystem::path(config).stem().string() : config);
  check_model_name(m.name, where + (j.contains("name") ? ".name" : ".config (the default name)"));
  DSV41_CHECK(!(j.contains("weights") && j.contains("weight_seed")), where,
              ": give 'weights' (a file) or 'weight_seed' (generated weights), not both");
  if (j.contains("weights")) {
    m.weights = resolve(base_dir, text(j["weights"], where + ".weights"));
    DSV41_CHECK(std::filesystem::is_regular_file(m.weights), where, ".weights: '", m.weights,
                "' is not a readable file");
  } else if (j.contains("weight_seed")) {
    m.weight_seed = seed_value(j["weight_seed"], where + ".weight_seed");
  } else if (config == "tiny" && std::filesystem::exists(default_oracle_weights())) {
    m.weights = default_oracle_weights();  // as `dsv41 run`: the official oracle weights
  }
  if (j.contains("token_map")) {
    m.token_map = resolve(base_dir, text(j["token_map"], where + ".token_map"));
    DSV41_CHECK(std::filesystem::is_regular_file(m.token_map), where, ".token_map: '", m.token_map,
                "' is not a readable file");
  }
  try {
    m.loaded = reference::load_config(m.config);
  } catch (const Error& e) {
    DSV41_FAIL(where, ".config: ", e.what());
  }
  m.config_hash = reference::config_hash(m.loaded);
  return m;
}

std::vector<std::string> parse_pair(const json& j, const std::string& where) {
  const std::string s = text(j, where);
  const size_t comma = s.find(',');
  DSV41_CHECK(comma != std::string::npos && s.find(',', comma + 1) == std::string::npos, where, ": '", s,
              "' is not one pair of sides A,B");
  std::vector<std::string> pair = {s.substr(0, comma), s.substr(comma + 1)};
  for (const std::string& side : pair) {
    try {
      runner::parse_side(side);
      runner::validate_backend_name(runner::parse_side(side).backend);
    } catch (const Error& e) {
      DSV41_FAIL(where, ": ", e.what());
    }
  }
  return pair;
}

std::string item_name(const SweepItem& it, const SweepPlan& plan) {
  std::string n = it.scenario.name + "~" + plan.models[it.model].name;
  if (!it.sides.empty()) {
    std::string pair = it.sides[0] + "," + it.sides[1];
    for (char& c : pair) c = c == '/' ? '+' : c;
    n += "~" + pair;
  }
  if (!it.modes.empty()) n += "~" + it.modes[0];
  if (it.seed) n += "~seed=" + std::to_string(*it.seed);
  return n;
}

}  // namespace

std::string SweepModel::rerun_prefix() const {
  std::string p = "dsv41 run --config " + reports::shell_quote(config);
  if (!weights.empty() && weights != default_oracle_weights()) p += " --weights " + reports::shell_quote(weights);
  if (weights.empty()) p += " --weight-seed " + std::to_string(weight_seed);
  if (!token_map.empty()) p += " --token-map " + reports::shell_quote(token_map);
  return p;
}

std::string SweepModel::weights_label() const {
  return weights.empty() ? "generated:seed=" + std::to_string(weight_seed)
                         : "file:" + std::filesystem::path(weights).filename().string();
}

bool SweepPlan::uses_gpu() const {
  for (const SweepItem& it : items) {
    if (it.uses_gpu) return true;
  }
  return false;
}

double estimate_cost(const runner::Scenario& s, size_t comparisons, const reference::ModelConfig& c) {
  const runner::TokenPlan tokens = plan_tokens(s, c.vocab_size);
  double n = 0;
  for (size_t e = 0; e < s.events.size(); ++e) {
    const runner::Event& ev = s.events[e];
    if (ev.kind == runner::Event::kPrompt) n += static_cast<double>(tokens.prompts[e].size());
    if (ev.kind == runner::Event::kDecode) n += static_cast<double>(ev.decode);
    // A round drafts, verifies k + 1 rows and may replay: about 2 (k + 1) token rows; k <= 8 here.
    if (ev.kind == runner::Event::kSpeculate) n += static_cast<double>(ev.speculate.rounds) * 2 * 9;
  }
  double values = 0;
  for (const reference::checkpoint::TensorSpec& t : reference::checkpoint::expected_tensors(c)) {
    values += static_cast<double>(reference::Tensor<float>::count(t.shape));
  }
  return 2.0 * static_cast<double>(comparisons) * n * values;
}

SweepPlan parse_sweep_plan(const std::string& json_text, const std::string& source, const std::string& base_dir) {
  const std::string where = "sweep plan '" + source + "'";
  dsv41::check_json_nesting(json_text, where);
  json j;
  try {
    j = dsv41::parse_json_without_duplicates(json_text, where);
  } catch (const json::exception& e) {
    DSV41_FAIL(where, ": not valid JSON: ", e.what());
  }
  only_keys(j, where, {"name", "scenarios", "models", "sides", "modes", "seeds", "stop_after_step"});
  SweepPlan plan;
  plan.source = source;
  plan.name = j.contains("name") ? text(j["name"], where + ": name") : std::filesystem::path(source).stem().string();
  DSV41_CHECK(j.contains("scenarios"), where, ": missing key 'scenarios' (built-in names, \"suite\" or .json files)");
  DSV41_CHECK(j.contains("models"), where, ": missing key 'models' (objects with a \"config\")");

  const json& scen = non_empty_array(j["scenarios"], where + ": scenarios");
  for (size_t i = 0; i < scen.size(); ++i) {
    const std::string s = text(scen[i], where + ": scenarios[" + std::to_string(i) + "]");
    if (s == "suite") {
      for (const std::string& n : runner::builtin_scenario_names()) plan.scenarios.push_back(n);
    } else {
      plan.scenarios.push_back(is_path(s) ? resolve(base_dir, s) : s);
    }
  }
  const json& models = non_empty_array(j["models"], where + ": models");
  std::set<std::string> model_names;
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string w = where + ": models[" + std::to_string(i) + "]";
    plan.models.push_back(parse_model(models[i], w, base_dir));
    DSV41_CHECK(model_names.insert(plan.models.back().name).second, w, ": a second model named '",
                plan.models.back().name, "' (give each a distinct \"name\")");
  }
  if (j.contains("sides")) {
    const json& sides = non_empty_array(j["sides"], where + ": sides");
    for (size_t i = 0; i < sides.size(); ++i) plan.sides.push_back(parse_pair(sides[i], where + ": sides[" + std::to_string(i) + "]"));
  }
  if (j.contains("modes")) {
    const json& modes = non_empty_array(j["modes"], where + ": modes");
    for (size_t i = 0; i < modes.size(); ++i) {
      const std::string m = text(modes[i], where + ": modes[" + std::to_string(i) + "]");
      DSV41_CHECK(m == "free-running" || m == "teacher-forced", where, ": modes[", i, "]: '", m,
                  "' is not free-running or teacher-forced");
      plan.modes.push_back(m);
    }
  }
  if (j.contains("seeds")) {
    const json& seeds = non_empty_array(j["seeds"], where + ": seeds");
    for (size_t i = 0; i < seeds.size(); ++i) plan.seeds.push_back(seed_value(seeds[i], where + ": seeds[" + std::to_string(i) + "]"));
  }
  if (j.contains("stop_after_step")) {
    DSV41_CHECK(j["stop_after_step"].is_number_unsigned(), where, ": stop_after_step: must be a non-negative integer, got ",
                excerpt(j["stop_after_step"]));
    plan.stop_after_step = static_cast<int64_t>(std::min<uint64_t>(j["stop_after_step"].get<uint64_t>(), INT64_MAX));
  }

  // Expand: models x scenarios x sides x modes x seeds.
  const size_t n_items = plan.models.size() * plan.scenarios.size() * std::max<size_t>(1, plan.sides.size()) *
                         std::max<size_t>(1, plan.modes.size()) * std::max<size_t>(1, plan.seeds.size());
  DSV41_CHECK(n_items <= kMaxItems, where, ": expands to ", n_items, " items, more than ", kMaxItems);
  std::map<std::string, runner::Scenario> loaded;
  for (size_t si = 0; si < plan.scenarios.size(); ++si) {
    const std::string& ref = plan.scenarios[si];
    if (loaded.count(ref)) continue;
    try {
      loaded.emplace(ref, runner::load_scenario(ref));
    } catch (const Error& e) {
      DSV41_FAIL(where, ": scenarios: ", e.what());
    }
  }
  std::set<std::string> names;
  for (size_t m = 0; m < plan.models.size(); ++m) {
    for (const std::string& ref : plan.scenarios) {
      for (size_t p = 0; p < std::max<size_t>(1, plan.sides.size()); ++p) {
        for (size_t k = 0; k < std::max<size_t>(1, plan.modes.size()); ++k) {
          for (size_t s = 0; s < std::max<size_t>(1, plan.seeds.size()); ++s) {
            SweepItem it;
            it.index = plan.items.size();
            it.scenario_ref = ref;
            it.model = m;
            if (!plan.sides.empty()) it.sides = plan.sides[p];
            if (!plan.modes.empty()) it.modes = {plan.modes[k]};
            if (!plan.seeds.empty()) it.seed = plan.seeds[s];
            it.scenario = loaded.at(ref);
            if (it.seed) it.scenario.seed = *it.seed;
            it.name = item_name(it, plan);
            const std::string w = where + ": item " + std::to_string(it.index) + " (" + it.name + ")";
            try {
              reports::check_scenario_name(it.name);
            } catch (const Error& e) {
              DSV41_FAIL(w, ": ", e.what());
            }
            DSV41_CHECK(names.insert(it.name).second, w, ": a second item of this name (the plan lists scenario '",
                        ref, "' twice, or two scenarios share a name)");
            runner::RunOptions o;
            o.sides = it.sides;
            o.modes = it.modes;
            runner::ScenarioPlan sp;
            try {
              sp = runner::plan_scenario(it.scenario, plan.models[m].loaded, o);
            } catch (const Error& e) {
              DSV41_FAIL(w, ": ", e.what());
            }
            for (const runner::Pair& pair : sp.pairs) {
              it.uses_gpu = it.uses_gpu || pair.a.backend.rfind("cuda", 0) == 0 || pair.b.backend.rfind("cuda", 0) == 0;
              const int per_a = pair.a.path == runner::CachePath::kAlone ? sp.sessions : 1;
              const int per_b = pair.b.path == runner::CachePath::kAlone ? sp.sessions : 1;
              it.weight_copies = std::max(it.weight_copies, 1 + per_a + per_b);
            }
            it.estimated_cost = estimate_cost(it.scenario, sp.pairs.size() * sp.modes.size(), plan.models[m].loaded);
            plan.items.push_back(std::move(it));
          }
        }
      }
    }
  }
  return plan;
}

SweepPlan load_sweep_plan(const std::string& path) {
  const std::string text = input::read_text_file(path, "sweep plan", input::kMaxSweepPlanBytes);
  // A field of the wrong type names the file (base/json_context.h), not "[json.exception...]".
  return json_context("sweep plan '" + path + "'",
                      [&] { return parse_sweep_plan(text, path, std::filesystem::path(path).parent_path().string()); });
}

}  // namespace dsv41::scenarios::sweep
