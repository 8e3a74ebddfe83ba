// reference/model/speculative.h
//
// Speculative decoding on the reference model: verification of drafts in one multi-token target
// step, the accept rule, rollback, and the verify-length policy (docs/dspark.md). The official code
// defines none of these (semantics.md §2.9): the accept rule follows DeepSeek's DeepSpec, rollback
// and the policies are dsv41's, documented and tested.
//
// One round at position P, with the current token c (emitted, not yet fed to the target):
//   1. drafts d_1..d_n (a Proposal, e.g. Model::draft's); the policy picks k <= n to verify
//   2. ONE target step over [c, d_1..d_k] at positions P .. P + k, logits of every position
//      (row i: the target's prediction of the token after position P + i)
//   3. acceptance (accept_drafts):
//        greedy (T = 0):  accept d_i while d_i == argmax(row i - 1); the next token is the
//                         target's argmax at the first mismatch, or argmax(row k) (the bonus)
//        sampling:        accept d_i with probability min(1, p_t(d_i) / max(p_d(d_i), 1e-8)),
//                         p_t = target_distribution(row i - 1), p_d = the draft's distribution of
//                         d_i, u_i from the seeded stream (accept when u_i < the probability); the
//                         first rejection draws from normalize((p_t - p_d)+) (p_t when that is
//                         empty); all accepted: the bonus from target_distribution(row k)
//   4. rollback: the target keeps exactly [c, d_1..d_m] (m accepted). When m < k, the state is the
//      one before the round advanced by [c, d_1..d_m] in one chunk: by the chunking invariance of
//      the forward (docs/sessions.md) that equals decoding those tokens one at a time, bit for bit,
//      in every cache (window_kv rings, compressed_kv, index_keys, the compressor's partial group,
//      the Engram history, the recent tokens, the DSpark state). When m = k nothing is undone.
//   The round emits d_1..d_m and the next token, which becomes the current token of the next round.
//
// Verify-length policies (VerifyPolicy), from the draft's confidence logits (c_i = sigmoid:
// the conditional acceptance probability of position i; S_i = c_1 ... c_i: predicted prefix
// survival; the expected accepted drafts of verifying k is S_1 + ... + S_k):
//   fixed:K        verify min(K, n)
//   threshold:TAU  verify while c_i >= TAU (DeepSpec's single-point truncation; at least 1)
//   survival:S     verify while S_i >= S: the next draft adds at least S expected tokens (at least 1)
// DeepSeek's throughput-curve scheduler is not public; these are the documented stand-ins.
//
// Example:
//   SampleRng rng(seed);
//   SpeculativeRound r = speculative_round(model, state, current, proposal, options, rng);
//   current = r.next_token;   // r.emitted: the tokens this round produced
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/model/model.h"
#include "reference/ops/sampling.h"

namespace dsv41::reference::model {

struct VerifyPolicy {
  enum class Kind { kFixed, kThreshold, kSurvival };
  Kind kind = Kind::kFixed;
  int k = 4;               // kFixed
  double threshold = 0.5;  // kThreshold (tau), kSurvival (S)

  // "fixed:K", "threshold:TAU", "survival:S"; a dsv41::Error naming the spec otherwise.
  static VerifyPolicy parse(const std::string& spec);
  std::string str() const;
  // How many of n drafts to verify, given their confidence logits [n] (empty: all n for kFixed's K).
  int64_t choose(const std::vector<float>& confidence_logits, int64_t n) const;
};

// What a drafter proposes after the current token.
struct Proposal {
  std::vector<int64_t> tokens;                // [n] d_1 .. d_n
  std::vector<std::vector<double>> probs;     // [n][vocab] the distribution each d_i was drawn from
                                              // (sampling mode; may be empty in greedy mode)
  std::vector<float> confidence_logits;       // [n] (may be empty for fixed:K only; threshold and
                                              //   survival need them: a dsv41::Error otherwise)
};

// The accept rule (above) on distributions. p_target: [k + 1][vocab] (target_distribution of rows
// 0..k), drafts: [k], p_draft: [k][vocab] (ignored in greedy mode).
struct Acceptance {
  int64_t accepted = 0;              // m: d_1..d_m accepted
  int64_t next_token = -1;           // the correction or the bonus
  std::vector<double> accept_prob;   // [min(m + 1, k)] min(1, p_t / p_d) of the positions decided
};
Acceptance accept_drafts(const std::vector<std::vector<double>>& p_target, const std::vector<int64_t>& drafts,
                         const std::vector<std::vector<double>>& p_draft, bool greedy, SampleRng& rng);


// Steps 2 and 3 of a round: the target step over [current, drafts] (hooks see it; every row's
// logits) and the accept decision from its logits. `state` is left after the verify step (all
// k + 1 tokens): roll_back() then keeps the accepted ones. p_draft: [k][vocab] (sampling only).
struct Verification {
  StepRecord step;       // the verify step: all_logits [k + 1, vocab]
  Acceptance decision;   // this state's own decision
};
Verification verify_drafts(const Model& model, ModelState& state, int64_t current, const std::vector<int64_t>& drafts,
                           const std::vector<std::vector<double>>& p_draft, const SamplingParams& sampling,
                           SampleRng& rng);

// Observers of a round's steps that may change what they see, as ForwardHooks may replace a
// step's values: a port's own behaviour replayed, or a defect the verifier's self-test plants
// (scenarios/defects/round_defects.h). Unset: the official round.
struct RoundHooks {
  // After the accept rule (verify_drafts): the verification of k drafts; may change its decision.
  std::function<void(Verification& v, int64_t k)> decided;
  // After roll_back kept m < k drafts: `kept` is the rolled-back state, `verified` the state after
  // the verify step; may change `kept`.
  std::function<void(ModelState& kept, const ModelState& verified)> rolled_back;
};

struct SpeculativeOptions {
  VerifyPolicy policy;
  SamplingParams sampling;   // temperature 0: greedy
  RoundHooks hooks;          // unset: the official round
};


// Step 4: `state` (after the verify step of `tokens` = [c, d_1..d_k] from `before`) keeps
// [c, d_1..d_m]: unchanged when m = k, else `before` advanced by those m + 1 tokens in one
// hook-free chunk (bit-equal to decoding them one at a time); then hooks.rolled_back, if set.
void roll_back(const Model& model, ModelState& state, const ModelState& before, const std::vector<int64_t>& tokens,
               int64_t m, const RoundHooks& hooks = {});

struct SpeculativeRound {
  int64_t start_pos = 0;                 // P: the position of the current token
  int64_t current = -1;                  // c
  int64_t proposed = 0;                  // n drafts offered
  std::vector<int64_t> verified;         // d_1..d_k
  int64_t accepted = 0;                  // m
  int64_t next_token = -1;
  std::vector<int64_t> emitted;          // d_1..d_m, next_token
  std::vector<double> confidence;        // [k] sigmoid of the verified drafts' confidence logits
  std::vector<double> predicted_survival;  // [k] S_1..S_k
  std::vector<double> accept_prob;       // as Acceptance
  StepRecord verify;                     // the target step over [c, d_1..d_k], logits of every row
};

// One round (above) on `state` at state.pos with the current token. state ends at P + m + 1.
SpeculativeRound speculative_round(const Model& model, ModelState& state, int64_t current, const Proposal& proposal,
                                   const SpeculativeOptions& options, SampleRng& rng);

// sigmoid(z) in double: a confidence logit's conditional acceptance probability.
double confidence_of(float logit);

}  // namespace dsv41::reference::model
