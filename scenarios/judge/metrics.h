// scenarios/judge/metrics.h
//
// The divergence metrics of a scenario run (docs/scenarios.md): what two sides' outputs of one
// component at one step differ by. Side A is the reference of the pair (the one whose values
// are taken as right); every metric is a pure function of the two outputs, computed in double.
//
//   tensors   NaN/Inf masks compared first (a NaN where the other side is finite is reported as
//             such, never folded into a norm), then bitwise-equal fraction, first mismatching
//             flat index, its coordinate and first differing byte (little-endian bytes of the
//             value as stored: 2 for bf16, 4 for fp32), max |d| and where, NMSE, max ULP distance
//             in the tensor's storage type
//   logits    max |d|, NMSE, KL(A || B) in nats, top-1 of each side, A's top-2 margin, and a flip
//             (top-1 differs) triaged as near_tie (A's margin <= the perturbation bound) or
//             substantive
//   indices   per row, as SETS (-1 padding ignored; order and duplicates never matter): Jaccard,
//             recall@k = |A ∩ B| / |A|, and, given A's scores, the tie band at A's k-th score and
//             whether every difference lies in it (tie_equivalent)
//   candidate pool  block recall (blocks of A's pool that B kept) separately from token recall
//   caches    bytes equal per entry, first mismatching entry and byte
//
// Tie rule (reference/ops/topk.h): among equal scores the lower position wins. Two selections that
// differ only inside the tie band are both correct selections of the same scores: a port with
// another tie rule is tie_equivalent, not wrong.
//
// Every error (shape or size mismatch, a duplicate index in a row, a non-bf16 value in a bf16
// tensor, a mask value other than 0/1) is a dsv41::Error naming `what` and the offending values.
// docs/metrics.md defines each metric exactly as computed.
//
// Example:
//   const TensorMetrics m = compare_tensors(ref_h, gpu_h, ValueType::kBf16, "layer 3 h");
//   if (!m.exact()) std::cout << "first mismatch at flat " << m.first_mismatch << " byte "
//                             << m.first_mismatch_byte << "\n";
//   const IndexMetrics k = compare_index_sets(ref_topk, gpu_topk, &ref_scores, 0.0, "layer 2 topk");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::scenarios::judge {

// How a float tensor is stored; decides the ULP and the byte of a mismatch.
enum class ValueType { kBf16, kFp32 };
const char* name(ValueType t);

struct TensorMetrics {
  int64_t count = 0;              // elements compared
  int64_t bit_equal = 0;          // elements with identical bits
  double bit_equal_frac = 1.0;    // bit_equal / count (1 for count 0)
  int64_t nan_mismatch = 0;       // elements NaN on exactly one side
  int64_t inf_mismatch = 0;       // elements without NaN that are +-Inf on exactly one side, or
                                  // Inf of opposite signs (a NaN vs Inf pair is a nan_mismatch)
  int64_t nonfinite_a = 0;        // NaN or Inf elements of A (of B:)
  int64_t nonfinite_b = 0;
  int64_t first_mismatch = -1;    // flat index of the first element whose bits differ, -1 none
  std::vector<int64_t> first_mismatch_coord;  // its coordinate in the shape
  int first_mismatch_byte = -1;   // the lowest-addressed differing byte of that element (0 = the
                                  // least significant byte of the bf16 / fp32 pattern)
  double a_at_first = 0, b_at_first = 0;  // the two values there
  double max_abs = 0;             // max |a - b| over elements finite on both sides
  int64_t max_abs_index = -1;     // where (flat; the first such), -1 when max_abs is 0
  double nmse = 0;                // sum (a-b)^2 / sum a^2 over finite pairs (sum (a-b)^2 when A is all zero)
  double max_ulp = 0;             // max ULP distance in the storage type over finite pairs
                                  // (ordered integers of the bit patterns: +0 and -0 are 0 apart)
  double a_rms = 0, b_rms = 0;    // over finite elements: the vacuous-comparison guard
  bool a_all_zero = true, b_all_zero = true;  // every element is +-0 (a NaN or Inf is not zero)
  bool exact() const { return bit_equal == count; }
};
// a, b: the same shape (else a dsv41::Error naming `what` and both shapes). Values of a kBf16
// tensor must be bf16 values (checked: the low 16 bits are zero).
TensorMetrics compare_tensors(const reference::Tensor<float>& a, const reference::Tensor<float>& b,
                              ValueType type, const std::string& what);

