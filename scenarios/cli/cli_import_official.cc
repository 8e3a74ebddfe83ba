// scenarios/cli/cli_import_official.cc
//
// dsv41 import-official RUN_DIR -o DUMP
//   Turns an official run in the oracle folder layout (golden/oracle, golden/runs/*;
//   scenarios/agree/oracle_run.h) into a port dump (docs/port-dump.md; a directory, or one HDF5
//   file when DUMP ends in ".h5") with the claim "order-variant" (scenarios/agree/official_dump.h),
//   and writes beside it DUMP.known_differences.json: the official code's known differences
//   (docs/agreement.md), one named waiver per affected (component, layer, step), and, when the
//   run's Engram token map is not the default, DUMP.token_map.txt. Prints the components written,
//   what was left out and why, the known differences, and the `dsv41 conform` command to judge it.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "reports/report.h"
#include "scenarios/agree/official_dump.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

struct ImportArgs {
  std::string run_dir, output;
};

}  // namespace

Verb add_import_official_verb(CLI::App& parent) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* app = parent.add_subcommand(
      "import-official", "turn an official run (the oracle folder layout: golden/oracle, golden/runs/*) into a port "
                         "dump claiming order-variant, with its known differences as named conform waivers "
                         "(docs/agreement.md, \"Importing an official run\")");
  app->add_option("run", a->run_dir, "the official run's folder (config.json, weights.safetensors, prefill*.h5, decode.h5)")
      ->required();
  app->add_option("-o,--output", a->output, "the dump: a new (or empty) directory, or a new file ending in .h5")->required();
  return {app, [a] {
            const std::string cmd = "dsv41 import-official " + reports::shell_quote(a->run_dir) + " -o " +
                                    reports::shell_quote(a->output);
            // The dump never lands over a file of the run (base/output_file.h, VerbFiles).
            output::VerbFiles().input(a->run_dir, "official run folder").output_directory(a->output, "port dump (-o)").check();
            const agree::OracleRun run = agree::OracleRun::open(a->run_dir);
            const agree::ImportSummary s = agree::import_official(
                run, a->output, cmd + " (official run '" + run.name() + "', tie rule " + run.tie_rule() + ")");
            std::cout << agree::format_import_summary(s);
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
