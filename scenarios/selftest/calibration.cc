// scenarios/selftest/calibration.cc: the calibration runs and the sensitivity sweep (calibration.h).
#include "scenarios/selftest/calibration.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <unistd.h>

#include "base/error.h"
#include "reference/checkpoint/weights.h"
#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/defects/reordered_ops.h"
#include "scenarios/runner/backend.h"

namespace dsv41::scenarios::selftest {
namespace {

namespace fs = std::filesystem;
using defects::SumOrder;
using defects::all_sum_orders;
using defects::make_reordered_ops;
using defects::sum_order_from_name;

std::vector<int64_t> tokens(int64_t n, int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((i * a + b) % 1024);
  return v;
}

std::string temp_root(const std::string& dir, const char* what) {
  return dir.empty() ? (fs::temp_directory_path() / (std::string("dsv41_") + what + "_" + std::to_string(::getpid()))).string()
                     : dir;
}

// The claim a member's dump is judged under: order-variant, with the accumulation its backend
// declares (fp8-tensor-core for trunc13, the emulation of that block dot, and for `cuda`, whose F8
// linears run on those tensor cores), as a port built on such kernels declares it.
conform::ConformOptions order_variant_options(const std::string& name, const std::string& backend) {
  conform::ConformOptions co;
  co.name = name;
  co.order_variant = true;
  const judge::Accumulation acc = runner::backend_accumulation(backend);
  if (acc != judge::Accumulation::kFp32) co.accumulation = judge::name(acc);
  return co;
}

}  // namespace

std::vector<SumOrder> calibration_orders() {
  std::vector<SumOrder> v = all_sum_orders();
  v.push_back(SumOrder::kTrunc13);
  return v;
}

CalibrationMember calibration_member(const std::string& name) {
  for (SumOrder v : all_sum_orders()) {
    if (defects::name(v) == name) return {name, "ref-order:" + name, true};
  }
  if (name == defects::name(SumOrder::kTrunc13)) return {name, "ref-order:" + name, true};
  std::string orders;
  for (SumOrder v : calibration_orders()) orders += std::string(orders.empty() ? "" : ", ") + defects::name(v);
  const std::string known = "the reordered variants " + orders +
                            ", or an order-variant backend such as cuda (dsv41 run --list)";
  if (name.rfind("ref-order:", 0) == 0 || name.rfind("mutant", 0) == 0) {
    DSV41_FAIL("calibration member '", name, "': name a reordered variant without its ref-order: prefix, or a backend "
               "without a planted defect (", known, ")");
  }
  try {
    runner::validate_backend_name(name);
  } catch (const Error&) {
    DSV41_FAIL("unknown calibration member '", name, "' (", known, ")");
  }
  DSV41_CHECK(runner::backend_claim(name) == runner::Claim::kOrderVariant && !runner::backend_mutation(name),
              "calibration member '", name, "': its backend does not claim order-variant (a bit-exact or approximate "
              "backend proves nothing here; ", known, ")");
  return {name, name, false};
}

std::vector<std::string> calibration_variants(std::string* note) {
  std::vector<std::string> v;
  for (SumOrder o : calibration_orders()) v.push_back(defects::name(o));
  try {
    const runner::BackendOps cuda = runner::make_backend_ops("cuda");  // a CUDA build with a device
    if (cuda.ops) v.push_back("cuda");
  } catch (const std::exception& e) {
    if (note) *note = std::string("cuda is not a member here: ") + e.what();
  }
  return v;
}

// One run's progress line on stderr.

std::string calibration_progress_line(const CalibrationRow& row) {
  char line[512];
  std::snprintf(line, sizeof line, "calibration: %-9s %-15s %-9s worst %.3g of its bound %s%s%s (%.1f s)\n",
                row.variant.c_str(), row.scenario.c_str(), row.verdict.c_str(), row.worst_ratio, row.worst.c_str(),
                row.root_cause.empty() ? "" : "; root cause ", row.root_cause.c_str(), row.seconds);
  return line;
}

void record_conform(const reports::RunReport& report, CalibrationRow& row) {
  row.conform_exit = conform::conform_exit_code(report);
  calibration_worst_row(report, row);
  if (const std::optional<conform::RootCause> rc = conform::root_cause(report)) {
    std::ostringstream w;
    w << zoo_location(rc->component, rc->layer, rc->step) << " (" << rc->metric << " " << rc->value << ")";
    row.root_cause = w.str();
  }
}

// The worst checked order-variant row (a derived bound on max_rowrel or row_gain) as value / bound.
void calibration_worst_row(const reports::RunReport& report, CalibrationRow& row) {
  for (const reports::ScenarioResult& s : report.scenarios) {
    for (const reports::Comparison& cmp : s.comparisons) {
      for (const reports::MetricRow& r : cmp.rows) {
        if (!r.tolerance || r.tolerance->bound <= 0) continue;
        if (r.metric != judge::kRowRelMetric && r.metric != judge::kRowGainMetric &&
            r.metric != judge::kDecodedRowRelMetric && r.metric != judge::kDecodedBlockGainMetric &&
            r.metric != judge::kTensorGainMetric && r.metric != judge::kTensorBiasMetric) {
          continue;
        }
        const double ratio = r.value / r.tolerance->bound;
        if (ratio > row.worst_ratio) {
          row.worst_ratio = ratio;
          row.worst = zoo_location(r.component, r.layer, r.step) + " " + r.metric;
        }
      }
    }
  }
}

const std::vector<CalibrationScenario>& calibration_scenarios() {
  static const std::vector<CalibrationScenario> v = [] {
    std::vector<CalibrationScenario> out;
    out.push_back({"zoo", "the self-test scenario: 45 + 25 prefill (a split ratio-2 group, the window wraps), 3 decode steps "
                          "with a full resume",
                   zoo_scenario()});
    {
      ZooScenario z;
      z.prompt = tokens(160, 53, 7);
      z.chunks = {160};
      z.decode = {9, 400, 1000, 17};
      z.resume_step = -1;
      out.push_back({"long_prefill", "one 160-token prefill (the window wraps twice, 40 ratio-4 groups), 4 decode steps",
                     std::move(z)});
    }
    {
      ZooScenario z;
      z.prompt = tokens(23, 29, 3);
      z.chunks = {3};
      for (int i = 0; i < 20; ++i) z.chunks.push_back(1);
      z.decode = {42, 7};
      z.resume_step = -1;
      out.push_back({"token_by_token", "a 3-token chunk, then 20 one-token prefill chunks and 2 decode steps", std::move(z)});
    }
    {
      ZooScenario z;
      z.prompt = tokens(63, 71, 5);
      for (int i = 0; i < 9; ++i) z.chunks.push_back(7);
      z.decode = {300, 301, 302};
      z.resume_step = 10;
      out.push_back({"chunks_of_7", "63 prompt tokens in 9 chunks of 7 (odd chunks across every group boundary), 3 decode "
                                    "steps, the second a full resume",
                     std::move(z)});
    }
    return out;
  }();
  return v;
}

CalibrationResult run_calibration(const CalibrationOptions& o, std::ostream& progress) {
  if (o.suite) {
    CalibrationResult result;
    result.rows = calibrate_suite(o, progress);
    for (const CalibrationRow& row : result.rows) result.error = result.error || row.verdict == "ERROR";
    return result;
  }
  const SelftestModel L = load_selftest_model(o.config, o.weights);
  const std::vector<int64_t> token_map = reference::model::default_token_map(L.config);
  std::vector<CalibrationMember> members;
  std::string note;
  for (const std::string& n : o.variants.empty() ? calibration_variants(&note) : o.variants) {
    members.push_back(calibration_member(n));
  }
  if (o.progress && !note.empty()) progress << "calibration: " << note << "\n";
  std::vector<const CalibrationScenario*> scenarios;
  for (const CalibrationScenario& s : calibration_scenarios()) {
    bool wanted = o.scenarios.empty();
    for (const std::string& n : o.scenarios) wanted = wanted || n == s.name;
    if (wanted) scenarios.push_back(&s);
  }
  for (const std::string& n : o.scenarios) {
    bool known = false;
    std::string names;
    for (const CalibrationScenario& s : calibration_scenarios()) {
      known = known || s.name == n;
      names += (names.empty() ? "" : ", ") + s.name;
    }
    DSV41_CHECK(known, "unknown calibration scenario '", n, "' (", names, ")");
  }
  const std::string root = temp_root(o.dir, "calibration");
  fs::create_directories(root);
  CalibrationResult result;
  for (const CalibrationScenario* s : scenarios) {
    const std::string ref_dir = root + "/" + s->name + ".reference";
    fs::remove_all(ref_dir);
    write_scenario_dump(ref_dir, L.config, L.weights_path, L.weights, s->plan, reference::seam::reference_ops(),
                        "dsv41 selftest --calibration (reference)");
    for (const CalibrationMember& m : members) {
      CalibrationRow row;
      row.variant = m.name;
      row.scenario = s->name;
      const std::string dir = root + "/" + s->name + "." + row.variant;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        fs::remove_all(dir);
        // A reordered variant behind the seam, or the backend's own ops (cuda: on the device).
        const runner::BackendOps parts = m.reordered ? runner::BackendOps{} : runner::make_backend_ops(m.backend);
        const std::unique_ptr<reference::seam::Ops> reordered =
            m.reordered ? make_reordered_ops(sum_order_from_name(m.name)) : nullptr;
        write_scenario_dump(dir, L.config, L.weights_path, L.weights, s->plan, reordered ? *reordered : *parts.ops,
                            "dsv41 selftest --calibration --variants " + row.variant);
        row.changed = dumps_differ(ref_dir, dir);
        const reports::RunReport report = conform::conform(conform::read_port_dump(dir), L.weights, token_map,
                                                           order_variant_options(row.variant, m.backend));
        record_conform(report, row);
        row.verdict = row.conform_exit != 0 ? "ALARM" : row.changed ? "ok" : "NO-CHANGE";
      } catch (const std::exception& e) {
        row.verdict = "ERROR";
        row.root_cause = e.what();
        result.error = true;
      }
      row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!o.keep) fs::remove_all(dir);
      if (o.progress) progress << calibration_progress_line(row) << std::flush;
      result.rows.push_back(std::move(row));
    }
    if (!o.keep) fs::remove_all(ref_dir);
  }
  for (const std::string& run : o.official) {  // the official code as a port
    CalibrationRow row = calibrate_official(run, root, o.keep);
    result.error = result.error || row.verdict == "ERROR";
    if (o.progress) progress << calibration_progress_line(row) << std::flush;
    result.rows.push_back(std::move(row));
  }
  if (!o.keep && o.dir.empty()) fs::remove_all(root);
  return result;
}

