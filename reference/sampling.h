// reference/sampling.h
//
// Token sampling with a seeded, fully specified random stream, so a speculative run replays
// exactly on every platform (std::uniform_*_distribution are not specified by the standard; this
// is).
//
//   SampleRng            std::mt19937_64 (specified by the standard) seeded with `seed`; uniform()
//                        = (next() >> 11) * 2^-53, in [0, 1), 53 bits
//   target_distribution  p = softmax(logits / T) in double, then top-p: the tokens sorted by
//                        descending p (ties: lower id first), the shortest prefix whose mass is
//                        >= top_p kept, renormalized; T = 0 gives the one-hot of the argmax (lowest
//                        id among equal maxima)
//   sample_from          the token whose cumulative mass (ids in ascending order) first exceeds u
//                        = rng.uniform() * total: inverse CDF, one draw per sample
//
// Example:
//   SampleRng rng(42);
//   std::vector<double> p = target_distribution(logits, {0.8, 0.95});
//   int64_t token = sample_from(p, rng);
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace dsv41::reference {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // (0, 1]
};

class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : engine_(seed), seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t next() { return engine_(); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)

 private:
  std::mt19937_64 engine_;
  uint64_t seed_;
};

// argmax of fp32 logits; the lowest id among equal maxima (NaN is an error).
int64_t argmax_token(const float* logits, int64_t vocab);

// The distribution a sampler with these parameters draws from (above). logits: [vocab] fp32.
std::vector<double> target_distribution(const float* logits, int64_t vocab, const SamplingParams& s);

// One draw from p (sum > 0; entries >= 0) with u = rng.uniform().
int64_t sample_from(const std::vector<double>& p, SampleRng& rng);

}  // namespace dsv41::reference
