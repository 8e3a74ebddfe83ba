// scenarios/selftest/calibration.h
//
// The other half of the verifier's self-test (docs/selftest.md): no false alarm on correct
// order-variant ports, and the power of the order-variant claim against small bugs.
//
//   calibration   every reordered variant (scenarios/defects/reordered_ops.h) dumps every
//                 calibration scenario through the `forward --dump` code path; `conform` judges
//                 each dump under the order-variant claim and must pass it (exit 0). The table
//                 gives, per run, whether the variant changed any bit, conform's exit, and the
//                 worst checked row as a fraction of its bound (how close the run came to an alarm).
//   calibration --suite
//                 every reordered variant as a side of `dsv41 run` over the built-in scenario suite
//                 (ref vs ref-order:<variant>, free-running and teacher-forced), judged by the
//                 runner's order-variant tolerance (the same derived bounds, docs/scenarios.md
//                 "Order-variant pairs"); a run is ok when no comparison fails (exit 0) and the
//                 variant changed some output (calibration_suite.cc).
//   sensitivity   a sweep of one-row gain errors: for each float component, the last row of the
//                 component at a fixed (layer, step) of the zoo scenario multiplied by each
//                 factor (mutant ...:x<factor>, scenarios/defects/mutants.h), dumped, judged under
//                 order-variant; the curve is the smallest |factor - 1| that is flagged AND
//                 located at the component where it was planted.
//
// Example:
//   CalibrationOptions o;  o.variants = {"splitk"};
//   CalibrationResult r = run_calibration(o, std::cerr);
//   std::cout << format_calibration_table(r);   // exit: calibration_exit_code(r)
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/defects/reordered_ops.h"
#include "scenarios/selftest/bug_zoo.h"