std::string format_calibration_table(const CalibrationResult& r) {
  std::ostringstream out;
  bool suite = false;
  for (const CalibrationRow& row : r.rows) suite = suite || !row.modes.empty();
  out << "| variant | scenario | bits changed | " << (suite ? "exit" : "conform exit")
      << " | worst row / bound | worst row | root cause | " << (suite ? "comparisons | " : "") << "verdict | s |\n"
      << "|---|---|---|---|---|---|---|---|" << (suite ? "---|" : "") << "---|\n";
  for (const CalibrationRow& row : r.rows) {
    char ratio[32], secs[32];
    std::snprintf(ratio, sizeof ratio, "%.3g", row.worst_ratio);
    std::snprintf(secs, sizeof secs, "%.1f", row.seconds);
    out << "| " << row.variant << " | " << row.scenario << " | " << (row.changed ? "yes" : "no") << " | "
        << row.conform_exit << " | " << ratio << " | " << (row.worst.empty() ? "-" : row.worst) << " | "
        << (row.root_cause.empty() ? "-" : row.root_cause) << " | " << (suite ? row.modes + " | " : "") << row.verdict
        << " | " << secs << " |\n";
  }
  return out.str();
}

int calibration_exit_code(const CalibrationResult& r) {
  if (r.error) return 2;
  for (const CalibrationRow& row : r.rows) {
    if (row.verdict != "ok") return 1;
  }
  return 0;
}

