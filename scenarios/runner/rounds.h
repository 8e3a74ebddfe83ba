// scenarios/runner/rounds.h
//
// Speculative rounds in the scenario runner (a "speculate" event, scenarios/runner/scenario.h;
// docs/dspark.md). One round is one step of the report:
//   1. side A plans it (plan_round): the current token, its drafts (its DSpark proposal, or its
//      own greedy continuation on a fork of its session: "lookahead:N"), the scenario's corruption
//      of one draft ("reject_at": draft i becomes (d_i + 1) mod vocab, which a greedy target
//      rejects when d_i was its argmax), and k from the verify-length policy
//   2. each side runs it: a speculative side verifies [current, d_1..d_k] in one step and rolls
//      back (Backend::verify); a plain side ("/plain") decodes the tokens one at a time, which is
//      what speculative decoding must equal. Side A decides m (its own rule); side B decides its
//      own m too but keeps A's (lockstep: both sides always hold the same tokens)
//   3. the round's capture: every component output of the kept positions [c, d_1..d_m] (a verify
//      step's first m + 1 rows; a plain side's m + 1 one-token steps concatenated), the side's
//      own decision as the item "accept" [m, next token], the logits of the kept positions, and
//      the caches after the rollback.
// Planted value and cache defects (scenarios/defects/mutants.h) never fire inside a round (a defect in a
// rolled-back row would vanish and prove nothing); the speculative defects fire only there.
//
// DSpark drafts ("drafts": "dspark"): BOTH sides run their own draft at the round's start
// (run_draft: Backend::draft, teacher-forced from A's when the mode is), its dspark_* outputs
// lead the round's capture (a plain side drafts too: its state must give the same draft); side A's
// draft is the proposal (tokens, the distributions they were drawn from, confidence logits).
//
// Example:
//   DraftSide da = run_draft(a_backend, a_session, current, spec, draft_seed, nullptr, step);
//   RoundPlan plan = plan_round(a_backend, a_session, current, spec, round, seed, &da.result);
//   RoundSide ra = run_round(a_backend, a_session, plan, /*plain=*/false, std::nullopt, nullptr, step);
//   RoundSide rb = run_round(b_backend, b_session, plan, /*plain=*/true, ra.kept, nullptr, step);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reference/model/speculative.h"
#include "reports/report.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

// What side A fixed for a round; both sides follow it.
struct RoundPlan {
  int64_t current = -1;                         // c, at the session's position P
  std::vector<int64_t> proposal;                // [n] the drafts offered (after the corruption)
  int64_t corrupted = -1;                       // the draft index reject_at corrupted (-1: none)
  std::vector<float> confidence_logits;         // [n] the drafter's (empty for lookahead drafts)
  std::vector<std::vector<double>> p_draft;     // [n][vocab] the draft distributions (sampling)
  int64_t k = 0;                                // drafts verified (the policy's choice)
  reference::SamplingParams sampling;
  uint64_t seed = 0;                            // the accept rule's stream
  std::vector<int64_t> drafts() const { return {proposal.begin(), proposal.begin() + k}; }
};

// One side's run of a round.
struct RoundSide {
  StepCapture capture;             // the kept positions, "accept", their logits, the caches after
  StepCapture verify;              // a speculative side's verify step as run (teacher forcing source)
  reference::model::Acceptance decision;  // the side's own decision (next_token -1: beyond what it ran)
  int64_t kept = 0;                // drafts kept (side A's decision)
};

// One side's DSpark draft after `current` (at the session's position): sampled at the round's
// temperature (no top-p: the official sampler) with `draft_seed`.
struct DraftSide {
  StepCapture capture;             // the dspark_* outputs, in the draft's order
  reference::model::DraftResult result;
};
DraftSide run_draft(Backend& backend, BackendSession& session, int64_t current, const SpeculateSpec& spec,
                    uint64_t draft_seed, const StepCapture* forced, int64_t step);

// Step 1 on side A's session (unchanged: lookahead drafts run on a fork). draft: side A's DSpark
// draft (the "dspark" drafter; nullptr otherwise).
RoundPlan plan_round(Backend& backend, BackendSession& session, int64_t current, const SpeculateSpec& spec,
                     int64_t round, uint64_t seed, const reference::model::DraftResult* draft);

// Steps 2 and 3 on one side. keep: side A's decision (std::nullopt: this side is A and decides).
// forced: side A's verify capture (teacher forcing; speculative sides only).
RoundSide run_round(Backend& backend, BackendSession& session, const RoundPlan& plan, bool plain,
                    std::optional<int64_t> keep, const StepCapture* forced, int64_t step);

// The report's acceptance rows of one side's round (reports::AcceptanceRow).
std::vector<reports::AcceptanceRow> acceptance_rows(const RoundPlan& plan, const RoundSide& side,
                                                    const std::string& which, int64_t step, int session,
                                                    int64_t start_pos);

}  // namespace dsv41::scenarios::runner
