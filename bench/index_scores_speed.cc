// bench/index_scores_speed.cc: the CPU reference's index_scores (reference/ops/indexer.h) on seeded
// FP4-QDQ inputs (E2M1 codes times one power-of-two scale per 32 channels, as the indexer's q and
// keys are), at one shape: the seconds of the best of --repeat calls, the (query, key) pairs per
// second, and an FNV-1a hash of the scores' bits, so that two builds of the reference can be timed
// side by side and shown to give the same bits (the long-context replays of docs/scale.md spend
// most of their time here). --path double times the double path (the readable specification) in
// place of the default integer path: the hash must not change.
//
// Usage: dsv41_index_scores_speed [--t 512] [--n 65536] [--heads 4] [--dim 32] [--threads 1]
//          [--repeat 3] [--seed 1] [--path integer|double]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/indexer.h"
#include "reference/ops/numerics.h"

int main(int argc, char** argv) {
  using dsv41::reference::Tensor;
  CLI::App app{"time the reference's index_scores on seeded FP4-QDQ inputs"};
  int64_t t_count = 512, n = 65536, heads = 4, dim = 32;
  int threads = 1, repeat = 3;
  uint64_t seed = 1;
  std::string path = "integer";
  app.add_option("--t", t_count, "queries")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--n", n, "keys (every query reaches all of them)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--heads", heads, "index heads")->check(CLI::Range(int64_t{1}, int64_t{128}));
  app.add_option("--dim", dim, "index head dim")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--threads", threads, "reference threads")->check(CLI::Range(1, 1024));
  app.add_option("--repeat", repeat, "calls (the best is printed)")->check(CLI::Range(1, 100));
  app.add_option("--seed", seed, "input seed (printed)");
  app.add_option("--path", path, "integer (the default) or double (every dot in double)")
      ->check(CLI::IsMember({"integer", "double"}));
  CLI11_PARSE(app, argc, argv);
  try {
    dsv41::reference::set_reference_threads(threads);
    std::mt19937_64 rng(seed);
    const float e2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const auto fill = [&](float* x) {  // one FP4-QDQ row: a scale per 32 channels within 2^4
      const int base = static_cast<int>(rng() % 12) - 8;
      for (int64_t b = 0; b < dim; b += 32) {
        const int e = base + static_cast<int>(rng() % 5);
        for (int64_t i = b; i < std::min(dim, b + 32); ++i) {
          x[i] = std::ldexp(e2m1[rng() % 8], e) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
        }
      }
    };
    Tensor<float> q({t_count, heads, dim}, "q"), keys({n, dim}, "keys"), w({t_count, heads}, "w");
    for (int64_t t = 0; t < t_count; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        fill(q.row(t, h));
        w.at(t, h) = dsv41::formats::round_to_bf16(std::ldexp(static_cast<float>(1 + rng() % 255), -9));
      }
    }
    for (int64_t j = 0; j < n; ++j) fill(keys.row(j));
    const std::vector<int64_t> reach(static_cast<size_t>(t_count), n);
    const dsv41::reference::IndexScoresPath which =
        path == "double" ? dsv41::reference::IndexScoresPath::kDouble : dsv41::reference::IndexScoresPath::kInteger;
    dsv41::reference::IndexScoresTally tally;
    double best = 1e300;
    uint64_t hash = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor<float> s = dsv41::reference::index_scores(q, keys, w, reach, which, &tally);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, sec);
      uint64_t h = 0xcbf29ce484222325ull;
      int64_t nonzero = 0;
      for (const float v : s.data()) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v, 4);
        h = (h ^ bits) * 0x100000001b3ull;
        nonzero += v != 0.0f;
      }
      DSV41_CHECK(nonzero > 0, "index_scores_speed: every score is zero");
      DSV41_CHECK(r == 0 || h == hash, "index_scores_speed: two calls gave different bits");
      hash = h;
    }
    std::printf("index_scores T %lld x N %lld x %lld heads x %lld, %d thread(s), seed %llu, %s path (%lld integer "
                "+ %lld double groups): best of %d %.3f s, %.1f M pairs/s, bits fnv1a %016llx\n",
                static_cast<long long>(t_count), static_cast<long long>(n), static_cast<long long>(heads),
                static_cast<long long>(dim), threads, static_cast<unsigned long long>(seed), path.c_str(),
                static_cast<long long>(tally.integer_groups), static_cast<long long>(tally.double_groups), repeat, best,
                static_cast<double>(t_count) * static_cast<double>(n) / best / 1e6,
                static_cast<unsigned long long>(hash));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41_index_scores_speed: %s\n", e.what());
    return 2;
  }
  return 0;
}
