// bench/dspark_acceptance.cc: dsv41_dspark_acceptance, acceptance statistics of DSpark speculative
// decoding on random-weight configs and the effect of the verify-length policies
// (bench/dspark_acceptance.h; results and their reading in docs/dspark.md, Part 3).
//
//   dsv41_dspark_acceptance --config tiny --weights-seeds 0,1 --prompts 3 --tokens 24
//       --temperature 0,1 --policies fixed:1,fixed:5,threshold:0.5,survival:0.3 --json out.json
//
// Exit status: 0 ok; 1 the greedy sanity check failed (at temperature 0 the speculative tokens
// must equal plain greedy decoding's, for every policy and prompt); 2 bad input or another error.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/dspark_acceptance.h"
#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/config.h"
#include "reference/ops/numerics.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::bench {
namespace {

using nlohmann::json;

struct Args {
  std::string config = "tiny";
  std::vector<uint64_t> weight_seeds = {0, 1, 2};
  std::string weights;  // a safetensors file instead of generated weights
  int64_t prompts = 6;
  int64_t prompt_len = 16;
  int64_t tokens = 32;
  uint64_t seed = 0;
  std::vector<double> temperatures = {0.0, 1.0};
  double top_p = 1.0;
  std::vector<std::string> policies = {"fixed:1", "fixed:3", "fixed:5", "threshold:0.3",
                                       "threshold:0.5", "survival:0.1", "survival:0.3"};
  int threads = 0;
  std::string json_path;
  bool plant_accept_one_more = false;  // the greedy check's self-test: must fail
};

// One weights choice: a label and how to build it.
struct WeightsSource {
  std::string label;  // "seed:N" or "file:NAME"
  bool generated = true;
  uint64_t seed = 0;
};

reference::checkpoint::ModelWeights load_weights(const WeightsSource& w, const Args& a, const reference::ModelConfig& c) {
  if (!w.generated) return reference::checkpoint::ModelWeights::load(a.weights, c);
  return reference::checkpoint::ModelWeights::load(
      reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated weights (seed " + std::to_string(w.seed) + ")",
                                                            reference::checkpoint::generate_weights(c, w.seed)),
      c);
}

// A number from a summary: "-" for null (an undefined rate).
std::string num(const json& v, int digits = 3) {
  if (v.is_null()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v.get<double>());
  return buf;
}

std::string temp_label(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", t);
  return buf;
}

void print_header(int64_t block) {
  std::printf("%-10s %-5s %-15s %6s %6s %6s %8s %7s", "weights", "T", "policy", "rounds", "k", "m", "tok/step",
              "wasted");
  for (int64_t i = 1; i <= block; ++i) std::printf("  acc@%-2lld", static_cast<long long>(i));
  std::printf(" %7s %7s %7s %7s %8s\n", "brier", "ece", "S_k", "all_k", "s/round");
}

void print_row(const std::string& weights, double t, const std::string& policy, const json& s) {
  std::printf("%-10s %-5s %-15s %6lld %6s %6s %8s %7s", weights.c_str(), temp_label(t).c_str(), policy.c_str(),
              static_cast<long long>(s["rounds"].get<int64_t>()), num(s["mean_k"], 2).c_str(),
              num(s["mean_m"], 3).c_str(), num(s["tokens_per_target_step"]).c_str(),
              num(s["wasted_rows_per_round"], 2).c_str());
  for (const json& p : s["positions"]) std::printf("  %6s", num(p["acceptance_rate"]).c_str());
  const json& cal = s["calibration"];
  const json& sk = s["survival"]["at_k"];
  std::printf(" %7s %7s %7s %7s %8s\n", num(cal["brier"]).c_str(), num(cal["ece"]).c_str(),
              num(sk["mean_predicted"]).c_str(), num(sk["realised"]).c_str(), num(s["seconds_per_round"], 3).c_str());
}

