// `dsv41 selftest` (docs/selftest.md): runs the bug zoo through `forward --dump` -> `conform` and
// prints the detection table (scenarios/selftest/selftest.h).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "reference/ops/numerics.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/cli/cli.h"
#include "scenarios/selftest/selftest.h"

namespace dsv41::scenarios::cli {
namespace {

struct SelftestArgs {
  std::string bugs, config, weights, dir, junit;
  bool ci = false, order_variant = false, list = false, keep = false, quiet = false;
  int threads = 0;
};

int run(const SelftestArgs& a) {
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  if (a.list) {
    for (const selftest::ZooBug& b : selftest::bug_zoo()) {
      std::cout << b.name << (b.ci ? " [ci]" : "") << "  (" << name(b.kind) << ") " << b.description << "; expected "
                << b.expected_component << "@" << b.expected_layer << " step " << b.expected_step << "\n";
    }
    return runner::kExitOk;
  }
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
