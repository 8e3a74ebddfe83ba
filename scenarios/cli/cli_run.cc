// dsv41 run: replays scenarios on two sides and writes the HDF5 divergence report
// (docs/scenarios.md, docs/report-schema.md). Exit codes: 0 pass (or measured only), 1 a
// divergence beyond tolerance, 2 bad input or an error, 3 inconclusive (missing evidence).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>

#include "base/data_dir.h"
#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/config.h"
#include "reference/ops/numerics.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/cli/cli.h"
#include "scenarios/runner/run_meta.h"
#include "scenarios/runner/progress.h"
#include "scenarios/runner/id_list.h"
#include "scenarios/runner/keep.h"
#include "scenarios/runner/layer_kinds.h"
#include "scenarios/runner/runner.h"
#include "base/sha256.h"

namespace dsv41::scenarios::cli {
namespace {

struct RunArgs {
  std::vector<std::string> scenarios;
  std::string sides;
  std::vector<std::string> modes;
  std::string config = "tiny";
  std::string weights;
  uint64_t weight_seed = 0;
  std::optional<uint64_t> seed;
  std::string token_map;
  std::string output = "dsv41-report.h5";
  std::string junit;
  int64_t stop_after_step = -1;
  std::string save_tensors;
  int threads = 0;
  bool list = false;
  bool quiet = false;
  int rows = 20;
  bool packed_experts = false;  // F4 weights held packed (reference/checkpoint/weights.h pack_fp4)
  bool time_sides = false;      // each comparison's wall time per side on stderr
  std::optional<int64_t> replay;
  std::optional<uint64_t> replay_seed;
};

constexpr const char* kDefaultOracleWeights = "golden/oracle/weights.safetensors";  // in the repository

std::string default_oracle_weights() {
  return dsv41::data::file(kDefaultOracleWeights);
}


std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) out.push_back(part);
  return out;
}

