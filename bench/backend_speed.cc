// bench/backend_speed.cc: a first speed figure of the `cuda` backend against the CPU reference
// (issue 12, deliverable 6; the fast CUDA path is issue 17). One Model per backend over the same
// generated weights (seed printed), one session: a prompt of --prompt tokens fed in chunks of
// --chunk (prefill tokens/s), then --decode one-token steps (ms per step: median, mean, max).
// Every step returns its logits to the host (StepRecord), so each timed step includes the device's
// work and that download. The logits of the last step are compared between the backends (the
// CUDA path claims the reference's bits: a difference is reported, and the exit code is 1).
//
// Usage: dsv41_backend_speed --config scenarios/configs/medium.json [--weight-seed 0]
//          [--prompt 3000] [--chunk 512] [--decode 32] [--backends ref,cuda] [--threads N]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "reference/ops/config.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#if defined(DSV41_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#endif

namespace {

using namespace dsv41;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Timing {
  double prefill_s = 0;
  std::vector<double> decode_ms;
  std::vector<float> last_logits;
};

Timing run_session(const reference::ModelConfig& c, const reference::checkpoint::ModelWeights& w, const std::vector<int64_t>& map,
                   const reference::seam::Ops& ops, const std::vector<int64_t>& prompt, int64_t chunk, int64_t decode) {
  const reference::model::Model model(c, w, map, ops);
  reference::model::ModelState state = model.new_state();
  Timing t;
  const auto t0 = Clock::now();
  reference::model::StepRecord rec;
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(prompt.size() - i, static_cast<size_t>(chunk));
    rec = model.forward_chunk(state, std::vector<int64_t>(prompt.begin() + static_cast<long>(i),
                                                          prompt.begin() + static_cast<long>(i + n)));
  }
  t.prefill_s = seconds_since(t0);
  for (int64_t s = 0; s < decode; ++s) {
    const int64_t token = (s * 7919 + 11) % c.vocab_size;  // fixed ids: both backends see the same steps
    const auto d0 = Clock::now();
    rec = model.decode(state, token);
    t.decode_ms.push_back(1e3 * seconds_since(d0));
  }
  t.last_logits = rec.logits;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"prefill tokens/s and decode ms/step of the reference and the cuda backend"};
  std::string config_path, backends = "ref,cuda";
  uint64_t seed = 0;
  int64_t prompt_len = 3000, chunk = 512, decode = 32;
  int threads = 0;
  app.add_option("--config", config_path, "config.json path or preset")->required();
  app.add_option("--weight-seed", seed, "seed of the generated weights (printed)");
  app.add_option("--prompt", prompt_len, "prompt tokens")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--chunk", chunk, "prefill chunk")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--decode", decode, "decode steps")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--backends", backends, "comma-separated: ref, cuda-exact, cuda (production)");
  app.add_option("--threads", threads, "reference threads (default: all cores)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) reference::set_reference_threads(threads);
    const reference::ModelConfig c = reference::load_config(config_path);
    DSV41_CHECK(prompt_len < c.max_seq_len - decode, "--prompt ", prompt_len, " + --decode ", decode,
                " exceeds max_seq_len ", c.max_seq_len);
    std::printf("config %s (hash %s), weights generated:seed=%llu, prompt %lld in chunks of %lld, %lld decode steps, "
                "reference threads %d\n",
                config_path.c_str(), reference::config_hash(c).c_str(), static_cast<unsigned long long>(seed),
                static_cast<long long>(prompt_len), static_cast<long long>(chunk), static_cast<long long>(decode),
                reference::reference_threads());
    const reference::checkpoint::ModelWeights w = reference::checkpoint::ModelWeights::load(
        reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated weights", reference::checkpoint::generate_weights(c, seed)),
        c);
    const std::vector<int64_t> map = reference::model::default_token_map(c);
    std::vector<int64_t> prompt(static_cast<size_t>(prompt_len));
    for (int64_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = (i * 104729 + 3) % c.vocab_size;

    std::vector<std::pair<std::string, Timing>> results;
    std::stringstream ss(backends);
    for (std::string b; std::getline(ss, b, ',');) {
      if (b == "ref") {
        results.emplace_back(b, run_session(c, w, map, reference::seam::reference_ops(), prompt, chunk, decode));
      } else if (b == "cuda" || b == "cuda-exact") {
#if defined(DSV41_HAVE_CUDA)
        DSV41_CHECK(gpu::device_count() > 0, "backend ", b, ": no CUDA device");
        gpu::CudaOps ops(b == "cuda" ? gpu::CudaMode::kProduction : gpu::CudaMode::kExact);
        run_session(c, w, map, ops, std::vector<int64_t>(prompt.begin(), prompt.begin() + std::min<int64_t>(prompt_len, chunk)),
                    chunk, 1);  // warm-up: context creation, weight mirrors of a first Model
        results.emplace_back(b, run_session(c, w, map, ops, prompt, chunk, decode));
#else
        throw Error("backend " + b + ": this build has no CUDA path");
#endif
      } else {
        throw Error("--backends: unknown backend '" + b + "' (ref, cuda-exact, cuda)");
      }
    }
    std::printf("%-6s %12s %14s %12s %12s %12s\n", "side", "prefill s", "prefill tok/s", "decode med", "decode mean",
                "decode max");
    for (auto& [name, t] : results) {
      std::vector<double> d = t.decode_ms;
      std::sort(d.begin(), d.end());
      const double med = d.empty() ? 0 : d[d.size() / 2];
      const double mean = d.empty() ? 0 : std::accumulate(d.begin(), d.end(), 0.0) / static_cast<double>(d.size());
      std::printf("%-6s %12.2f %14.1f %9.2f ms %9.2f ms %9.2f ms\n", name.c_str(), t.prefill_s,
                  static_cast<double>(prompt_len) / t.prefill_s, med, mean, d.empty() ? 0 : d.back());
    }
    int rc = 0;
    for (size_t i = 1; i < results.size(); ++i) {
      const auto& a = results[0].second.last_logits;
      const auto& b = results[i].second.last_logits;
      const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      std::printf("last logits %s vs %s: %s\n", results[0].first.c_str(), results[i].first.c_str(),
                  same ? "bit-identical" : "DIFFER");
      if (!same) rc = 1;
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41_backend_speed: %s\n", e.what());
    return 2;
  }
}
