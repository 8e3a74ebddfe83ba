// scenarios/runner/forward_generate.h
//
// Generation for `dsv41 forward --generate N` (docs/forward.md, docs/forward-output.md): N tokens
// after the prompt, plain (one decode step per token) or speculative (--speculative: rounds of
// Model::draft + reference::model::speculative_round), greedy or sampled (--sampling T[,TOP_P]), from
// one printed seed (--seed S).
//
// The current token: the last emitted token, not yet run by the target. After a prompt it is the
// pick from the prompt's last logits (and is generated token 0); after `--resume FILE
// --first-token T` it is T (the pending token the saving run printed; not generated again).
// Then, until N tokens are generated:
//   plain        decode(current) -> logits -> pick -> the next current token
//   speculative  round r: draft = Model::draft(state, current, {T, draft_seed(S, r)}); the round is
//                offered min(B, remaining - 1) of its drafts (remaining = N - generated), so no
//                round emits past N: the last round's emission is cut to exactly N by offering
//                fewer drafts, never by discarding tokens the target ran, and the state always
//                holds exactly the fed tokens; speculative_round(..., SampleRng(accept_seed(S, r)))
// pick: temperature 0: argmax_token (lowest id on ties, no draws); else
//   sample_from(target_distribution(logits, {T, top_p}), token_rng) with one
//   token_rng = SampleRng(token_seed(S)) for the run (plain: every token; speculative: token 0).
//
// Seeds: the i-th output (i = 0, 1, ...) of SplitMix64 seeded with S, split_seed(S, i):
//   token_seed(S)      = split_seed(S, 0)
//   draft_seed(S, r)   = split_seed(S, 2r + 1)   (DraftSampling::seed of round r)
//   accept_seed(S, r)  = split_seed(S, 2r + 2)   (the accept rule's SampleRng of round r)
// with r counting this run's rounds from 0. The same inputs and S replay a run exactly.
//
// What generation records (GenerationRun): the steps' per-position records cut to the fed
// positions (a verify step's rows of the accepted tokens, its /candidates columns to their
// reach), so every per-position dataset and /logits row of a speculative run equals the plain
// run's of the same tokens bit for bit; and per round what /speculative holds.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reference/model/model.h"
#include "reference/ops/sampling.h"
#include "reference/model/speculative.h"
#include "reports/h5_writer.h"

namespace dsv41::scenarios::runner {

struct GenerateOptions {
  int64_t tokens = 0;                                 // N >= 1
  std::optional<reference::model::VerifyPolicy> speculative;  // absent: plain generation
  reference::SamplingParams sampling;                 // temperature 0: greedy
  uint64_t seed = 0;                                  // S
};

// "K" (an integer: fixed:K) or a VerifyPolicy spec; a dsv41::Error naming --speculative otherwise.
reference::model::VerifyPolicy parse_speculative(const std::string& text);
// "T" or "T,TOP_P": T finite >= 0, TOP_P in (0, 1] (default 1); a dsv41::Error naming --sampling.
reference::SamplingParams parse_sampling(const std::string& text);

// The i-th output of SplitMix64 seeded with s (above).
uint64_t split_seed(uint64_t s, uint64_t i);
inline uint64_t token_seed(uint64_t s) { return split_seed(s, 0); }
inline uint64_t draft_seed(uint64_t s, uint64_t round) { return split_seed(s, 2 * round + 1); }
inline uint64_t accept_seed(uint64_t s, uint64_t round) { return split_seed(s, 2 * round + 2); }

// One speculative round as /speculative records it. B = dspark_block_size.
struct RoundRecord {
  int64_t start_pos = 0;            // the position of the current token
  int64_t current = -1;             // the current token (row 0 of the verify step)
  std::vector<int64_t> drafts;      // [proposed] the drafts offered (Model::draft's first ones)
  std::vector<double> confidence;   // [proposed] sigmoid of their confidence logits
  std::vector<double> survival;     // [proposed] predicted prefix survival S_i
  int64_t verified = 0;             // k
  int64_t accepted = 0;             // m
  int64_t next_token = -1;
  std::vector<double> accept_prob;  // as SpeculativeRound::accept_prob
  uint64_t draft_seed = 0, accept_seed = 0;
};

struct GenerationRun {
  std::vector<int64_t> generated;               // [N]
  std::vector<int64_t> fed;                     // the tokens the target ran, in order
  int64_t pending = -1;                         // the current token at the end (emitted, not run)
  // One per decode step / round, cut to the fed rows; a round's all_logits holds the logits of
  // each fed position [m + 1, vocab] (a decode step's: logits only).
  std::vector<reference::model::StepRecord> steps;
  std::vector<RoundRecord> rounds;              // speculative only
};

// What sees each target step of a generation (forward --dump, scenarios/conform/port_dump.h).
// before_step: right before a target step (a decode step; a round's verify step, after its draft);
// after_step: right after it (a round: after its rollback, so `state` holds the kept tokens only),
// with the step's record (a verify step's: every row, all_logits [k + 1, vocab]), the tokens it ran
// ([current] or [current, d_1..d_k]) and the tokens kept (1, or m + 1).
struct GenerateObserver {
  std::function<void()> before_step;
  std::function<void(const reference::model::StepRecord& step, const std::vector<int64_t>& tokens, int64_t kept)> after_step;
};

// Generates on `state`. Either `prompt_logits` (the prompt's last row [vocab]: token 0 is picked
// from it) or `first_token` (the pending token of a resumed session) must be given.
GenerationRun generate(const reference::model::Model& model, reference::model::ModelState& state,
                       const std::vector<float>* prompt_logits, std::optional<int64_t> first_token,
                       const GenerateOptions& options, const GenerateObserver& observer = {});

// /generated, /speculative (speculative runs) and their attributes (docs/forward-output.md).
void write_generation(reports::H5Writer& w, const GenerationRun& run, const GenerateOptions& options,
                      const reference::ModelConfig& c);

// "speculative fixed:3: 4 rounds, mean accepted length 2.25, 3.25 tokens/round".
std::string speculative_summary(const GenerationRun& run, const GenerateOptions& options);

}  // namespace dsv41::scenarios::runner
