// tests/support/sweep.h
//
// Deterministic parallel sweeps for exhaustive tests, and the mismatch tally they report.
//
// parallel_sweep(begin, end, chunk_fn) splits [begin, end) into kSweepChunks equal chunks (fixed,
// independent of the machine), runs chunk_fn(lo, hi, tally) for each chunk on
// std::thread::hardware_concurrency() threads, and merges the per-chunk tallies in chunk order.
// The merged tally (count, first mismatch = the one with the lowest input) is therefore the same
// for any thread count and any schedule.
//
// Example:
//   MismatchTally t = parallel_sweep(0, 1ull << 31, [](uint64_t lo, uint64_t hi, MismatchTally& t) {
//     for (uint64_t a = lo; a < hi; ++a) t.check(a, expected(a), got(a));
//   });
//   EXPECT_EQ(t.mismatches, 0u) << t.describe("e2m1_encode");
#pragma once

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace dsv41::test {

// Counts comparisons and mismatches; keeps the mismatch with the lowest input.
struct MismatchTally {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  bool has_first = false;
  uint64_t first_input = 0;     // the input (bit pattern or key) of the first mismatch
  uint64_t first_expected = 0;  // the independent definition's result
  uint64_t first_got = 0;       // the tested function's result
  std::string first_note;       // optional context (which field, which anchor)

  // Records one comparison; cheap when expected == got.
  void check(uint64_t input, uint64_t expected, uint64_t got, const char* note = "") {
    ++checked;
    if (expected == got) return;
    record(input, expected, got, note);
  }

  void record(uint64_t input, uint64_t expected, uint64_t got, const std::string& note) {
    ++mismatches;
    if (!has_first || input < first_input) {
      has_first = true;
      first_input = input;
      first_expected = expected;
      first_got = got;
      first_note = note;
    }
  }

  void merge(const MismatchTally& o) {
    checked += o.checked;
    if (o.mismatches == 0) return;
    const uint64_t before = mismatches;
    record(o.first_input, o.first_expected, o.first_got, o.first_note);
    mismatches = before + o.mismatches;
  }

  // "what: N mismatches of M; first: input 0x... expected 0x... got 0x... (note)".
  std::string describe(const std::string& what) const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: %" PRIu64 " mismatches of %" PRIu64 " comparisons",
                  what.c_str(), mismatches, checked);
    std::string s = buf;
    if (has_first) {
      std::snprintf(buf, sizeof buf,
                    "; first: input 0x%08" PRIx64 " expected 0x%" PRIx64 " got 0x%" PRIx64,
                    first_input, first_expected, first_got);
      s += buf;
      if (!first_note.empty()) s += " (" + first_note + ")";
    }
    return s;
  }
};

inline constexpr int kSweepChunks = 256;

template <typename ChunkFn>
MismatchTally parallel_sweep(uint64_t begin, uint64_t end, ChunkFn chunk_fn) {
  std::vector<MismatchTally> per_chunk(kSweepChunks);
  const uint64_t n = end - begin;
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int c = next.fetch_add(1); c < kSweepChunks; c = next.fetch_add(1)) {
      const uint64_t lo = begin + n * static_cast<uint64_t>(c) / kSweepChunks;
      const uint64_t hi = begin + n * static_cast<uint64_t>(c + 1) / kSweepChunks;
      chunk_fn(lo, hi, per_chunk[c]);
    }
  };
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  MismatchTally total;
  for (const MismatchTally& t : per_chunk) total.merge(t);
  return total;
}

}  // namespace dsv41::test