int run(const RunArgs& a, const std::string& command_line) {
  if (a.list) {
    std::cout << "built-in scenarios (scenarios/suite/):\n";
    for (const std::string& n : runner::builtin_scenario_names()) {
      const runner::Scenario s = runner::builtin_scenario(n);
      std::cout << "  " << n << " [" << s.kind << "]: " << s.description << "\n";
    }
    std::cout << "backends:\n";
    for (const auto& [n, d] : runner::backend_catalog()) std::cout << "  " << n << ": " << d << "\n";
    std::cout << "cache paths: cold, full, global, decoder:N, alone (docs/scenarios.md)\n";
    return runner::kExitOk;
  }
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  const auto t0 = std::chrono::steady_clock::now();
  // 1. Everything cheap to check, before the weights are read.
  runner::RunOptions opt;
  if (!a.sides.empty()) {
    opt.sides = split_commas(a.sides);
    DSV41_CHECK(opt.sides.size() == 2, "--sides '", a.sides, "': expected two sides A,B");
    for (const std::string& s : opt.sides) runner::parse_side(s);
  }
  for (const std::string& m : a.modes) {
    for (const std::string& x : split_commas(m)) {
      DSV41_CHECK(x == "free-running" || x == "teacher-forced", "--mode '", x,
                  "': not free-running or teacher-forced");
      opt.modes.push_back(x);
    }
  }
  opt.stop_after_step = a.stop_after_step;
  opt.time_sides = a.time_sides;
  opt.replay_extra = a.replay;
  opt.replay_seed = a.replay_seed;
  if (!a.save_tensors.empty()) opt.save_tensors = runner::parse_focus(a.save_tensors);
  std::vector<runner::Scenario> scenarios;
  std::set<std::string> names;
  for (const std::string& n : a.scenarios.empty() ? runner::builtin_scenario_names() : a.scenarios) {
    scenarios.push_back(runner::load_scenario(n));
    if (a.seed) scenarios.back().seed = *a.seed;
    DSV41_CHECK(names.insert(scenarios.back().name).second, "scenario '", n, "': a second scenario named '",
                scenarios.back().name, "' (names are the report's group names)");
    reports::check_scenario_name(scenarios.back().name);  // refused now, not after the run
  }
  const std::filesystem::path out_dir = std::filesystem::path(a.output).parent_path();
  DSV41_CHECK(out_dir.empty() || std::filesystem::is_directory(out_dir), "-o '", a.output, "': directory '",
              out_dir.string(), "' does not exist");
  output::VerbFiles inputs;  // outputs never alias them (base/output_file.h)
  for (const std::string& n : a.scenarios) inputs.input(n, "scenario");
  inputs.input(a.weights, "weights (--weights)").input(a.config, "config (--config)").input(a.token_map, "token map (--token-map)");
  runner::check_report_outputs(a.output, a.junit, inputs);
  const reference::ModelConfig c = reference::load_config(a.config);
  std::vector<int64_t> map = a.token_map.empty() ? reference::model::default_token_map(c)
                                                 : runner::parse_id_list("@" + a.token_map, "--token-map");
  DSV41_CHECK(static_cast<int64_t>(map.size()) == c.vocab_size, "--token-map '", a.token_map, "': ", map.size(),
              " ids, but the config has a vocab of ", c.vocab_size);

  // Every scenario's plan (pairs, modes, tolerance rules, decoder rows, tokens), checked before
  // any work: bad input costs nothing and leaves no half run.
  int copies = 1;  // weight copies alive at once: the run's, and one per backend of a comparison
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  for (const runner::Scenario& s : scenarios) {
    const runner::ScenarioPlan plan = plan_scenario(s, c, opt);
    // A comparison that captures index_scores materializes each index layer's score matrix of a step
    // (docs/scale.md); a sampled run's reference holds [T, N] uint8 candidate masks instead (a few at
    // once), about as much: a chunk whose fp32 matrix cannot fit in half of this machine's memory is
    // refused before any work.
    DSV41_CHECK(memory <= 0 || static_cast<double>(plan.largest_scores_bytes) <= memory / 2, "scenario '", s.name,
                "': step ", plan.largest_scores_step, " would materialize an indexer score matrix of ",
                plan.largest_scores_bytes / 1000000000, " GB (fp32 [chunk, reachable keys]); this machine has ",
                static_cast<int64_t>(memory / 1e9), " GB: use smaller chunks");
    for (const runner::Pair& p : plan.pairs) {
      const int per_side_a = p.a.path == runner::CachePath::kAlone ? plan.sessions : 1;
      const int per_side_b = p.b.path == runner::CachePath::kAlone ? plan.sessions : 1;
      copies = std::max(copies, 1 + per_side_a + per_side_b);
    }
  }
  // The reference holds every weight as fp32 in each copy (F4 weights as 4-bit codes with
  // --packed-experts, Engram tables as bytes): refuse a config this machine cannot hold instead
  // of exhausting its memory.
  {
    const double need = copies * runner::weight_bytes(c, a.packed_experts).held;
    const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    DSV41_CHECK(have <= 0 || need <= have, "config '", a.config, "': the CPU reference would hold ",
                static_cast<int64_t>(need / 1e9), " GB of fp32 weights (", copies, " copies: the run's and one per backend), "
                "this machine has ", static_cast<int64_t>(have / 1e9), " GB; use a smaller config");
  }

  // 2. Weights: given, the oracle's for the tiny config, or generated (seed printed).
  reports::RunReport report;
  reports::RunMeta& meta = report.meta;
  std::string weights = a.weights;
  if (weights.empty() && a.config == "tiny" && std::filesystem::exists(default_oracle_weights())) {
    weights = default_oracle_weights();
  }
  runner::BackendResources res{c, {}, map};
  if (!weights.empty()) {
    res.weights = reference::checkpoint::ModelWeights::load(weights, c, a.packed_experts);
    // The path as given (a relative one stays relative, so the same command gives the same report
    // on any machine), the oracle's default as its path in the repository; the SHA-256 identifies
    // the weights whatever the path.
    meta.weights = "file:" + (a.weights.empty() ? std::string(kDefaultOracleWeights) : a.weights);
    meta.weights_sha256 = sha256_file_hex(weights);
  } else {
    res.weights = reference::checkpoint::ModelWeights::load(
        reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated weights",
                                                             reference::checkpoint::generate_weights(c, a.weight_seed)),
        c, a.packed_experts);
    meta.weights = "generated:seed=" + std::to_string(a.weight_seed);
    meta.seeds["weights"] = a.weight_seed;
  }
  meta.config_name = a.config;
  meta.config_hash = reference::config_hash(c);
  meta.config_json = reference::to_json_string(c);
  meta.sides = opt.sides;
  runner::stamp_run_meta(meta, command_line);
  std::cerr << "dsv41 run: config " << a.config << " (hash " << meta.config_hash << "), weights " << meta.weights
            << ", " << scenarios.size() << " scenario(s), " << meta.threads << " thread(s)\n";

  // 3. The rerun line of a failure repeats what selects the model.
  std::ostringstream prefix;
  prefix << "dsv41 run --config " << reports::shell_quote(a.config);
  if (!a.weights.empty()) prefix << " --weights " << reports::shell_quote(a.weights);
  if (weights.empty()) prefix << " --weight-seed " << a.weight_seed;
  if (!a.token_map.empty()) prefix << " --token-map " << reports::shell_quote(a.token_map);
  if (a.packed_experts) prefix << " --packed-experts";
  opt.rerun_prefix = prefix.str();
  // Progress per event and step (scenarios/runner/progress.h): the unit is a scenario, a comparison its
  // share of it, an event its share of that.
  runner::Progress progress("run", static_cast<double>(scenarios.size()), a.quiet);
  size_t scenario_index = 0;
  if (progress.enabled()) {
    opt.on_progress = [&progress, &scenario_index, n = scenarios.size()](const runner::RunPosition& p) {
      const double c = static_cast<double>(p.comparisons), e = static_cast<double>(std::max<size_t>(1, p.events));
      const double done = static_cast<double>(scenario_index) +
                          (static_cast<double>(p.comparison) + static_cast<double>(p.event) / e) / c;
      std::string what = "scenario " + std::to_string(scenario_index + 1) + "/" + std::to_string(n) + " " + p.scenario +
                         " [" + p.pair + ", " + p.mode + "] comparison " + std::to_string(p.comparison + 1) + "/" +
                         std::to_string(p.comparisons) + " event " + std::to_string(p.event + 1) + "/" +
                         std::to_string(p.events) + " step " + std::to_string(p.step);
      if (!p.phase.empty()) what += " (" + p.phase + ")";
      progress.update(done, what);
    };
  }
  for (const runner::Scenario& s : scenarios) {
    meta.seeds["scenario:" + s.name] = s.seed;
    progress.note("dsv41 run: scenario " + s.name + " (seed " + std::to_string(s.seed) + ")");
    runner::RunOptions o = opt;
    if (a.seed) o.rerun_prefix += " --seed " + std::to_string(*a.seed);
    try {
      report.scenarios.push_back(run_scenario(s, res, o));
    } catch (const std::exception& e) {
      // One scenario's failure is recorded as its verdict; the others and the report survive.
      reports::ScenarioResult failed = scenario_result_header(s);
      failed.verdict = reports::Verdict::kError;
      failed.error = e.what();
      report.scenarios.push_back(std::move(failed));
    }
    progress.note("dsv41 run: scenario " + s.name + ": " + reports::name(report.scenarios.back().verdict));
    ++scenario_index;
  }
  progress.finish(std::to_string(scenarios.size()) + " scenarios");
  meta.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.time_sides) {  // the process's peak resident memory (Linux VmHWM), weights included
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmHWM:", 0) != 0) continue;
      const size_t v = line.find_first_not_of(" \t", 6);
      std::cerr << "dsv41 run: peak host memory " << (v == std::string::npos ? line.substr(6) : line.substr(v)) << "\n";
    }
    std::cerr << "dsv41 run: wall " << meta.seconds << " s\n";
  }
  report.verdict = reports::roll_up(report.scenarios);
  reports::write_report(a.output, report);
  if (!a.junit.empty()) reports::write_junit(a.junit, report);
  std::cout << reports::format_summary(report, a.rows);
  std::cout << "report: " << a.output << (a.junit.empty() ? "" : ", junit: " + a.junit) << "\n";
  return reports::exit_code(report.verdict);
}

}  // namespace