SensitivityResult run_sensitivity(const SensitivityOptions& o, std::ostream& progress) {
  const SelftestModel L = load_selftest_model(o.config, o.weights);
  const std::vector<int64_t> token_map = reference::model::default_token_map(L.config);
  std::vector<std::string> components = o.components;
  if (components.empty()) {
    for (const reference::model::ComponentInfo& info : reference::model::component_table()) {
      if (info.kind != reference::model::ComponentKind::kTensor) continue;
      if (std::string(info.name).rfind("dspark", 0) == 0) continue;  // not in the zoo scenario's forward
      if (info.id == reference::model::Component::kLogits) continue;   // captured outside the tensor hooks
      components.push_back(info.name);
    }
  }
  const std::vector<double> factors = o.factors.empty() ? std::vector<double>{1.1, 1.03, 1.01, 1.003, 1.001} : o.factors;
  const std::string root = temp_root(o.dir, "sensitivity");
  fs::create_directories(root);
  const std::string clean_dir = root + "/clean";
  fs::remove_all(clean_dir);
  write_scenario_dump(clean_dir, L.config, L.weights_path, L.weights, zoo_scenario(), reference::seam::reference_ops(),
                      "dsv41 selftest --sensitivity (clean)");
  SensitivityResult result;
  for (const std::string& component : components) {
    int layer = o.layer;
    bool placed = false;  // a layer whose step holds the component (the first factor searches for it)
    for (double f : factors) {
      SensitivityRow row;
      row.component = component;
      row.step = o.step;
      row.factor = f;
      const std::string dir = root + "/" + component;
      try {
        const bool model_level = component == "final_norm_out" || component == "embed";  // layer -1
        const int last = model_level ? -1 : L.config.n_layers - 1;
        for (int l = model_level ? -1 : layer; l <= last; ++l) {
          std::ostringstream spec;
          spec << component << ":L" << l << ":S" << o.step << ":x" << f;
          const defects::Mutation m = defects::parse_mutation(spec.str());
          bool fired = false;
          DumpDefects d;
          d.mutation = &m;
          d.fired = &fired;
          fs::remove_all(dir);
          write_scenario_dump(dir, L.config, L.weights_path, L.weights, zoo_scenario(), reference::seam::reference_ops(),
                              "dsv41 selftest --sensitivity " + spec.str(), d);
          row.layer = l;
          if (fired || placed) {  // planted (the layer's step holds the component); fired: it changed the dump
            row.fired = fired && dumps_differ(clean_dir, dir);
            layer = l;
            placed = true;
            break;
          }
        }
        if (!row.fired) {
          row.verdict = "NOT-FIRED";
        } else {
          const reports::RunReport report =
              conform::conform(conform::read_port_dump(dir), L.weights, token_map, order_variant_options(component, "ref"));
          row.flagged = conform::conform_exit_code(report) == 1;
          if (const std::optional<conform::RootCause> rc = conform::root_cause(report)) {
            row.root_cause = zoo_location(rc->component, rc->layer, rc->step);
            row.located = rc->component == component && rc->layer == row.layer && rc->step == row.step;
          }
          row.verdict = !row.flagged ? "MISSED" : row.located ? "ok" : "MISLOCATED";
        }
      } catch (const std::exception& e) {
        row.verdict = "ERROR";
        row.root_cause = e.what();
        result.error = true;
      }
      fs::remove_all(dir);
      if (o.progress) {
        char line[512];
        std::snprintf(line, sizeof line, "sensitivity: %-16s L%-2d x%-6g %-10s %s\n", component.c_str(), row.layer, f,
                      row.verdict.c_str(), row.root_cause.c_str());
        progress << line << std::flush;
      }
      result.rows.push_back(std::move(row));
    }
  }
  fs::remove_all(clean_dir);
  if (o.dir.empty()) fs::remove_all(root);
  return result;
}

