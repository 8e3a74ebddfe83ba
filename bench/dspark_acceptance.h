// bench/dspark_acceptance.h
//
// dsv41_dspark_acceptance: how often the target accepts DSpark drafts, and what the verify-length
// policies (reference/model/speculative.h: fixed:K, threshold:TAU, survival:S) do with them, measured by
// running speculative decoding on the CPU reference (docs/dspark.md, Part 3).
//
// One run = one (weights, temperature, policy): every prompt decoded speculatively, each round
// drafted by Model::draft and verified by speculative_round. What a round contributes is kept raw
// (RoundObservation, DecidedDraft) so runs pool exactly (AcceptanceStats::merge); summarize()
// turns them into the published numbers.
//
// Terms (per round): n drafts proposed (= dspark_block_size), k verified (the policy's choice),
// m accepted, k - m verified but rejected ("wasted" target rows), m + 1 tokens emitted per
// target (verify) step. Draft i (1-based) is "decided" when i <= k and drafts 1..i-1 were
// accepted (i <= m + 1); its acceptance rate is accepted / decided.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/model/model.h"
#include "reference/model/speculative.h"
#include "scenarios/defects/round_defects.h"

namespace dsv41::bench {

// --- Seeds -------------------------------------------------------------------------------------

// The random streams of a run. Every stream's seed is derive_seed(S, stream, weights, prompt, round).
enum class Stream : uint64_t { kPrompt = 1, kFirstToken = 2, kDraft = 3, kAccept = 4 };

// SplitMix64's output function (Steele et al.): h(x) = mix of x + 0x9e3779b97f4a7c15.
uint64_t splitmix64(uint64_t x);
// h(h(h(h(h(S) ^ stream) ^ weights) ^ prompt) ^ round). weights: the weights seed (0 for a file;
// the prompts use 0 always, so every weights decodes the same prompts).
uint64_t derive_seed(uint64_t seed, Stream stream, uint64_t weights, int64_t prompt, int64_t round);
// The derivation in words, as the program prints it and the JSON records it.
std::string seed_derivation_text();

// --- What a round contributes ------------------------------------------------------------------

// One decided draft: the target's and the draft's distributions at that position.
struct DecidedDraft {
  int position = 0;             // i - 1 (0-based draft index)
  int64_t prompt = 0;           // which prompt (the unrelated-pair baseline pairs across prompts)
  double confidence = 0;        // c_i = sigmoid(confidence logit)
  bool accepted = false;        // the rule accepted it
  double accept_prob = 0;       // min(1, p_t(d_i) / p_d(d_i)) (greedy: 1 on a match, else 0)
  std::vector<float> p_target;  // [vocab] target_distribution of verify row i - 1 (one-hot at T = 0)
  std::vector<float> p_draft;   // [vocab] the draft's distribution of d_i (one-hot at T = 0)
};

struct RoundObservation {
  int64_t proposed = 0;              // n
  int64_t verified = 0;              // k
  int64_t accepted = 0;              // m
  std::vector<double> confidence;    // [k] c_1..c_k
  std::vector<double> survival;      // [k] S_1..S_k = c_1 ... c_j
};

// --- Statistics --------------------------------------------------------------------------------

class AcceptanceStats {
 public:
  explicit AcceptanceStats(int64_t block = 0) : block_(block) {}

  void add_round(RoundObservation r) { rounds_.push_back(std::move(r)); }
  void add_decided(DecidedDraft d) { decided_.push_back(std::move(d)); }
  void add_time(double seconds, int64_t emitted) { seconds_ += seconds; emitted_ += emitted; }
  // Pools another run's raw observations (same block size).
  void merge(const AcceptanceStats& other);

  int64_t block() const { return block_; }
  int64_t rounds() const { return static_cast<int64_t>(rounds_.size()); }

  // Every number of the run (docs/dspark.md, Part 3 lists them); undefined ratios are null.
  nlohmann::json summarize() const;

 private:
  int64_t block_;
  std::vector<RoundObservation> rounds_;
  std::vector<DecidedDraft> decided_;
  double seconds_ = 0;
  int64_t emitted_ = 0;
};

// sum_v min(p[v], q[v]): the acceptance probability of a draft drawn from q under the accept rule
// when the target is p (the total-variation overlap).
double overlap(const std::vector<float>& p, const std::vector<float>& q);

// --- Decoding ----------------------------------------------------------------------------------

struct DecodeSetup {
  const reference::model::Model* model = nullptr;
  int64_t tokens = 0;              // tokens generated per prompt (the first from the prefill)
  uint64_t seed = 0;               // S
  uint64_t weights_seed = 0;       // w of derive_seed (0 for a weights file)
  reference::SamplingParams sampling;
  reference::model::VerifyPolicy policy;
  scenarios::defects::RoundDefect defect = scenarios::defects::RoundDefect::kNone;  // the greedy check's self-test
};

// `count` prompts of `length` tokens, prompt p from SampleRng(derive_seed(S, kPrompt, 0, p, 0)):
// next() % (vocab - 1), ids >= the DSpark noise id shifted up by one (the noise id never occurs).
std::vector<std::vector<int64_t>> random_prompts(const reference::ModelConfig& c, int64_t count, int64_t length,
                                                 uint64_t seed);

// Plain greedy decoding: prefill, then argmax one token at a time. [tokens] generated.
std::vector<int64_t> plain_greedy(const reference::model::Model& model, const std::vector<int64_t>& prompt, int64_t tokens);

// Speculative decoding with DSpark drafts (rounds until `tokens` are generated; the last round's
// surplus is dropped from the returned [tokens], not from the statistics). Adds every round and
// every decided draft to `stats`.
std::vector<int64_t> speculative_generate(const DecodeSetup& setup, const std::vector<int64_t>& prompt,
                                          int64_t prompt_index, AcceptanceStats& stats);

}  // namespace dsv41::bench
