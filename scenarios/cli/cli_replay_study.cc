// `dsv41 replay-study`: the divergence that SWA bounded replay causes, resumed vs uninterrupted
// (scenarios/runner/replay_study.h, docs/replay-divergence.md).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/config_footprint.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/cli/cli.h"
#include "scenarios/runner/progress.h"
#include "scenarios/runner/replay_study.h"

namespace dsv41::scenarios::cli {

Verb add_replay_study_verb(CLI::App& parent) {
  struct Args {
    std::string config, weights, json;
    uint64_t seed = 0;
    bool seed_given = false;
    bool quiet = false;
    runner::ReplayStudyOptions study;
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("replay-study", "measure SWA bounded replay: resumed vs uninterrupted sessions");
  app->add_option("--config", a->config, "config.json path or preset (tiny, full)")->required();
  app->add_option("--weights", a->weights, "safetensors weights (default: generated from --seed)");
  seed_option(app->add_option("--seed", a->seed, "weight generator seed when no --weights is given (printed)"));
  seed_option(app->add_option("--token-seed", a->study.token_seed, "seed of the random prompt (printed)"));
  app->add_option("--length", a->study.length, "prompt tokens (default: 3 windows)")->check(CLI::PositiveNumber);
  app->add_option("--resumptions", a->study.resumptions, "resume counts to measure (default 1 2 4 8)")->delimiter(',');
  app->add_option("--steps", a->study.steps, "decode steps compared after the last resume")->check(CLI::Range(1, 64));
  app->add_option("--turns", a->study.turns, "follow-up turns, each after a resume")->check(CLI::Range(0, 64));
  app->add_option("--turn-len", a->study.turn_len, "tokens per follow-up turn")->check(CLI::Range(1, 4096));
  app->add_option("--json", a->json, "also write the results as JSON to this file");
  app->add_flag("-q,--quiet", a->quiet, "no progress on stderr (a bar on a terminal, else lines)");
  return {app, [a] {
            output::VerbFiles()  // the JSON never replaces an input (base/output_file.h)
                .input(a->config, "config (--config)")
                .input(a->weights, "weights (--weights)")
                .output(a->json, "replay-study JSON (--json)")
                .check();
            const reference::ModelConfig c = reference::load_config(a->config);
            reference::checkpoint::ModelWeights w;
            if (!a->weights.empty()) {
              w = reference::checkpoint::ModelWeights::load(a->weights, c);
            } else {
              // Generated weights: their size and the caches' against this machine first (issue 35).
              reference::check_fits_machine(c, "config '" + a->config + "'");
              std::cerr << "replay-study: generated weights, seed " << a->seed << "\n";
              w = reference::checkpoint::ModelWeights::load(
                  reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated weights",
                                                                       reference::checkpoint::generate_weights(c, a->seed)),
                  c);
            }
            std::cerr << "replay-study: prompt token seed " << a->study.token_seed << "\n";
            reference::model::Model model(c, std::move(w), reference::model::default_token_map(c));
            runner::Progress progress("replay-study", 0, a->quiet);
            a->study.progress = [&progress](int done, int total, const std::string& what) {
              progress.set_total(total);
              if (done < total) progress.update(done, "case " + std::to_string(done + 1) + "/" + std::to_string(total) + ": " + what);
            };
            const std::vector<runner::ReplayStepResult> r = runner::run_replay_study(model, a->study);
            progress.finish(std::to_string(r.size()) + " rows");
            std::cout << runner::replay_study_markdown(r);
            if (!a->json.empty()) {
              const std::string text = runner::replay_study_json(r);
              output::write_file_atomically(a->json, "replay-study JSON", text.data(), text.size());
            }
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
