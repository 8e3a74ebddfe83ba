// scenarios/cli/cli_help.cc: what every verb's --help ends with (docs/cli.md): its exit codes and
// one example that runs from a checkout (or an install, with the data path of `dsv41 --version`).
// The options' defaults are shown by main.cc (every option captures its default).
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

struct Help {
  const char* exits;    // beyond "2 bad arguments or input"
  const char* example;
};

const std::map<std::string, Help>& verb_help() {
  static const std::map<std::string, Help> h = {
      {"bytes", {"0 printed", "dsv41 bytes --config full"}},
      {"selfcheck", {"0 every golden value matches, 1 a mismatch", "dsv41 selfcheck"}},
      {"forward", {"0 written", "dsv41 forward --config tiny --weights golden/oracle/weights.safetensors --prompt 1,2,3 --decode 4 -o out.h5"}},
      {"weights", {"0 written (or --check: valid)", "dsv41 weights --config tiny --seed 7 -o w.safetensors"}},
      {"replay-study", {"0 measured", "dsv41 replay-study --config tiny --weights golden/oracle/weights.safetensors --resumptions 1 2 --json study.json"}},
      {"run", {"0 pass, 1 a divergence beyond tolerance, 3 inconclusive (evidence missing)",
               "dsv41 run cold_prefill --sides ref,ref-order:pairwise --mode teacher-forced -o report.h5"}},
      {"report", {"0 done (check: valid; diff: no regression), 1 check: a schema violation / diff: a checked item regressed",
                  "dsv41 report show report.h5"}},
      {"agree", {"0 pass, 1 a bound exceeded, 3 inconclusive", "dsv41 agree golden/oracle -o agree.h5"}},
      {"conform", {"0 pass, 1 a component beyond its bound, 3 coverage too thin (a --require component missing)",
                   "dsv41 conform dump_dir --config tiny --weights golden/oracle/weights.safetensors --require attn_out --junit j.xml"}},
      {"selftest", {"0 the goal met, 1 missed (or a false alarm)", "dsv41 selftest --small-bugs -q"}},
      {"exact", {"0 every bound holds, 1 one exceeded", "dsv41 exact --backend ref --sizes tiny"}},
      {"vectors", {"0 written", "dsv41 vectors -o vec --sizes tiny --reference-port port"}},
      {"sweep", {"0 pass, 1 an item failed, 3 inconclusive", "dsv41 sweep examples/sweep/plan.json -o sweep.h5   (mpirun -np 2 ... as a user with MPI)"}},
      {"layer-config", {"0 written", "dsv41 layer-config --kind swa -o swa.json"}},
      {"import-official", {"0 written", "dsv41 import-official golden/runs/w16_r2early_p520 -o w16.dump"}},
  };
  return h;
}

}  // namespace

void add_help_footers(CLI::App& root) {
  for (CLI::App* verb : root.get_subcommands([](const CLI::App*) { return true; })) {
    const auto it = verb_help().find(verb->get_name());
    DSV41_CHECK(it != verb_help().end(), "cli_help: verb '", verb->get_name(), "' has no help footer");
    verb->footer(std::string("\nExit codes: ") + it->second.exits + "; 2 bad arguments or input, or an error " +
                 "(the file and field named). docs/cli.md.\nExample:\n  " + it->second.example + "\n");
  }
}

}  // namespace dsv41::scenarios::cli
