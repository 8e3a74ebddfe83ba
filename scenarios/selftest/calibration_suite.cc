// scenarios/selftest/calibration_suite.cc: the built-in scenario suite as calibration scenarios
// (calibration.h, CalibrationOptions::suite): each reordered variant is a side of `dsv41 run`,
// ref vs ref-order:<variant> in both modes, judged by the runner's order-variant tolerance (the
// derived bounds conform uses, docs/scenarios.md "Order-variant pairs"). A run is ok when no
// comparison fails (pass or measured, exit 0) and the variant changed some output.
#include <chrono>
#include <ostream>
#include <sstream>

#include "base/error.h"
#include "reference/model/model.h"
#include "scenarios/defects/reordered_ops.h"
#include "scenarios/runner/runner.h"
#include "scenarios/selftest/calibration.h"

namespace dsv41::scenarios::selftest {

namespace {

// Whether some output of the run differs between the sides (else the run proves nothing).
bool any_difference(const reports::ScenarioResult& s) {
  for (const reports::Comparison& c : s.comparisons) {
    for (const reports::MetricRow& r : c.rows) {
      if ((r.metric == "bit_equal_frac" || r.metric == "bytes_equal_frac") && r.value < 1.0) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<CalibrationRow> calibrate_suite(const CalibrationOptions& o, std::ostream& progress) {
  const SelftestModel L = load_selftest_model(o.config, o.weights);
  const runner::BackendResources res{L.config, L.weights, reference::model::default_token_map(L.config)};
  std::string note;
  const std::vector<std::string> variants = o.variants.empty() ? calibration_variants(&note) : o.variants;
  if (o.progress && !note.empty()) progress << "calibration: " << note << "\n";
  const std::vector<std::string> known = runner::builtin_scenario_names();
  std::vector<std::string> scenarios = o.scenarios.empty() ? known : o.scenarios;
  for (const std::string& n : scenarios) {
    bool found = false;
    std::string names;
    for (const std::string& k : known) {
      found = found || k == n;
      names += (names.empty() ? "" : ", ") + k;
    }
    DSV41_CHECK(found, "--calibration --suite: unknown built-in scenario '", n, "' (", names, ")");
  }
  std::vector<CalibrationRow> rows;
  for (const std::string& v : variants) {
    const CalibrationMember m = calibration_member(v);  // an unknown name: a dsv41::Error naming the known ones
    for (const std::string& n : scenarios) {
      CalibrationRow row;
      row.variant = v;
      row.scenario = n;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        runner::RunOptions ro;
        ro.sides = {"ref", m.backend};
        ro.modes = {"free-running", "teacher-forced"};
        ro.save_failure_tensors = false;
        reports::RunReport report;
        report.scenarios.push_back(runner::run_scenario(runner::builtin_scenario(n), res, ro));
        const reports::ScenarioResult& s = report.scenarios.back();
        row.changed = any_difference(s);
        row.conform_exit = reports::exit_code(s.verdict);
        calibration_worst_row(report, row);
        std::ostringstream modes;
        for (const reports::Comparison& c : s.comparisons) {
          modes << (modes.tellp() > 0 ? ", " : "") << c.mode << " " << reports::name(c.verdict);
          if (c.verdict == reports::Verdict::kFail && c.first_divergence && row.root_cause.empty()) {
            const reports::Divergence& d = *c.first_divergence;
            std::ostringstream w;
            w << zoo_location(d.component, d.layer, d.step) << " (" << d.metric << " " << d.value << ", " << c.mode << ")";
            row.root_cause = w.str();
          }
          if (c.verdict == reports::Verdict::kError && row.root_cause.empty()) {
            row.root_cause = c.notes.empty() ? "error" : c.notes.back();
          }
        }
        row.modes = modes.str();
        row.verdict = s.verdict == reports::Verdict::kError ? "ERROR"
                      : row.conform_exit != 0               ? "ALARM"
                      : row.changed                         ? "ok"
                                                            : "NO-CHANGE";
      } catch (const std::exception& e) {
        row.verdict = "ERROR";
        row.root_cause = e.what();
      }
      row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (o.progress) progress << calibration_progress_line(row) << std::flush;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace dsv41::scenarios::selftest