std::string format_sensitivity_table(const SensitivityResult& r) {
  std::vector<double> factors;
  std::map<std::string, std::map<double, const SensitivityRow*>> grid;
  std::vector<std::string> order;
  for (const SensitivityRow& row : r.rows) {
    if (!grid.count(row.component)) order.push_back(row.component);
    grid[row.component][row.factor] = &row;
    bool seen = false;
    for (double f : factors) seen = seen || f == row.factor;
    if (!seen) factors.push_back(row.factor);
  }
  std::ostringstream out;
  out << "| component | layer | step | smallest gain (factor - 1) flagged and located |";
  for (double f : factors) out << " x" << f << " |";
  out << "\n|---|---|---|---|";
  for (size_t i = 0; i < factors.size(); ++i) out << "---|";
  out << "\n";
  for (const std::string& c : order) {
    double best = -1;
    int layer = -1;
    int64_t step = 0;
    for (const auto& [f, row] : grid[c]) {
      if (row->verdict != "NOT-FIRED") layer = row->layer, step = row->step;
      if (row->verdict == "ok" && (best < 0 || std::fabs(f - 1) < best)) best = std::fabs(f - 1);
    }
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", best);
    out << "| " << c << " | " << layer << " | " << step << " | " << (best < 0 ? std::string("none") : std::string(b)) << " |";
    for (double f : factors) {
      const auto it = grid[c].find(f);
      out << " " << (it == grid[c].end() ? "-" : it->second->verdict) << " |";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace dsv41::scenarios::selftest
