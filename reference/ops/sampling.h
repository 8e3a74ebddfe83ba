// reference/ops/sampling.h
//
// Sampling tokens from logits with seeded, fully specified generators, so a run replays exactly on
// every platform (std::*_distribution are not specified by the standard; std::mt19937_64 is).
//
// The official sampler (model.py sample(); what the DSpark draft draws with, docs/dspark.md):
//   temperature 0   argmax(logits); among equal maxima the LOWEST index (torch's CPU argmax)
//   temperature T   z = logits / max(T, 1e-5) (fp32 division); probs = softmax(z) (below);
//                   token = argmax_v(probs[v] / e_v) (fp32 division; lowest index on ties),
//                   e_v ~ Exp(1): the Gumbel-max trick, equivalent to drawing from probs
//   sampling_probs  at T > 0, m = max z; e_v = exp(double(z_v - m)) (the difference in fp32, exp in
//                   double); s = sum_v e_v in double, in index order; probs[v] = fp32(e_v / s). At
//                   T = 0 the one-hot of the argmax. A verifier's p_draft (semantics.md 2.9).
//   exp1_draw       one 64-bit output w of std::mt19937_64: u = ((w >> 11) + 0.5) * 2^-53 in (0, 1),
//                   e = fp32(-log1p(-u)) > 0; sample() draws vocab values per call, e_0 first, only
//                   at T > 0
//
// Verification (reference/model/speculative.h; dsv41's, the official code has none):
//   target_distribution  the official distribution (sampling_probs, widened to double) with
//                        top-p on top: the tokens sorted by descending p (ties: lower id first),
//                        the shortest prefix whose mass is >= top_p kept (all at top_p = 1),
//                        renormalized in double (the fp32 probabilities sum to 1 only within
//                        their rounding)
//   SampleRng            std::mt19937_64 seeded with `seed`; uniform() = (next() >> 11) * 2^-53,
//                        in [0, 1), 53 bits
//   sample_from          the token whose cumulative mass (ids in ascending order) first exceeds
//                        u = rng.uniform() * total: inverse CDF, one draw per sample
//
// Example:
//   std::mt19937_64 rng(seed);
//   int64_t tok = sample(row, vocab, 0.7, rng);                 // the official sampler
//   SampleRng r(42);
//   std::vector<double> p = target_distribution(row, vocab, {0.8, 0.95});
//   int64_t t = sample_from(p, r);                              // the verifier's draws
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace dsv41::reference {

// --- The official sampler ---

// The distribution sample() draws from. logits: [vocab] fp32 (finite) -> [vocab] fp32.
std::vector<float> sampling_probs(const float* logits, int64_t vocab, double temperature);

// One token (above). logits: [vocab] fp32 (finite); temperature >= 0 and finite.
int64_t sample(const float* logits, int64_t vocab, double temperature, std::mt19937_64& rng);

// One Exp(1) draw from rng (above).
float exp1_draw(std::mt19937_64& rng);

// --- Verification ---

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

// The distribution a verifier with these parameters draws from (above). logits: [vocab] fp32.
std::vector<double> target_distribution(const float* logits, int64_t vocab, const SamplingParams& s);

// One draw from p (sum > 0; entries >= 0) with u = rng.uniform().
int64_t sample_from(const std::vector<double>& p, SampleRng& rng);

}  // namespace dsv41::reference
