// scenarios/runner/replay_study.h
//
// Measures what SWA bounded replay costs (docs/replay-divergence.md): a session that is resumed
// from its global state only (the SWA rings dropped and rebuilt by encoder replay) against the
// same session never paused. The reference makes chunking itself exact, so every difference is
// the replay's.
//
//   repeated resumptions  a prompt of `length` tokens split at k evenly spaced resume points
//                         (k in `resumptions`), then `steps` one-token decode steps, compared
//   follow-up turns       a prompt of `length` tokens, then `turns` turns of `turn_len` tokens,
//                         each after a resume, compared turn by turn
//
// Metrics per compared step: logits max |d|, KL(reference || resumed) in nats, top-1 agreement,
// per indexer layer the Jaccard overlap of the top-k sets, per layer the NMSE of the output stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/model/model.h"

namespace dsv41::scenarios::runner {

struct ReplayStudyOptions {
  int64_t length = 0;                    // prompt tokens (default: 3 windows)
  std::vector<int> resumptions = {1, 2, 4, 8};
  int steps = 4;                         // decode steps compared after the last resume
  int turns = 4;                         // follow-up turns
  int64_t turn_len = 8;                  // tokens per turn
  uint64_t token_seed = 1;               // the random prompt
  // Called before each case (a resume count, a follow-up turn) and once at the end with done ==
  // total: cases done, cases in all, what runs now (may be empty).
  std::function<void(int done, int total, const std::string& what)> progress;
};

struct ReplayStepResult {
  std::string experiment;  // "resumptions" or "turns"
  int resumptions = 0;     // k (resumptions) or turn index + 1 (turns)
  int step = 0;            // decode step or turn
  double logit_max_abs = 0, kl = 0;
  bool top1_equal = false;
  std::vector<std::pair<int, double>> topk_jaccard;  // indexer layer -> mean Jaccard over the rows
  std::vector<double> stream_nmse;                   // [n_layers]
};

std::vector<ReplayStepResult> run_replay_study(reference::model::Model& model, const ReplayStudyOptions& o);

// The results as a Markdown table (one row per compared step) and as JSON.
std::string replay_study_markdown(const std::vector<ReplayStepResult>& r);
std::string replay_study_json(const std::vector<ReplayStepResult>& r);

}  // namespace dsv41::scenarios::runner
