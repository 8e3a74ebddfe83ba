// scenarios/cli/cli_conform.cc
//
// dsv41 conform DUMP --config C --weights W [--token-map F] [--tolerances FILE] [--order-variant]
//                    [-o report.h5] [--junit FILE] [--stop-after-step N] [--only COMPONENT[@LAYER]]
//   Judges a port's dump (docs/port-dump.md) against the reference (scenarios/conform/conform.h,
//   docs/conform.md): the root cause first (the earliest component wrong given right inputs), then
//   the summary, every failure with a one-line repro, and the support matrix. Exit code: 0 pass,
//   1 a component beyond its bound, 2 bad input or error, 3 coverage too thin to judge.
#include <cstdio>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "reference/ops/config.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reports/report.h"
#include "scenarios/cli/cli.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/conform/conform.h"
#include "scenarios/runner/id_list.h"
#include "scenarios/runner/runner.h"
#include "base/sha256.h"

namespace dsv41::scenarios::cli {
namespace {

struct ConformArgs {
  std::string dump, config, weights, token_map, tolerances, junit, only, require;
  std::string vectors, port_out;  // the conformance-vector form
  std::string output = "conform.h5";
  int64_t stop_after_step = -1;
  int threads = 0;
  bool no_end_to_end = false;
  bool no_hypotheses = false;
  bool order_variant = false;
  std::string accumulation;  // "": the manifest's
  bool quiet = false;
};

int run(const ConformArgs& a, const std::string& command_line) {
  if (!a.vectors.empty() || !a.port_out.empty()) {
    DSV41_CHECK(!a.vectors.empty() && !a.port_out.empty() && a.dump.empty() && a.config.empty() && a.weights.empty(),
                "conform: --vectors DIR --port-out PORT_DIR go together, without a DUMP, --config or --weights");
    return run_conform_vectors(a.vectors, a.port_out, a.only, a.require, a.output, a.junit, command_line);
  }
  DSV41_CHECK(!a.dump.empty() && !a.config.empty() && !a.weights.empty(),
              "conform: a DUMP with --config and --weights (or --vectors DIR --port-out PORT_DIR)");
  // 1. Everything that can be checked before the weights are read; first the outputs, which never
  // alias an input (`conform d.h5 -o d.h5` would replace the port's dump).
  output::VerbFiles inputs;
  inputs.input(a.dump, "port dump").input(a.config, "config (--config)").input(a.weights, "weights (--weights)");
  inputs.input(a.token_map, "token map (--token-map)").input(a.tolerances, "tolerance file (--tolerances)");
  runner::check_report_outputs(a.output, a.junit, inputs);
  const reference::ModelConfig c = reference::load_config(a.config);
  const conform::PortDump d = conform::read_port_dump(a.dump);
  if (reference::config_hash(c) != d.config_hash) {
    DSV41_FAIL("--config '", a.config, "' (hash ", reference::config_hash(c), ") is not the config of the dump '", a.dump,
               "' (", conform::kPortDumpManifest, ": hash ", d.config_hash, ")");
  }
  std::vector<int64_t> map = a.token_map.empty() ? reference::model::default_token_map(c)
                                                 : runner::parse_id_list("@" + a.token_map, "--token-map");
  if (static_cast<int64_t>(map.size()) != c.vocab_size) {
    DSV41_FAIL("--token-map '", a.token_map, "': ", map.size(), " ids, but config '", a.config, "' has a vocab of ",
               c.vocab_size);
  }
  conform::ConformOptions o;
  o.tolerances_file = a.tolerances;
  if (!a.tolerances.empty()) conform::load_conform_tolerances(a.tolerances);  // refused before the weights
  o.progress = !a.quiet;
  o.end_to_end = !a.no_end_to_end;
  o.hypotheses = !a.no_hypotheses;
  o.stop_after_step = a.stop_after_step;
  o.only = a.only;
  o.order_variant = a.order_variant;
  o.accumulation = a.accumulation;
  if (!a.require.empty()) o.require = conform::parse_require(a.require);
  o.rerun_prefix = "dsv41 conform " + reports::shell_quote(a.dump) + " --config " + reports::shell_quote(a.config) + " --weights " +
                   reports::shell_quote(a.weights) + (a.token_map.empty() ? "" : " --token-map " + reports::shell_quote(a.token_map)) +
                   (a.tolerances.empty() ? "" : " --tolerances " + reports::shell_quote(a.tolerances)) +
                   (a.order_variant ? " --order-variant" : "") +
                   (a.accumulation.empty() ? "" : " --accumulation " + a.accumulation) +
                   (a.require.empty() ? "" : " --require " + reports::shell_quote(a.require));
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  runner::check_report_outputs(a.output, a.junit, inputs);  // again: nothing appeared meanwhile

  // 2. The coverage first (a partial port sees at once what is judged), then the judgement.
  std::cout << "coverage, the support matrix (" << d.steps.size() << " steps; "
            << (o.require.empty() ? std::string("default rule: logits and a per-layer component")
                                  : "--require " + a.require)
            << "):\n";
  for (const std::string& line : conform::support_matrix_lines(d)) std::cout << "  " << line << "\n";
  reports::RunReport report = conform::conform(d, reference::checkpoint::ModelWeights::load(a.weights, c), map, o);
  report.meta.config_name = a.config;
  report.meta.weights = "file:" + a.weights;
  report.meta.weights_sha256 = sha256_file_hex(a.weights);
  runner::stamp_run_meta(report.meta, command_line);
  reports::write_report(a.output, report);
  if (!a.junit.empty()) conform::write_conform_junit(a.junit, report, d, o.require);

  // 3. The root cause, then the summary and the failures.
  if (const std::optional<conform::RootCause> rc = conform::root_cause(report)) {
    std::cout << "root cause (" << rc->mode << "): step " << rc->step << ", "
              << (rc->layer < 0 ? std::string("model") : "layer " + std::to_string(rc->layer)) << ", " << rc->component
              << ": " << rc->metric << " = " << rc->value << "; " << rc->detail << "\n  repro: " << rc->repro << "\n";
    if (const size_t n = conform::root_causes(report).size(); n > 1) {
      std::cout << n << " independent root causes (teacher-forced; the ROOT CAUSE lines below; docs/conform.md \"Root causes\")\n";
    }
  } else if (report.verdict == reports::Verdict::kPass) {
    std::cout << "conform: every covered component of every step agrees with the reference\n";
  }
  std::cout << reports::format_summary(report);
  constexpr size_t kMaxLines = 40;
  for (const reports::Comparison& cmp : report.scenarios.front().comparisons) {
    size_t shown = 0, fails = 0;
    for (const std::string& n : cmp.notes) fails += n.rfind("FAIL ", 0) == 0;
    for (const std::string& n : cmp.notes) {
      if (n.rfind("FAIL ", 0) == 0 && shown++ >= kMaxLines) continue;
      std::cout << "  [" << cmp.mode << "] " << n << "\n";
    }
    if (fails > kMaxLines) std::cout << "  [" << cmp.mode << "] ... and " << fails - kMaxLines << " more failures (report: notes)\n";
  }
  if (conform::conform_detail::order_variant(d, o)) {  // the tolerance table of the claim: one row per float component
    const conform::ConformTolerances tol = a.tolerances.empty() ? conform::ConformTolerances{} : conform::load_conform_tolerances(a.tolerances);
    const judge::Accumulation acc = conform::conform_detail::accumulation(d, o);
    std::cout << "claim: order-variant (" << (a.order_variant ? "--order-variant" : "the dump's manifest")
              << "), accumulation " << judge::name(acc) << " ("
              << (a.accumulation.empty() ? "the dump's manifest" : "--accumulation") << "); derived bounds, metric "
              << judge::kRowRelMetric << " (teacher-forced):\n";
    for (const judge::DerivedBound& b : judge::derived_bound_table(d.config, acc)) {
      const bool file = tol.count(b.component) > 0 || tol.count("*") > 0;
      std::cout << "  " << b.component << ": " << judge::kRowRelMetric << " <= " << b.bound << "  "
                << (file ? "[overridden by the tolerance file] " : "") << b.origin << "\n";
    }
    for (const judge::DerivedBound& b : judge::derived_cache_bound_table(d.config, acc)) {
      const bool file = tol.count(b.component) > 0 || tol.count("*") > 0;
      std::cout << "  " << b.component << ": " << judge::kDecodedRowRelMetric << " <= " << b.bound << "  "
                << (file ? "[overridden by the tolerance file] " : "") << b.origin << "\n";
    }
    std::cout << "  every cache above, also: " << judge::kDecodedBlockGainMetric << " <= "
              << judge::decoded_block_gain_tolerance().bound << "  (a scale block's gain error; docs/conform.md)\n";
    const judge::DerivedBound any = judge::derived_bound_table(d.config, acc).front();  // a copy: the table is a temporary
    std::cout << "  every row above, also: " << judge::kRowGainMetric << " <= " << judge::row_gain_tolerance(any).bound
              << "  (a row's gain error, its lower " << judge::kRowGainSigmas
              << "-sigma bound; docs/conform.md \"Row gain\")\n";
  }
  std::cout << "report: " << a.output << (a.junit.empty() ? "" : ", junit: " + a.junit) << "\n";
  return conform::conform_exit_code(report);
}

}  // namespace

Verb add_conform_verb(CLI::App& parent) {
  auto a = std::make_shared<ConformArgs>();
  CLI::App* app = parent.add_subcommand(
      "conform", "judge a port's dump (docs/port-dump.md) against the reference: each component teacher-forced from "
                 "the port's own inputs, end-to-end logits and selections, caches byte for byte (docs/conform.md)");
  app->add_option("dump", a->dump, "the dump: a directory (dump.json and step_NNNNNN.safetensors) or an HDF5 file (docs/port-dump.md)");
  app->add_option("--config", a->config, "config preset or config.json; must be the dump's config (with a DUMP)");
  app->add_option("--weights", a->weights, "safetensors file with the official tensor names (with a DUMP)");
  app->add_option("--vectors", a->vectors,
                  "judge a port's outputs of the conformance vectors in this directory (dsv41 vectors; with --port-out)");
  app->add_option("--port-out", a->port_out,
                  "the port's outputs of the vectors: <case>.safetensors holding out.* (docs/port-dump.md)");
  app->add_option("--token-map", a->token_map, "Engram compressed id of every vocab entry, one per line (default: id*C/V)");
  app->add_option("--tolerances", a->tolerances,
                  "JSON {component: {metric: bound, origin, note}} replacing the bit-exact default of the components "
                  "it names (docs/conform.md)");
  app->add_option("-o,--output", a->output, "the HDF5 report (written atomically; `dsv41 report show` reads it)");
  app->add_option("--junit", a->junit,
                  "also write JUnit XML here: one testcase per (component, layer) and comparison, <skipped> for the "
                  "components the dump does not cover (with --vectors: one per case)");
  app->add_option("--require", a->require,
                  "a partial port: the comma-separated components (with --vectors: ops) it must cover; the verdict is "
                  "then on what it holds (exit 0 when every covered row passes and these are covered; exit 3 when "
                  "one is missing); default: logits and a per-layer component (docs/conform.md \"Partial ports\")");
  app->add_option("--stop-after-step", a->stop_after_step, "judge steps 0..N only (a repro)")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app->add_option("--only", a->only,
                  "judge only COMPONENT or COMPONENT@LAYER (a repro; -1: model.); with --vectors: only the cases of OP");
  app->add_option("--threads", a->threads, "reference threads (default: DSV41_THREADS or the cores)")
      ->check(CLI::Range(1, 1024));
  app->add_flag("--no-end-to-end", a->no_end_to_end, "only the teacher-forced comparison");
  app->add_flag("--no-hypotheses", a->no_hypotheses,
                "order-variant: skip the directional tests of attn_out (one rerun of each step per hypothesis; "
                "docs/conform.md \"Hypotheses\")");
  app->add_flag("--order-variant", a->order_variant,
                "judge under the order-variant claim (also the dump's manifest \"claim\"): every float component "
                "within its derived bound with its origin, the rest exact (docs/conform.md \"Claims\")");
  app->add_option("--accumulation", a->accumulation,
                  "order-variant: the accumulation the port's sums use, fp32 or fp8-tensor-core (its fp8 linears on "
                  "Hopper's fp8 tensor cores, as DeepGEMM-style kernels; derived bounds with A4-A5); default: the "
                  "dump's manifest \"accumulation\", else fp32 (docs/conform.md \"Accumulation\")")
      ->check(CLI::IsMember({"fp32", "fp8-tensor-core"}));
  app->add_flag("-q,--quiet", a->quiet, "no progress lines");
  return {app, [a, app] {
            const std::string cmd = command_line_of(*app, "conform", "dump");
            return run(*a, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