enum class FlipClass { kNone, kNearTie, kSubstantive };
const char* name(FlipClass c);

struct LogitMetrics {
  int64_t vocab = 0;
  double max_abs = 0;
  double nmse = 0;
  double kl = 0;              // KL(softmax(A) || softmax(B)), nats, in double
  int64_t top1_a = -1, top1_b = -1;  // argmax (the lowest index among equal maxima)
  bool top1_agree = true;
  double margin_a = 0;        // A's top-1 logit minus the best other logit (0 when tied; +inf
                              // for vocab 1)
  FlipClass flip = FlipClass::kNone;
  int64_t nonfinite_a = 0, nonfinite_b = 0;  // when either is nonzero, max_abs, nmse, kl and
                                             // margin_a are NaN, top-1 ignores NaN entries and a
                                             // flip is substantive
};
// a, b: [vocab] fp32 logits, vocab >= 1 and equal (else a dsv41::Error naming `what`).
// perturbation_bound: a flip with margin_a <= bound is a near tie (the caller states the bound
// and its origin, e.g. the pair's logits max |d| tolerance). kl is clamped at 0 (rounding).
LogitMetrics compare_logits(const std::vector<float>& a, const std::vector<float>& b,
                            double perturbation_bound, const std::string& what = "logits");

struct IndexRowMetrics {
  int64_t size_a = 0, size_b = 0;   // distinct valid (>= 0) indices
  int64_t common = 0;
  double jaccard = 1.0;             // 1 when both are empty
  double recall = 1.0;              // common / size_a, 1 when A is empty
  int64_t tie_band = -1;            // positions n in [0, N) with a finite A score within tie_eps
                                    // of s_k, A's k-th (lowest selected) score; -1 without scores
  bool tie_equivalent = false;      // size_a == size_b and every index in A xor B lies in the tie
                                    // band (true when the sets are equal)
  double score_gap_at_k = 0;        // s_k minus A's best finite unselected score; NaN when either
                                    // is missing or without scores
};
struct IndexMetrics {
  int64_t rows = 0;
  int64_t rows_equal = 0;           // rows whose sets are equal
  double min_jaccard = 1.0, mean_jaccard = 1.0;
  double min_recall = 1.0, mean_recall = 1.0;
  int64_t max_tie_band = -1;        // max over rows; -1 without scores or rows
  bool tie_equivalent = true;       // every row is
  int64_t first_row_differs = -1;
  std::vector<IndexRowMetrics> per_row;
  bool exact() const { return rows_equal == rows; }
};
// a, b: [T, k] int32 (k may differ between the sides), -1 padding. scores_a: A's scores the
// selection was made from, [T, N] (any -inf entries are unreachable); nullptr: no tie analysis
// (tie_equivalent is then true only for equal rows). A dsv41::Error naming `what`, the side, the
// row and the index: an index repeated within a row, an entry below -1, and, when scores are
// given, an A index outside [0, N) or with a NaN score. A B index >= N is a divergence (never in
// the tie band), not an error. tie_eps >= 0.
IndexMetrics compare_index_sets(const reference::Tensor<int32_t>& a, const reference::Tensor<int32_t>& b,
                                const reference::Tensor<float>* scores_a, double tie_eps,
                                const std::string& what);
