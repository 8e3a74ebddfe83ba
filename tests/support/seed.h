// tests/support/seed.h
//
// The data seed of a test binary. Every random input of a dsv41 test derives from one 64-bit
// seed: the environment variable DSV41_SEED (decimal or 0x-hex) when it is set, else a fixed
// default, so a run is reproducible by default and a failure found with another seed can be
// replayed. The seed is printed once per binary, the first time it is used.
//
// Each input gets its own stream from its name (and shape), so adding an input does not change
// the others (Eigen's EIGEN_SEED; ggml's tensor_seed).
//
// rapidcheck has its own seed: it prints it on failure and takes RC_PARAMS="seed=<n>".
//
// Example:
//   std::mt19937_64 rng(dsv41::test::seed_for("pack_rows/rows=17,dim=64"));
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace dsv41::test {

inline constexpr uint64_t kDefaultSeed = 20261129;

// The binary's data seed; prints "[dsv41] data seed ..." on first use.
inline uint64_t data_seed() {
  static const uint64_t seed = [] {
    uint64_t s = kDefaultSeed;
    const char* from = "default";
    if (const char* env = std::getenv("DSV41_SEED"); env != nullptr && *env != '\0') {
      s = std::strtoull(env, nullptr, 0);
      from = "DSV41_SEED";
    }
    std::printf("[dsv41] data seed %llu (%s; set DSV41_SEED=<n> to override)\n",
                static_cast<unsigned long long>(s), from);
    std::fflush(stdout);
    return s;
  }();
  return seed;
}

// SplitMix64 finaliser: a well-mixed 64-bit function of its argument.
inline constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The seed of one named input: a stable function of the data seed and the name (FNV-1a).
inline uint64_t seed_for(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return mix64(data_seed() ^ h);
}

}  // namespace dsv41::test