// Per temperature, pooled over weights and policies: the calibration bins, the survival by depth
// and the acceptance against its chance expectations.
void print_pooled_by_temperature(double t, const json& s, int64_t vocab) {
  std::printf("\n== T = %s, pooled over weights and policies ==\n", temp_label(t).c_str());
  const json& acc = s["acceptance"];
  std::printf("decided drafts %s: acceptance %s; expected by the rule: mean sum_v min(p_t, p_d) %s, mean "
              "min(1, p_t/p_d) of the drawn drafts %s; unrelated pairs' overlap %s; 1/V = %.5f\n",
              num(acc["decided"], 0).c_str(), num(acc["rate"], 4).c_str(), num(acc["expected"], 4).c_str(),
              num(acc["mean_accept_prob"], 4).c_str(),
              num(acc["unrelated_overlap"], 4).c_str(), 1.0 / static_cast<double>(vocab));
  std::printf("argmax marginals: %s distinct target argmax (effective %s), %s distinct draft argmax; "
              "independent match of the marginals sum_v f_t f_d = %s\n",
              num(acc["distinct_target_argmax"], 0).c_str(), num(acc["target_argmax_effective_count"], 1).c_str(),
              num(acc["distinct_draft_argmax"], 0).c_str(), num(acc["argmax_marginal_match"], 4).c_str());
  std::printf("%-6s %8s %8s %9s %9s %9s %9s %9s\n", "draft", "decided", "rate", "expected", "unrelated", "conf",
              "max p_t", "max p_d");
  for (const json& p : s["positions"]) {
    std::printf("%-6lld %8s %8s %9s %9s %9s %9s %9s\n", static_cast<long long>(p["draft"].get<int64_t>()),
                num(p["decided"], 0).c_str(), num(p["acceptance_rate"], 4).c_str(),
                num(p["expected_acceptance"], 4).c_str(), num(p["unrelated_overlap"], 4).c_str(),
                num(p["mean_confidence"]).c_str(), num(p["mean_max_p_target"]).c_str(),
                num(p["mean_max_p_draft"]).c_str());
  }
  const json& cal = s["calibration"];
  std::printf("calibration of c_i (pairs %s): Brier %s, ECE %s\n", num(cal["pairs"], 0).c_str(),
              num(cal["brier"], 4).c_str(), num(cal["ece"], 4).c_str());
  std::printf("  %-11s %8s %10s %9s %12s\n", "bin", "count", "predicted", "realised", "accept_prob");
  for (const json& b : cal["bins"]) {
    if (b["count"].get<double>() == 0) continue;
    std::printf("  [%.1f, %.1f) %8s %10s %9s %12s\n", b["lo"].get<double>(), b["hi"].get<double>(),
                num(b["count"], 0).c_str(), num(b["mean_predicted"], 4).c_str(), num(b["realised_rate"], 4).c_str(),
                num(b["mean_accept_prob"], 4).c_str());
  }
  std::printf("prefix survival: %-6s %8s %10s %9s\n", "depth", "rounds", "mean S_j", "m >= j");
  for (const json& d : s["survival"]["depths"]) {
    std::printf("                  %-6lld %8s %10s %9s\n", static_cast<long long>(d["depth"].get<int64_t>()),
                num(d["rounds"], 0).c_str(), num(d["mean_predicted"], 4).c_str(), num(d["realised"], 4).c_str());
  }
}

