// `dsv41 selftest` (docs/selftest.md): runs the bug zoo through `forward --dump` -> `conform` and
// prints the detection table (scenarios/selftest/selftest.h).
#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "reference/ops/numerics.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/selftest/calibration.h"
#include "scenarios/defects/reordered_ops.h"
#include "scenarios/runner/backend.h"
#include "scenarios/selftest/small_zoo.h"
#include "scenarios/cli/cli.h"
#include "scenarios/selftest/selftest.h"

namespace dsv41::scenarios::cli {
namespace {

struct SelftestArgs {
  std::string bugs, config, weights, dir, junit;
  bool ci = false, order_variant = false, list = false, keep = false, quiet = false;
  int threads = 0;
  // --calibration / --sensitivity (scenarios/selftest/calibration.h)
  bool calibration = false, sensitivity = false, no_official = false, suite = false;
  // --small-bugs (scenarios/selftest/small_zoo.h)
  bool small_bugs = false;
  std::string accumulation;  // --small-bugs: the claim's accumulation ("": fp32, or the base's)
  std::string base;          // --small-bugs: the backend the bugs are planted in ("": the reference)
  double min_located = 0.95;
  std::string variants, scenarios, components, factors;
  int layer = 2;
  int64_t step = 1;
  double goal = 0.01;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

int run_calibration(const SelftestArgs& a) {
  selftest::CalibrationOptions o;
  o.config = a.config;
  o.weights = a.weights;
  o.variants = split_list(a.variants);
  o.scenarios = split_list(a.scenarios);
  if (a.ci && o.variants.empty()) o.variants = {"splitk", "tiles"};
  o.suite = a.suite;
  if (a.ci && o.scenarios.empty()) o.scenarios = {a.suite ? "cold_prefill" : "zoo"};
  for (const std::string& v : o.variants) selftest::calibration_member(v);  // an unknown name: exit 2 first
  o.dir = a.dir;
  o.keep = a.keep;
  o.progress = !a.quiet;
  // The official runs of golden/ join the full calibration (not --ci, not a filtered one).
  if (!a.ci && !a.suite && a.variants.empty() && a.scenarios.empty() && !a.no_official) o.official = selftest::golden_official_runs();
  const selftest::CalibrationResult r = selftest::run_calibration(o, std::cerr);
  std::cout << selftest::format_calibration_table(r);
  const int code = selftest::calibration_exit_code(r);
  std::cout << "selftest --calibration: "
            << (code != 0 ? "FAILED"
                : a.suite ? "no false alarm: every order-variant variant passes every built-in scenario in both modes "
                            "(dsv41 run, ref vs ref-order:<variant>)"
                          : "no false alarm: every order-variant variant (and the official code) passes every scenario")
            << " ("
            << r.rows.size() << " runs)\n";
  return code;
}

int run_sensitivity(const SelftestArgs& a) {
  selftest::SensitivityOptions o;
  o.config = a.config;
  o.weights = a.weights;
  o.components = split_list(a.components);
  for (const std::string& f : split_list(a.factors)) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(f, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != f.size() || !(v > 0) || v == 1) {
      DSV41_FAIL("--factors: '", f, "' is not a positive number other than 1 (e.g. 1.01,0.99)");
    }
    o.factors.push_back(v);
  }
  o.layer = a.layer;
  o.step = a.step;
  o.dir = a.dir;
  o.progress = !a.quiet;
  const selftest::SensitivityResult r = selftest::run_sensitivity(o, std::cerr);
  std::cout << selftest::format_sensitivity_table(r);
  if (r.error) return runner::kExitBadInput;
  // The goal: every component whose defect fired is flagged and located at |factor - 1| <= goal.
  std::vector<std::string> short_of_goal;
  for (size_t i = 0; i < r.rows.size();) {
    const std::string& c = r.rows[i].component;
    bool fired = false, met = false;
    for (; i < r.rows.size() && r.rows[i].component == c; ++i) {
      fired = fired || r.rows[i].fired;
      met = met || (r.rows[i].verdict == "ok" && std::abs(r.rows[i].factor - 1) <= a.goal * (1 + 1e-9));
    }
    if (fired && !met) short_of_goal.push_back(c);
  }
  std::cout << "selftest --sensitivity: ";
  if (short_of_goal.empty()) {
    std::cout << "every component flagged and located at a row gain of " << a.goal << " or less\n";
    return runner::kExitOk;
  }
  std::cout << short_of_goal.size() << " component(s) not flagged and located at " << a.goal << ":";
  for (const std::string& c : short_of_goal) std::cout << " " << c;
  std::cout << "\n";
  return runner::kExitCheckFailed;
}

int run_small_bugs(const SelftestArgs& a) {
  if (a.list) {
    for (const selftest::SmallBug& b : selftest::small_zoo()) {
      std::cout << b.name << (b.ci ? " [ci]" : "") << "  (" << b.how << ") " << b.description << "; planted at "
                << selftest::zoo_location(b.expected_component, b.expected_layer, b.expected_step) << "\n";
    }
    return runner::kExitOk;
  }
  selftest::SmallZooOptions o;
  o.config = a.config;
  o.weights = a.weights;
  o.bugs = split_list(a.bugs);
  for (const std::string& n : o.bugs) selftest::small_bug(n);  // an unknown name: exit 2 before any run
  o.ci = a.ci;
  o.dir = a.dir;
  o.keep = a.keep;
  o.progress = !a.quiet;
  o.accumulation = a.accumulation;
  o.base = a.base;
  if (!a.base.empty()) runner::validate_backend_name(a.base);  // exit 2 before any run
  const selftest::SmallZooResult r = selftest::run_small_zoo(o, std::cerr);
  std::cout << selftest::format_small_zoo_table(r);
  for (const selftest::SmallZooRow& row : r.rows) {
    if (row.verdict == "ok") continue;
    std::cout << row.bug << ": " << row.verdict << "; at " << row.expected << ": "
              << (row.at_planted.empty() ? "no row" : row.at_planted)
              << (row.detail.empty() ? "" : "; root cause detail: " + row.detail) << "\n";
  }
  const int code = selftest::small_zoo_exit_code(r, a.min_located);
  std::cout << "selftest --small-bugs: "
            << (code == 0 ? "the clean reference passes, every bug fired, at least " : "FAILED: goal ") << a.min_located
            << " of the bugs located (order-variant"
            << (a.accumulation.empty() ? "" : ", accumulation " + a.accumulation)
            << (a.base.empty() ? "" : ", planted in " + a.base) << ")\n";
  return code;
}

int run(const SelftestArgs& a) {
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  if (int(a.calibration) + int(a.sensitivity) + int(a.small_bugs) > 1) {
    DSV41_FAIL("--calibration, --sensitivity and --small-bugs: one at a time");
  }
  DSV41_CHECK(!a.suite || a.calibration, "--suite: only with --calibration (the variants over the built-in suite)");
  // The outputs: never an input, and -o DIR new or empty (the tool removes only what it created
  // there; base/output_file.h).
  output::VerbFiles()
      .input(a.config, "config (--config)")
      .input(a.weights, "weights (--weights)")
      .output_directory(a.dir, "selftest output directory (-o)")
      .output(a.junit, "JUnit file (--junit)")
      .check();
  if (!a.list && !a.dir.empty()) output::claim_output_directory(a.dir, "selftest output directory (-o)");
  if (a.small_bugs) return run_small_bugs(a);
  if (a.list) {
    for (const selftest::ZooBug& b : selftest::bug_zoo()) {
      std::cout << b.name << (b.ci ? " [ci]" : "") << "  (" << name(b.kind) << ") " << b.description << "; expected "
                << b.expected_component << "@" << b.expected_layer << " step " << b.expected_step << "\n";
    }
    return runner::kExitOk;
  }
  if (a.calibration) return run_calibration(a);
  if (a.sensitivity) return run_sensitivity(a);
  selftest::SelftestOptions o;
  o.config = a.config;
  o.weights = a.weights;
  o.ci = a.ci;
  o.order_variant = a.order_variant;
  o.dir = a.dir;
  o.keep = a.keep;
  o.progress = !a.quiet;
  std::stringstream ss(a.bugs);
  for (std::string part; std::getline(ss, part, ',');) {
    if (!part.empty()) o.bugs.push_back(part);
  }
  if (!o.bugs.empty()) {
    for (const std::string& n : o.bugs) selftest::zoo_bug(n);  // an unknown name: exit 2 before any run
  }
  const selftest::SelftestResult r = run_selftest(o, std::cerr);
  std::cout << selftest::format_selftest_table(r);
  for (const selftest::SelftestRow& row : r.rows) {
    if (row.verdict != "ok") std::cout << row.bug << ": " << row.verdict << " (" << row.detail << ")\n";
  }
  if (!a.junit.empty()) selftest::write_selftest_junit(r, a.junit);
  const int code = selftest::selftest_exit_code(r);
  std::cout << "selftest: " << (code == 0 ? "every bug flagged and located, the clean reference passes"
                                          : "FAILED") << " (" << r.rows.size() - 1 << " bugs)\n";
  return code;
}

}  // namespace

Verb add_selftest_verb(CLI::App& parent) {
  auto a = std::make_shared<SelftestArgs>();
  CLI::App* app = parent.add_subcommand(
      "selftest", "the verifier's self-test: a zoo of port bugs through forward --dump -> conform, a detection table");
  app->add_option("--bugs", a->bugs, "comma-separated zoo bugs (default: the whole zoo; --list names them)");
  app->add_flag("--ci", a->ci, "the CI subset of the zoo (docs/selftest.md)");
  app->add_flag("--order-variant", a->order_variant,
                "judge every dump under the order-variant claim (derived bounds; docs/conform.md): which bugs stay "
                "detectable");
  app->add_flag("--list", a->list, "list the zoo and exit");
  app->add_flag("--calibration", a->calibration,
                "instead of the zoo: correct order-variant variants (reordered sums) x scenarios, each judged under "
                "order-variant; any alarm is a false alarm (docs/selftest.md \"Calibration\"); with --ci: 2 variants, "
                "the zoo scenario");
  app->add_option("--variants", a->variants, "--calibration: comma-separated members: reordered variants or an order-variant backend such as cuda "
                  "(default: every reordered variant, and cuda where a CUDA device is present)");
  app->add_flag("--no-official", a->no_official,
                "--calibration: without the official runs of golden/ (by default the full calibration also imports "
                "each one, dsv41 import-official, and judges the official code as a port)");
  app->add_option("--scenarios", a->scenarios, "--calibration: comma-separated calibration scenarios (default: all)");
  app->add_flag("--suite", a->suite,
                "--calibration: the built-in scenario suite through dsv41 run instead of the dumped calibration "
                "scenarios: ref vs ref-order:<variant> in both modes, judged by the runner's order-variant tolerance "
                "(docs/selftest.md \"Calibration\"); --scenarios then names suite scenarios; with --ci: 2 variants, "
                "cold_prefill");
  app->add_flag("--sensitivity", a->sensitivity,
                "instead of the zoo: one row of each float component scaled by each factor, judged under "
                "order-variant: the smallest gain error flagged and located (docs/selftest.md \"Sensitivity\")");
  app->add_option("--components", a->components, "--sensitivity: comma-separated components (default: every one)");
  app->add_option("--factors", a->factors, "--sensitivity: comma-separated factors (default 1.1,1.03,1.01,1.003,1.001)");
  app->add_option("--layer", a->layer, "--sensitivity: plant at the first layer >= this holding the component (default 2)");
  app->add_option("--step", a->step, "--sensitivity: the zoo scenario's step to plant in (default 1)");
  finite_option(app->add_option("--goal", a->goal, "--sensitivity: exit 1 unless every component is located at |factor-1| <= this "
                                     "(default 0.01)"), 0.0, 1.0, true);
  app->add_flag("--small-bugs", a->small_bugs,
                "instead of the zoo: the small-bug zoo (0.1-1% effects, one cache byte), each judged under "
                "order-variant: flagged and located where planted? (docs/selftest.md \"Small bugs\"); with --bugs, "
                "--list, --ci (the CI slice)");
  app->add_option("--accumulation", a->accumulation,
                  "--small-bugs: judge under the order-variant claim with this accumulation (fp32, or "
                  "fp8-tensor-core: docs/conform.md \"Accumulation\"); default: the --base backend's, else fp32")
      ->check(CLI::IsMember({"fp32", "fp8-tensor-core"}));
  app->add_option("--base", a->base,
                  "--small-bugs: plant the bugs in this backend (ref-order:<variant>, the tensor-core emulation "
                  "ref-order:trunc13, the production cuda; docs/selftest.md \"Small bugs\"); default: the reference");
  finite_option(app->add_option("--min-located", a->min_located,
                                "--small-bugs: exit 1 unless at least this fraction of the bugs is located (default 0.95)"),
                0.0, 1.0);
  app->add_option("-o,--output-dir", a->dir, "write the dumps here (default: a temporary directory)");
  app->add_flag("--keep", a->keep, "keep every dump (default: each removed after its judgement)");
  app->add_option("--junit", a->junit, "also write JUnit XML here (one testcase per run)");
  app->add_option("--config", a->config, "config.json (default: the built-in tiny oracle's)");
  app->add_option("--weights", a->weights, "weights (default: the built-in tiny oracle's)");
  app->add_option("--threads", a->threads, "reference threads (default: DSV41_THREADS or the cores)")
      ->check(CLI::PositiveNumber);
  app->add_flag("-q,--quiet", a->quiet, "no progress lines");
  return {app, [a] { return run(*a); }};
}

}  // namespace dsv41::scenarios::cli