// The same with a tie band per row (tie_eps[t] for row t, each >= 0; tie_eps.size() == rows):
// for selections whose scores carry a per-row error bound (the routed experts' gate scores,
// scenarios/judge/derived_bounds.h expert_score_band).
IndexMetrics compare_index_sets_banded(const reference::Tensor<int32_t>& a, const reference::Tensor<int32_t>& b,
                                       const reference::Tensor<float>& scores_a, const std::vector<double>& tie_eps,
                                       const std::string& what);

// The shape of a float difference (issue 31 item 3; shown in a failure's detail): how the finite
// pairs' ULP distances in the storage type spread, ulp_hist = counts of 0, 1, 2-4, 5-16 and > 16
// ULPs; the signed mean error against the RMS error (mean(b - a) / rms(b - a): 0 for unbiased
// rounding noise, +-1 for an offset); and the correlation of the error with the values
// (corr(a, b - a): 0 for noise, +-1 for a gain). NaN where undefined (no pair, no error).
struct ErrorShape {
  std::vector<int64_t> ulp_hist = std::vector<int64_t>(5, 0);
  double mean_over_rms = 0;
  double corr = 0;
};
ErrorShape error_shape(const std::vector<float>& a, const std::vector<float>& b, ValueType t, const std::string& what);
// "ulps 0/1/2-4/5-16/>16: 90%/8%/2%/0%/0%; mean/rms error +0.02; corr(ref, error) +0.01"
std::string describe(const ErrorShape& e);

struct CandidateMetrics {
  int64_t rows = 0, rows_equal = 0;
  double min_block_recall = 1.0, mean_block_recall = 1.0;   // A's blocks kept by B
  double min_token_recall = 1.0, mean_token_recall = 1.0;   // A's positions kept by B
  int64_t first_row_differs = -1;
  bool exact() const { return rows_equal == rows; }
};
// a, b: [T, N] uint8 masks (1 = kept; any other value than 0/1 is an error), the same shape.
// block_size >= 1: the candidate block size; block j of a row is positions
// [j * block_size, min(N, (j + 1) * block_size)), kept when any of its positions is.
CandidateMetrics compare_candidates(const reference::Tensor<uint8_t>& a, const reference::Tensor<uint8_t>& b,
                                    int block_size, const std::string& what);

// Level-2 recall of an index layer that reads the candidate pool: recall of A's selection
// restricted to the positions that lie inside B's candidate pool, so a wrong pool (level 1)
// does not count against the consumer layer (level 2). topk: [T, k], mask_b: [T, N]. Mean over
// rows of |A ∩ B ∩ M_B| / |A ∩ M_B| (a row counts 1 when the denominator is 0; 1 for T = 0).
// Index rows are checked as in compare_index_sets; an A index >= N is an error.
double recall_within_candidates(const reference::Tensor<int32_t>& topk_a, const reference::Tensor<int32_t>& topk_b,
                                const reference::Tensor<uint8_t>& mask_b,
                                const std::string& what = "recall_within_candidates");

struct BytesMetrics {
  int64_t entries = 0, entries_equal = 0;
  int64_t bytes = 0, bytes_equal = 0;
  int64_t first_mismatch_entry = -1;
  int64_t first_mismatch_byte = -1;  // byte offset inside that entry
  bool exact() const { return bytes_equal == bytes; }
};
// a, b: packed caches of `entries` entries of entry_bytes each (sizes must agree and be a
// multiple of entry_bytes >= 1).
BytesMetrics compare_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int64_t entry_bytes,
                           const std::string& what);

// Exact integer tensors (Engram ids, MoE experts as ordered lists): equal elements, first mismatch.
struct IntMetrics {
  int64_t count = 0, equal = 0;
  int64_t first_mismatch = -1;
  bool exact() const { return equal == count; }
};
// a, b: the same length (else a dsv41::Error naming `what`).
IntMetrics compare_ints(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::string& what);

}  // namespace dsv41::scenarios::judge
