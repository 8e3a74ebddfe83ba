// scenarios/cli/cli_vectors.cc
//
// dsv41 vectors -o DIR [--sizes tiny,small,released] [--seed S] [--reference-port PORT_DIR]
//   Writes the per-component conformance vectors (scenarios/vectors/vectors.h, docs/port-dump.md
//   "Conformance vectors"): one safetensors file per case and vectors.json. Prints the seed, the
//   cases per size and the set's size. --reference-port also writes the reference's own outputs
//   for the set (what a port writes; `dsv41 conform --vectors DIR --port-out PORT_DIR` passes them).
// Also run_conform_vectors, the `dsv41 conform --vectors DIR --port-out PORT_DIR` form.
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/seam/ops.h"
#include "reports/report.h"
#include "scenarios/cli/cli.h"
#include "scenarios/runner/runner.h"
#include "scenarios/vectors/vectors.h"

namespace dsv41::scenarios::cli {
namespace {

struct VectorsArgs {
  std::string output, sizes = "tiny,small,released", reference_port;
  uint64_t seed = 0;
};

std::vector<std::string> split_sizes(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  DSV41_CHECK(!out.empty(), "--sizes '", s, "': no size (tiny, small, released)");
  return out;
}

int run(const VectorsArgs& a, const std::string& command_line) {
  const std::vector<std::string> sizes = split_sizes(a.sizes);
  // Two outputs, never one over the other: --reference-port writes the port's files, of the
  // vectors' names, into a directory of its own (new or empty; base/output_file.h).
  output::VerbFiles().output_directory(a.output, "vectors (-o)").output_directory(a.reference_port, "reference port outputs (--reference-port)").check();
  if (!a.reference_port.empty()) output::claim_output_directory(a.reference_port, "reference port outputs (--reference-port)", false);
  std::cout << "vectors: seed " << a.seed << " (--seed), sizes " << a.sizes << "\n";
  const vectors::VectorSetSummary s = vectors::write_vector_set(a.output, sizes, a.seed, command_line);
  const vectors::VectorSet set = vectors::read_vector_set(a.output);
  std::map<std::string, int> per_size;
  for (const vectors::VectorSetEntry& c : set.cases) ++per_size[c.size];
  for (const std::string& size : sizes) std::cout << "  " << size << ": " << per_size[size] << " cases\n";
  std::cout << "wrote " << s.cases << " cases, " << s.bytes << " bytes (" << (s.bytes >> 20) << " MiB) to " << a.output
            << "/" << vectors::kVectorsManifest << "\n";
  if (!a.reference_port.empty()) {
    output::claim_output_directory(a.reference_port, "reference port outputs (--reference-port)");
    vectors::run_port_on_vectors(reference::seam::reference_ops(), a.output, a.reference_port);
    std::cout << "reference port outputs: " << a.reference_port << "\n";
  }
  return runner::kExitOk;
}

}  // namespace

int run_conform_vectors(const std::string& vectors_dir, const std::string& port_dir, const std::string& only,
                        const std::string& require, const std::string& output, const std::string& junit,
                        const std::string& command_line) {
  runner::check_report_outputs(output, junit,
                               output::VerbFiles().input(vectors_dir, "vectors (--vectors)").input(port_dir, "port outputs (--port-out)"));
  std::vector<std::string> ops;  // --require: the ops a partial port promises
  std::stringstream in(require);
  for (std::string op; std::getline(in, op, ',');) {
    if (!op.empty()) ops.push_back(op);
  }
  DSV41_CHECK(require.empty() || !ops.empty(), "--require '", require, "': no op named");
  reports::RunReport r = vectors::conform_vectors(vectors_dir, port_dir, only, ops);
  runner::stamp_run_meta(r.meta, command_line);
  reports::write_report(output, r);
  if (!junit.empty()) reports::write_junit_suites(junit, vectors::vectors_junit_suites(r));
  int pass = 0, fail = 0, open = 0, skipped = 0;
  for (const reports::ScenarioResult& s : r.scenarios) {
    const reports::Comparison& c = s.comparisons.front();
    const bool skip = vectors::skipped_case(c);
    const char* word = skip ? "SKIPPED (not covered, not required)"
                       : s.verdict == reports::Verdict::kPass ? "PASS" : s.verdict == reports::Verdict::kFail ? "FAIL" : "NOT COVERED";
    (skip ? skipped : s.verdict == reports::Verdict::kPass ? pass : s.verdict == reports::Verdict::kFail ? fail : open) += 1;
    std::cout << word << " " << s.name;
    if (c.first_divergence) std::cout << ": " << c.first_divergence->metric << " = " << c.first_divergence->value << "; " << c.first_divergence->detail;
    std::cout << "\n";
    for (const std::string& n : c.notes) {
      if (n.rfind("not covered", 0) == 0) std::cout << "  " << n << "\n";
    }
  }
  std::cout << "conform --vectors: " << pass << " passed, " << fail << " failed, " << open << " not covered"
            << (ops.empty() ? "" : ", " + std::to_string(skipped) + " skipped (not covered, not in --require)") << " of "
            << r.scenarios.size() << " cases\nreport: " << output << (junit.empty() ? "" : ", junit: " + junit) << "\n";
  return reports::exit_code(r.verdict);
}

Verb add_vectors_verb(CLI::App& parent) {
  auto a = std::make_shared<VectorsArgs>();
  CLI::App* app = parent.add_subcommand(
      "vectors", "write per-component conformance vectors (inputs, expected outputs, tolerance and its origin) for "
                 "the tiny, small and released sizes, adversarial cases included (docs/port-dump.md)");
  app->add_option("-o,--output", a->output, "the new (or empty) directory: vectors.json and <case>.safetensors")->required();
  app->add_option("--sizes", a->sizes, "comma-separated sizes: tiny, small, released (default: all three)");
  seed_option(app->add_option("--seed", a->seed, "the inputs' seed (printed; each case derives its own from it and its name)"));
  app->add_option("--reference-port", a->reference_port,
                  "also write the reference's own outputs here (what a port writes, docs/port-dump.md)");
  return {app, [a] {
            std::string cmd = "dsv41 vectors -o " + reports::shell_quote(a->output) + " --sizes " + reports::shell_quote(a->sizes) +
                              " --seed " + std::to_string(a->seed);
            if (!a->reference_port.empty()) cmd += " --reference-port " + reports::shell_quote(a->reference_port);
            return run(*a, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
