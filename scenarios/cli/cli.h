// scenarios/cli/cli.h
//
// The verbs of the `dsv41` tool. Each verb file adds one subcommand to the top-level CLI11 app
// and returns what to run when that subcommand was given; main.cc parses and dispatches.
//
// Exit codes (docs/cli.md): 0 ok, 1 a check failed, 2 bad arguments or bad input, 3 inconclusive
// (`dsv41 run`: evidence missing). Verbs throw
// dsv41::Error for bad input; main.cc prints it as "dsv41: error: ..." and exits 2.
//
// Example:
//   CLI::App app{"dsv41"};
//   Verb bytes = add_bytes_verb(app);
//   app.parse(argc, argv);
//   if (bytes.app->parsed()) return bytes.run();
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "scenarios/runner/run_meta.h"  // exit codes, stamp_run_meta, check_report_outputs

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace dsv41::scenarios::cli {

// Makes a seed option accept only a non-negative decimal integer: CLI11 would read "-1" into an
// unsigned seed as 2^64-1. Returns the option (scenarios/cli/cli_weights.cc).
CLI::Option* seed_option(CLI::Option* option);

// Makes a number option accept only a finite value in [lo, hi] ((lo, hi] when lo_open): CLI11's
// Range lets NaN through (`sweep --item-timeout nan` killed every item). Returns the option
// (scenarios/cli/cli_weights.cc).
CLI::Option* finite_option(CLI::Option* option, double lo, double hi, bool lo_open = false);

struct Verb {
  CLI::App* app = nullptr;   // the subcommand
  std::function<int()> run;  // runs it; returns the exit code
};

// Every verb's --help footer: its exit codes and one example (scenarios/cli/cli_help.cc); a verb
// without one is a dsv41::Error (a test runs every verb's --help).
void add_help_footers(CLI::App& root);

Verb add_bytes_verb(CLI::App& parent);      // scenarios/cli/cli_bytes.cc
Verb add_selfcheck_verb(CLI::App& parent);  // scenarios/cli/cli_selfcheck.cc
Verb add_forward_verb(CLI::App& parent);    // scenarios/cli/cli_forward.cc
Verb add_weights_verb(CLI::App& parent);    // scenarios/cli/cli_weights.cc
Verb add_replay_study_verb(CLI::App& parent);  // scenarios/cli/cli_replay_study.cc
Verb add_run_verb(CLI::App& parent);        // scenarios/cli/cli_run.cc
Verb add_report_verb(CLI::App& parent);        // scenarios/cli/cli_report.cc
Verb add_agree_verb(CLI::App& parent);         // scenarios/cli/cli_agree.cc
Verb add_conform_verb(CLI::App& parent);       // scenarios/cli/cli_conform.cc
Verb add_selftest_verb(CLI::App& parent);      // scenarios/cli/cli_selftest.cc
Verb add_exact_verb(CLI::App& parent);         // scenarios/cli/cli_exact.cc
Verb add_vectors_verb(CLI::App& parent);       // scenarios/cli/cli_vectors.cc
Verb add_sweep_verb(CLI::App& parent);         // scenarios/cli/cli_sweep.cc (library dsv41_sweep)
Verb add_layer_config_verb(CLI::App& parent);  // scenarios/cli/cli_layer_config.cc
Verb add_import_official_verb(CLI::App& parent);  // scenarios/cli/cli_import_official.cc

// `dsv41 conform --vectors DIR --port-out PORT_DIR` (scenarios/vectors/vectors.h): judges a port's outputs
// of the conformance vectors (require: a partial port's ops, comma-separated; "" every op), writes the
// report (and JUnit: one testcase per case), prints one line per case; the exit code.
int run_conform_vectors(const std::string& vectors_dir, const std::string& port_dir, const std::string& only,
                        const std::string& require,
                        const std::string& output, const std::string& junit, const std::string& command_line);

// The command line a verb was given, rebuilt from its parsed options (for a report's metadata and
// a rerun line): "dsv41 <verb>", then each option given as written ("--name value", values quoted
// where a shell needs it; flags without a value), the positional option `positional` bare.
std::string command_line_of(const CLI::App& app, const std::string& verb, const std::string& positional);

// `dsv41 exact` with its arguments parsed (backends "ref" / "cuda-exact" / "cuda"); writes the table to out.
int run_exact(std::ostream& out, const std::vector<std::string>& backends, const std::string& sizes, uint64_t seed,
              const std::string& h5_path);

// The format self-check: one line per check, then "selfcheck: N passed, M failed".
// Returns kExitOk or kExitCheckFailed. inject_failure adds one failing check (for tests).
int run_selfcheck(std::ostream& out, bool inject_failure = false);

}  // namespace dsv41::scenarios::cli