namespace dsv41::scenarios::selftest {

// A scenario of the calibration: a plan of prefill chunks and decode tokens (ZooScenario).
struct CalibrationScenario {
  std::string name;  // "zoo", "long_prefill", ...
  std::string what;  // one line
  ZooScenario plan;
};
// Every calibration scenario, in a fixed order (docs/selftest.md "Calibration" lists them).
const std::vector<CalibrationScenario>& calibration_scenarios();

// The variants a calibration runs by default: every reordered sum order (defects::all_sum_orders),
// then trunc13, the emulation of the fp8 tensor-core block dot, judged under the accumulation it
// declares, fp8-tensor-core (scenarios/judge/derived_bounds.h; docs/conform.md "Accumulation").
std::vector<defects::SumOrder> calibration_orders();

// A member of the calibration: a reordered variant of the reference (its reordered_ops.h name,
// run as the backend ref-order:<name>) or an order-variant backend by its runner name ("cuda": the
// production CUDA path, claim order-variant; needs a CUDA build and a device).
struct CalibrationMember {
  std::string name;     // the table's variant column: "splitk", "cuda"
  std::string backend;  // the runner backend: "ref-order:splitk", "cuda"
  bool reordered = false;
};
// The member `name` names; a dsv41::Error naming the reordered variants and the rule for backends
// otherwise (a backend must claim order-variant and carry no planted defect and the packed caches).
CalibrationMember calibration_member(const std::string& name);
// The default members: calibration_orders(), then "cuda" where this build and machine can make
// that backend (a CUDA build with a device); `note` (if given) says why cuda is not a member here.
std::vector<std::string> calibration_variants(std::string* note = nullptr);

struct CalibrationOptions {
  std::string config, weights;         // "": the built-in tiny oracle's
  std::vector<std::string> variants;   // calibration_member names; empty: calibration_variants()
  std::vector<std::string> scenarios;  // names; empty: every calibration scenario
  std::string dir;                     // where the dumps go; "": a temporary directory
  bool keep = false;                   // keep the dumps
  bool progress = true;                // one line per run on stderr
  // Official runs (the golden folder layout) judged as ports: each imported
  // (scenarios/agree/official_dump.h) and judged order-variant with its known differences waived
  // by name; variant "official", scenario the run's folder name. Empty: none.
  std::vector<std::string> official;
  // The built-in scenario suite through the runner instead of the dumped calibration scenarios
  // (`scenarios` then names suite scenarios; the official runs are not part of it).
  bool suite = false;
};

struct CalibrationRow {
  std::string variant, scenario;
  bool changed = false;        // the variant's dump differs from the reference's (else it proves nothing)
  int conform_exit = 0;
  double worst_ratio = 0;      // max over checked order-variant rows (max_rowrel, row_gain, decoded_rowrel,
                               // decoded_block_gain) of value / bound
  std::string worst;           // "attn_out@3 step 1 max_rowrel" of that row
  std::string root_cause;      // "component@layer step S (metric value)" when flagged
  std::string verdict;         // ok, ALARM (flagged), NO-CHANGE (identical to the reference), ERROR
  std::string modes;           // --suite: each comparison's verdict ("free-running measured, teacher-forced pass")
  double seconds = 0;
};
struct CalibrationResult {
  std::vector<CalibrationRow> rows;
  bool error = false;
};

CalibrationResult run_calibration(const CalibrationOptions& options, std::ostream& progress);
// golden/oracle and every golden/runs/* of the source tree: the official runs the project holds.
std::vector<std::string> golden_official_runs();
// One official run as a calibration member (calibration_official.cc): imported into `root`,
// judged; the dump removed unless `keep`.
CalibrationRow calibrate_official(const std::string& run_dir, const std::string& root, bool keep);
// Every variant x built-in suite scenario through `dsv41 run` (options.suite; calibration_suite.cc);
// conform_exit holds the run's exit code.
std::vector<CalibrationRow> calibrate_suite(const CalibrationOptions& options, std::ostream& progress);
// One run's progress line (stderr).
std::string calibration_progress_line(const CalibrationRow& row);
// The worst checked order-variant row of a report, as value / bound, into row.worst_ratio / worst.
void calibration_worst_row(const reports::RunReport& report, CalibrationRow& row);
// A conform report into its row: conform_exit, the worst row (above) and the root cause, if any.
void record_conform(const reports::RunReport& report, CalibrationRow& row);
std::string format_calibration_table(const CalibrationResult& r);
// 0: every run ok; 1: an ALARM or a NO-CHANGE; 2: a run errored.
int calibration_exit_code(const CalibrationResult& r);

struct SensitivityOptions {
  std::string config, weights;           // "": the built-in tiny oracle's
  std::vector<std::string> components;   // float components; empty: every one a hook carries (not the
                                         // logits, captured outside the hooks; not the DSpark draft's)
  std::vector<double> factors;           // empty: 1.1, 1.03, 1.01, 1.003, 1.001
  int layer = 2;                         // where to plant (the first layer >= it holding the component)
  int64_t step = 1;                      // the zoo scenario's step (1: the 25-row prefill chunk)
  std::string dir;
  bool progress = true;
};

struct SensitivityRow {
  std::string component;
  int layer = -1;
  int64_t step = 0;
  double factor = 1;
  bool fired = false;          // the mutation changed the dump
  bool flagged = false;        // conform exit 1
  bool located = false;        // the root cause is (component, layer, step)
  std::string root_cause;      // where conform put it ("" when not flagged)
  std::string verdict;         // ok (flagged and located), MISSED, MISLOCATED, NOT-FIRED, ERROR
};
struct SensitivityResult {
  std::vector<SensitivityRow> rows;  // component-major, factors in the order given
  bool error = false;
};

SensitivityResult run_sensitivity(const SensitivityOptions& options, std::ostream& progress);
// Per component: the smallest |factor - 1| flagged and located (the curve), and the full grid.
std::string format_sensitivity_table(const SensitivityResult& r);

}  // namespace dsv41::scenarios::selftest
