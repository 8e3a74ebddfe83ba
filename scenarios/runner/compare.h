// scenarios/runner/compare.h
//
// Compares two captures of the same step (side A = the reference of the pair) and turns the
// metrics (scenarios/judge/metrics.h) into report rows with verdicts, by the pair's expectation:
//   bitexact   every output bit-equal, every index set and cache byte equal (tolerance 0,
//              origin stated: the pair's reason)
//   tolerance  the pair's tolerance rules (ToleranceRule, first match wins; an output that no
//              rule covers is an error, never a silent pass) plus the analytic rules that hold
//              for every pair: Engram ids equal (integer hash), no NaN/Inf where A is finite.
//              An ORDER-VARIANT pair (CompareContext::derived) is judged as `dsv41 conform`
//              judges an order-variant port (scenarios/judge/order_variant.h): every row no
//              explicit rule bounds gets its derived bound, tie rule or exactness, or is measured
//              where no bound is derivable (docs/scenarios.md "Order-variant pairs")
//   measured   every metric recorded, none asserted
// Rows come out in the item order of A's capture, so the first failing row is the first
// divergence of the step.
#pragma once

#include <optional>
#include <map>
#include <string>
#include <vector>

#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

struct CompareContext {
  int64_t step = 0;
  int session = 0;
  judge::Expectation expect = judge::Expectation::kMeasured;
  std::string why;                          // origin note of bitexact rows
  const std::vector<judge::ToleranceRule>* rules = nullptr;  // kTolerance
  int candidate_block_size = 8;
  int candidate_source_layer = -1;
  bool teacher_forced = false;
  // The top-k's tie band relative to the row's max |index score| (0: exact ties only); an
  // order-variant side's index scores move by up to their derived bound (scenarios/judge/derived_bounds.h).
  double topk_tie_rel = 0;
  // Side A's routed-expert scores by layer, for the experts' tie analysis (conform, order-variant):
  // the biased gate scores [T, E] the choice ranks and each row's tie band (derived_bounds.h
  // expert_score_band). Empty: experts are compared as sets without ties.
  struct ExpertScores {
    reference::Tensor<float> biased;
    std::vector<double> band;
  };
  std::map<int, ExpertScores> expert_scores;
  // An order-variant pair: the config whose derived bounds judge every row no explicit rule
  // bounds (nullptr: the rules alone). Teacher-forced: each component's own derived bound, the
  // selections' tie rule, the caches' decoded bound, a logits flip only inside the tie band.
  // Free-running: the chain bound (judge::free_running_bound) on a session's first step from
  // position 0 (chain_bounded), where every difference comes from this step's own computation;
  // elsewhere the state carries earlier steps' differences through selections: measured.
  const reference::ModelConfig* derived = nullptr;
  // The accumulation the pair's order-variant claim admits (runner::backend_accumulation of either
  // side: kFp8TensorCore when one side runs fp8 linears on tensor cores).
  judge::Accumulation accumulation = judge::Accumulation::kFp32;
  bool chain_bounded = false;
  // Teacher-forced, an order-variant pair: the session's caches hold rows no forcing reached (a
  // speculative round's rollback replays the kept tokens hook-free, reference::model::roll_back):
  // the caches' decoded values and their readers (attn_out, index_scores, topk, candidates,
  // dspark_attn_out) are measured (validity is still exact).
  bool unforced_caches = false;
};

struct StepComparison {
  std::vector<reports::MetricRow> rows;
  int64_t items = 0;          // outputs compared
  std::vector<std::string> vacuous_items;  // float outputs all zero on both sides ("attn_out (layer 3, step 2)")
  std::vector<std::string> nonfinite_items;  // float outputs holding NaN or Inf on a side (index_scores: NaN;
                                             // its -inf marks unreachable positions)
  std::vector<std::string> notes;
  // The first failing row's detail (coordinate, byte, values), for the Divergence.
  std::string first_failure_detail;
  int first_failure_row = -1;
};

StepComparison compare_step(const StepCapture& a, const StepCapture& b, const CompareContext& ctx);

// The candidate pool's tie rule. The pool is a top-k over block scores (each block's max index
// score, the newest block pinned: reference/ops/indexer.h candidate_block_scores), so two pools
// that differ only in blocks whose A score lies in the tie band at A's last kept block's score
// are both correct selections, as for topk. ma, mb: [T, N] masks; A's block scores are rebuilt
// from A's index_scores of `layer` in `a` (each row's reach: its last finite score + 1, since
// index_scores marks the unreachable -inf); tie band: tie_rel x the largest |index score| (0:
// exact ties only). Returns the block sets' metrics, or nullopt when `a` holds no such scores.
std::optional<judge::IndexMetrics> candidate_block_ties(const reference::Tensor<uint8_t>& ma,
                                                       const reference::Tensor<uint8_t>& mb, const StepCapture& a,
                                                       int layer, int block_size, double tie_rel,
                                                       const std::string& what);

// The experts' tie analysis of one layer (order-variant sides): side A's biased gate scores [T, E]
// from the gate's input x [T, dim] (A's ffn_in) and each row's tie band (derived_bounds.h
// expert_score_band: twice the largest expert's band).
CompareContext::ExpertScores expert_tie_scores(const reference::Tensor<float>& x, const reference::checkpoint::BlockWeights& bw,
                                               const reference::ModelConfig& c, int layer);

// Every metric name compare_step and the probe rows write (docs/scenarios.md).
const std::vector<std::string>& known_metrics();

// The default rules of a "tolerance" pair (docs/scenarios.md gives their origins).
std::vector<judge::ToleranceRule> default_tolerance_rules();

}  // namespace dsv41::scenarios::runner
