// scenarios/cli/cli_agree.cc
//
// dsv41 agree ORACLE_DIR... [--mode teacher-forced|free-running|both] [-o report.h5] [--junit F]
//   The reference against official runs in the oracle folder format (scenarios/agree/agree.h,
//   docs/agreement.md): per step and layer, bounds with their origin; the first divergence; for the
//   free-running mode the drift profile per layer. Exit code: 0 pass, 1 a bound exceeded,
//   2 bad input or error, 3 inconclusive.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "reference/ops/numerics.h"
#include "reports/report.h"
#include "scenarios/agree/agree.h"
#include "scenarios/cli/cli.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/runner/runner.h"

namespace dsv41::scenarios::cli {
namespace {

struct AgreeArgs {
  std::vector<std::string> dirs;
  std::string mode = "teacher-forced";
  std::string backend = "ref";
  std::string output = "agree.h5";
  std::string junit;
  int threads = 0;
  bool no_attribution = false;
  bool quiet = false;
};

// The drift profile of a free-running comparison, per layer: each measure in the prefill, and over
// the decode steps its mean weighted by tokens (a decode step is one token: one flipped selection
// there counts once, not as "0 rows equal"); the caches at the end.
void print_drift_profile(const reports::ScenarioResult& r) {
  const reports::Comparison& c = r.comparisons.front();
  struct Acc {
    double prefill = -1, decode_sum = 0, decode_n = 0, worst_nmse = 0;
  };
  std::map<int, std::map<std::string, Acc>> acc;  // layer -> "component.metric"
  for (const reports::MetricRow& m : c.rows) {
    if (m.layer < 0 || m.component.rfind("compressor.", 0) == 0) continue;
    Acc& x = acc[m.layer][m.component + "." + m.metric];
    if (m.metric == "nmse") {
      x.worst_nmse = std::max(x.worst_nmse, m.value);
    } else if (m.step == 0 && m.component.rfind("cache.", 0) != 0) {
      x.prefill = m.value;
    } else {
      x.decode_sum += m.value;
      x.decode_n += 1;
    }
  }
  const auto cell = [](const std::map<std::string, Acc>& m, const std::string& k) {
    const auto it = m.find(k);
    if (it == m.end()) return std::string("      -       ");
    char b[32];
    const Acc& x = it->second;
    if (x.prefill < 0) {
      std::snprintf(b, sizeof b, "      %7.4f ", x.decode_n ? x.decode_sum / x.decode_n : 0.0);
    } else {
      std::snprintf(b, sizeof b, "%6.4f/%6.4f ", x.prefill, x.decode_n ? x.decode_sum / x.decode_n : 1.0);
    }
    return std::string(b);
  };
  std::printf("drift profile of %s (free-running; prefill / mean over decode steps):\n", r.name.c_str());
  std::printf("  layer  routing rows eq  top-k rows eq   stream bit-eq  stream nmse (max)  caches bit-eq (end)\n");
  for (const auto& [layer, m] : acc) {
    double cache = -1;
    for (const char* k : {"cache.window_kv.bit_equal_frac", "cache.compressed_kv.bit_equal_frac",
                          "cache.index_keys.bit_equal_frac"}) {
      const auto it = m.find(k);
      if (it != m.end()) cache = cache < 0 ? it->second.decode_sum : std::min(cache, it->second.decode_sum);
    }
    const auto nm = m.find("out_stream.nmse");
    std::printf("  %5d  %s  %s  %s  %17s  %19s\n", layer, cell(m, "experts.rows_equal_frac").c_str(),
                cell(m, "topk.rows_equal_frac").c_str(), cell(m, "out_stream.bit_equal_frac").c_str(),
                nm == m.end() ? "-" : std::to_string(nm->second.worst_nmse).c_str(),
                cache < 0 ? "-" : std::to_string(cache).c_str());
  }
}

int run(const AgreeArgs& a, const std::string& command_line) {
  agree::AgreeOptions o;
  DSV41_CHECK(a.mode == "teacher-forced" || a.mode == "free-running" || a.mode == "both",
              "--mode: 'teacher-forced', 'free-running' or 'both', got '", a.mode, "'");
  o.teacher_forced = a.mode != "free-running";
  o.free_running = a.mode != "teacher-forced";
  o.attribute = !a.no_attribution;
  o.backend = a.backend;
  o.progress = !a.quiet;
  if (a.backend != "ref") {
    DSV41_CHECK(a.backend.rfind("mutant:", 0) == 0, "--backend: 'ref' or 'mutant:<component>:L<layer>:S<step>', got '",
                a.backend, "'");
    defects::parse_mutation(a.backend.substr(7));  // a bad spec is refused before any work
  }
  output::VerbFiles inputs;  // outputs never alias them, nor a file of them (base/output_file.h)
  for (const std::string& d : a.dirs) inputs.input(d, "official run folder");
  runner::check_report_outputs(a.output, a.junit, inputs);
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  reports::RunReport report = agree::agree(a.dirs, o);
  runner::stamp_run_meta(report.meta, command_line);
  reports::write_report(a.output, report);
  if (!a.junit.empty()) reports::write_junit(a.junit, report);
  for (const reports::ScenarioResult& r : report.scenarios) {
    if (!r.comparisons.empty() && r.comparisons.front().mode == "free-running") print_drift_profile(r);
  }
  std::cout << reports::format_summary(report);
  for (const reports::ScenarioResult& r : report.scenarios) {  // what each comparison could compare
    for (const reports::Comparison& c : r.comparisons) {
      for (const std::string& n : c.notes) {
        if (n.rfind("coverage: ", 0) == 0 || n.rfind("teacher-forced: not run", 0) == 0) {
          std::cout << r.name << " [" << c.mode << "] " << n << "\n";
        }
      }
    }
  }
  std::cout << "report: " << a.output << (a.junit.empty() ? "" : ", junit: " + a.junit) << "\n";
  return reports::exit_code(report.verdict);
}

}  // namespace

Verb add_agree_verb(CLI::App& parent) {
  auto a = std::make_shared<AgreeArgs>();
  CLI::App* app = parent.add_subcommand(
      "agree", "the reference against official runs in the oracle folder format (golden/oracle, golden/runs/*): "
               "per step and layer, with bounds and their origin (docs/agreement.md)");
  app->add_option("oracle_dirs", a->dirs, "folders holding config.json, weights.safetensors, prefill.h5, decode.h5 "
                                          "and, for teacher-forcing, the streams (prefill_streams.h5)")
      ->required();
  app->add_option("--mode", a->mode, "teacher-forced (default), free-running or both");
  app->add_option("--backend", a->backend, "ref (default), or mutant:<component>:L<layer>:S<step>: a planted defect "
                                           "the check must find (step 0 is the prefill, k + 1 decode step k)");
  app->add_option("-o,--output", a->output, "the HDF5 report (written atomically; `dsv41 report show` reads it)");
  app->add_option("--junit", a->junit, "also write JUnit XML here");
  app->add_option("--threads", a->threads, "reference threads (default: DSV41_THREADS or the cores)")
      ->check(CLI::Range(1, 1024));
  app->add_flag("--no-attribution", a->no_attribution,
                "do not try to attribute a layer-step beyond the stream bounds (agree.h): report it as is");
  app->add_flag("-q,--quiet", a->quiet, "no progress lines");
  return {app, [a, app] {
            const std::string cmd = command_line_of(*app, "agree", "oracle_dirs");
            return run(*a, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