int run(const Args& a, const std::string& command_line) {
  const reference::ModelConfig c = reference::load_config(a.config);
  DSV41_CHECK(c.n_mtp_layers > 0, "config '", a.config, "': no DSpark blocks (n_mtp_layers = 0), nothing to draft");
  DSV41_CHECK(a.prompts >= 1 && a.prompt_len >= 1 && a.tokens >= 2, "--prompts ", a.prompts, ", --prompt-len ",
              a.prompt_len, ", --tokens ", a.tokens, ": need at least 1 prompt of 1 token and 2 tokens generated");
  DSV41_CHECK(a.top_p > 0 && a.top_p <= 1, "--top-p ", a.top_p, ": must be in (0, 1]");
  for (double t : a.temperatures) DSV41_CHECK(t >= 0 && std::isfinite(t), "--temperature ", t, ": must be >= 0");
  std::vector<reference::model::VerifyPolicy> policies;
  for (const std::string& p : a.policies) policies.push_back(reference::model::VerifyPolicy::parse(p));
  if (a.threads > 0) reference::set_reference_threads(a.threads);

  std::vector<WeightsSource> sources;
  if (!a.weights.empty()) {
    sources.push_back({"file:" + std::filesystem::path(a.weights).filename().string(), false, 0});
  } else {
    DSV41_CHECK(!a.weight_seeds.empty(), "--weights-seeds: give at least one seed (or --weights FILE)");
    for (uint64_t s : a.weight_seeds) sources.push_back({"seed:" + std::to_string(s), true, s});
  }
  const std::vector<std::vector<int64_t>> prompts = random_prompts(c, a.prompts, a.prompt_len, a.seed);

  std::printf("dsv41_dspark_acceptance (git %s)\n%s\n", DSV41_GIT_COMMIT_STRING, command_line.c_str());
  std::printf("config %s (hash %s): vocab %lld, DSpark block %lld, window %lld; %zu weights, %lld prompts of %lld "
              "tokens, %lld tokens each, top_p %g, %d reference threads\n",
              a.config.c_str(), reference::config_hash(c).c_str(), static_cast<long long>(c.vocab_size),
              static_cast<long long>(c.dspark_block_size), static_cast<long long>(c.window_size), sources.size(),
              static_cast<long long>(a.prompts), static_cast<long long>(a.prompt_len),
              static_cast<long long>(a.tokens), a.top_p, reference::reference_threads());
  std::printf("seed S = %llu (--seed); %s\n", static_cast<unsigned long long>(a.seed), seed_derivation_text().c_str());
  std::printf("e.g. %s prompt 0 round 0: draft seed %llu, accept seed %llu\n\n", sources.front().label.c_str(),
              static_cast<unsigned long long>(derive_seed(a.seed, Stream::kDraft, sources.front().seed, 0, 0)),
              static_cast<unsigned long long>(derive_seed(a.seed, Stream::kAccept, sources.front().seed, 0, 0)));

  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  json runs = json::array(), checks = json::array();
  std::map<std::pair<size_t, size_t>, AcceptanceStats> pooled;  // (temperature, policy) over weights
  std::map<size_t, AcceptanceStats> by_temperature;             // temperature over weights and policies
  int64_t greedy_checked = 0, greedy_mismatches = 0;
  print_header(c.dspark_block_size);
  for (const WeightsSource& w : sources) {
    if (w.generated) std::fprintf(stderr, "[%7.1fs] weights seed %llu\n", elapsed(), static_cast<unsigned long long>(w.seed));
    const reference::model::Model model(c, load_weights(w, a, c), reference::model::default_token_map(c));
    for (size_t ti = 0; ti < a.temperatures.size(); ++ti) {
      const double t = a.temperatures[ti];
      std::vector<std::vector<int64_t>> plain;  // [prompts][tokens] greedy reference at T = 0
      if (t == 0) {
        for (const std::vector<int64_t>& p : prompts) plain.push_back(plain_greedy(model, p, a.tokens));
      }
      for (size_t pi = 0; pi < policies.size(); ++pi) {
        DecodeSetup setup;
        setup.model = &model;
        setup.tokens = a.tokens;
        setup.seed = a.seed;
        setup.weights_seed = w.seed;
        if (a.plant_accept_one_more) setup.defect = scenarios::defects::RoundDefect::kAcceptOneMore;
        setup.sampling = {t, a.top_p};
        setup.policy = policies[pi];
        AcceptanceStats stats(c.dspark_block_size);
        std::vector<std::vector<int64_t>> generated;  // [prompts][tokens]
        for (size_t p = 0; p < prompts.size(); ++p) {
          generated.push_back(speculative_generate(setup, prompts[p], static_cast<int64_t>(p), stats));
          const std::vector<int64_t>& got = generated.back();
          if (t != 0) continue;
          ++greedy_checked;
          size_t first_diff = 0;
          while (first_diff < got.size() && got[first_diff] == plain[p][first_diff]) ++first_diff;
          if (first_diff < got.size()) {
            ++greedy_mismatches;
            std::fprintf(stderr, "greedy check FAILED: %s %s prompt %zu: token %zu is %lld speculatively, %lld plain\n",
                         w.label.c_str(), a.policies[pi].c_str(), p, first_diff,
                         static_cast<long long>(got[first_diff]), static_cast<long long>(plain[p][first_diff]));
            checks.push_back({{"weights", w.label}, {"policy", a.policies[pi]}, {"prompt", p},
                              {"first_difference", first_diff}});
          }
        }
        const json s = stats.summarize();
        print_row(w.label, t, a.policies[pi], s);
        std::fflush(stdout);
        runs.push_back({{"weights", w.label}, {"temperature", t}, {"policy", a.policies[pi]}, {"summary", s},
                        {"generated", generated}});
        pooled[{ti, pi}].merge(stats);
        by_temperature[ti].merge(stats);
      }
    }
    std::fprintf(stderr, "[%7.1fs] %s done\n", elapsed(), w.label.c_str());
  }

  json pooled_json = json::array(), by_t_json = json::array();
  std::printf("\n== pooled over the %zu weights ==\n", sources.size());
  print_header(c.dspark_block_size);
  for (const auto& [key, stats] : pooled) {
    const json s = stats.summarize();
    print_row("all", a.temperatures[key.first], a.policies[key.second], s);
    pooled_json.push_back({{"temperature", a.temperatures[key.first]}, {"policy", a.policies[key.second]},
                           {"summary", s}});
  }
  for (const auto& [ti, stats] : by_temperature) {
    const json s = stats.summarize();
    print_pooled_by_temperature(a.temperatures[ti], s, c.vocab_size);
    by_t_json.push_back({{"temperature", a.temperatures[ti]}, {"summary", s}});
  }
  const bool greedy_ok = greedy_mismatches == 0;
  std::printf("\ngreedy check (T = 0: speculative tokens == plain greedy, every policy and prompt): %lld checked, "
              "%lld mismatches: %s\n",
              static_cast<long long>(greedy_checked), static_cast<long long>(greedy_mismatches),
              greedy_ok ? "PASS" : "FAIL");
  std::printf("total %.1f s\n", elapsed());

  if (!a.json_path.empty()) {
    json out;
    out["tool"] = "dsv41_dspark_acceptance";
    out["git_commit"] = DSV41_GIT_COMMIT_STRING;
    out["command"] = command_line;
    out["config"] = a.config;
    out["config_hash"] = reference::config_hash(c);
    out["vocab"] = c.vocab_size;
    out["block"] = c.dspark_block_size;
    out["weights"] = json::array();
    for (const WeightsSource& w : sources) out["weights"].push_back(w.label);
    out["seed"] = a.seed;
    out["seed_derivation"] = seed_derivation_text();
    out["prompts"] = prompts;
    out["tokens"] = a.tokens;
    out["temperatures"] = a.temperatures;
    out["top_p"] = a.top_p;
    out["policies"] = a.policies;
    out["threads"] = reference::reference_threads();
    out["seconds"] = elapsed();
    out["chance"] = {{"one_over_vocab", 1.0 / static_cast<double>(c.vocab_size)}};
    out["runs"] = runs;
    out["pooled"] = pooled_json;
    out["pooled_by_temperature"] = by_t_json;
    out["greedy_check"] = {{"checked", greedy_checked}, {"mismatches", greedy_mismatches}, {"passed", greedy_ok},
                           {"failures", checks}};
    const std::string text = out.dump(1) + "\n";
    output::write_file_atomically(a.json_path, "--json", text.data(), text.size());
    std::printf("wrote %s\n", a.json_path.c_str());
  }
  return greedy_ok ? 0 : 1;
}

}  // namespace
}  // namespace dsv41::bench