std::string command_line_of(const CLI::App& app, const std::string& verb, const std::string& positional) {
  std::string cmd = "dsv41 " + verb;
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0 || o->get_name() == "--help") continue;
    if (o->get_type_size() == 0) {  // a flag: no value
      cmd += " " + o->get_name();
      continue;
    }
    for (const std::string& v : o->as<std::vector<std::string>>()) {
      cmd += (o->get_name() == positional ? " " : " " + o->get_name() + " ") + reports::shell_quote(v);
    }
  }
  return cmd;
}

Verb add_run_verb(CLI::App& parent) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand(
      "run", "replay scenarios on two sides and write the HDF5 divergence report (default: the built-in suite "
             "on the tiny config, CPU reference)");
  app->add_option("scenarios", a->scenarios, "built-in scenario names or scenario .json files (default: the suite)");
  app->add_option("--sides", a->sides,
                  "A,B: the pair to run instead of each scenario's pairs; a side is <backend>[@<cache path>] "
                  "(see --list)");
  app->add_option("--mode", a->modes, "free-running and/or teacher-forced (default: the scenario's modes)")
      ->delimiter(',');
  app->add_option("--config", a->config, "config.json path or preset (tiny, full)");
  app->add_option("--weights", a->weights,
                  "safetensors weights (default for tiny: the official oracle weights; otherwise generated)");
  seed_option(app->add_option("--weight-seed", a->weight_seed, "seed of generated weights (printed)"));
  seed_option(app->add_option("--seed", a->seed, "override every scenario's token seed (each one is printed)"));
  app->add_option("--token-map", a->token_map, "Engram compressed id of every vocab entry, one per line");
  app->add_option("-o,--output", a->output, "the HDF5 report (written atomically)");
  app->add_option("--junit", a->junit, "also write JUnit XML here");
  app->add_option("--stop-after-step", a->stop_after_step, "stop each comparison after this step")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app->add_option("--save-tensors", a->save_tensors,
                  "keep both sides' tensors of step=S,layer=L,component=C (any subset) in the report");
  app->add_option("--replay", a->replay,
                  "sampled replay (docs/scale.md): side B replays only the required steps plus K drawn ones, "
                  "each from side A's state, teacher-forced")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  seed_option(app->add_option("--replay-seed", a->replay_seed,
                              "seed of the sampled replay's draw (default: from the scenario seed; printed)"));
  app->add_option("--threads", a->threads, "reference threads (default: DSV41_THREADS or the cores)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--rows", a->rows, "worst metrics shown in the summary")->check(CLI::Range(0, 100000));
  app->add_flag("--packed-experts", a->packed_experts,
                "hold the F4 weights (routed experts) packed, 4 bits a value: the same bits, 1/8 of the memory");
  app->add_flag("--time-sides", a->time_sides, "print each comparison's wall time per side (setup, steps) on stderr");
  app->add_flag("--list", a->list, "list the built-in scenarios, backends and cache paths, then exit");
  app->add_flag("-q,--quiet", a->quiet, "no progress lines");
  return {app, [a, app] {
            const std::string cmd = command_line_of(*app, "run", "scenarios");
            return run(*a, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