int main(int argc, char** argv) {
  dsv41::bench::Args a;
  CLI::App app{"DSpark speculative decoding: acceptance statistics and verify-length policies on the CPU reference"};
  app.add_option("--config", a.config, "config preset (tiny) or config.json path")->capture_default_str();
  auto* seeds = app.add_option("--weights-seeds", a.weight_seeds, "random weights, one run per seed (comma list)")
                    ->delimiter(',')
                    ->capture_default_str();
  app.add_option("--weights", a.weights, "a safetensors weights file instead of random weights")
      ->check(CLI::ExistingFile)
      ->excludes(seeds);
  app.add_option("--prompts", a.prompts, "random prompts per run")->capture_default_str();
  app.add_option("--prompt-len", a.prompt_len, "tokens per prompt")->capture_default_str();
  app.add_option("--tokens", a.tokens, "tokens generated per prompt")->capture_default_str();
  app.add_option("--seed", a.seed, "S: prompts, drafts and accept draws derive from it (printed)")->capture_default_str();
  app.add_option("--temperature", a.temperatures, "temperatures (comma list; 0 = greedy)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--top-p", a.top_p, "the verifier's top-p")->capture_default_str();
  app.add_option("--policies", a.policies, "verify-length policies (comma list of fixed:K, threshold:TAU, survival:S)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--threads", a.threads, "reference threads (default: DSV41_THREADS or the cores)");
  app.add_option("--json", a.json_path, "write every number to this JSON file");
  app.add_flag("--plant-accept-one-more", a.plant_accept_one_more,
               "self-test: every round keeps one rejected draft too many; the greedy check must fail (exit 1)");
  CLI11_PARSE(app, argc, argv);
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  try {
    return dsv41::bench::run(a, command_line);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41_dspark_acceptance: %s\n", e.what());
    return 2;
  }
}
