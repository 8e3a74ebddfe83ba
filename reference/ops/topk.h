// reference/ops/topk.h
//
// The dsv41 top-k selection rule, shared by the indexer's position top-k and the candidate-block
// top-k (reference/ops/indexer.h).
//
// Tie rule (a dsv41 decision; semantics.md "dsv41 decisions"): the k largest values of a row are
// chosen in the order (value descending, index ascending), so among EQUAL values the LOWER index
// (position or block) wins the last places. The official code leaves ties to torch.topk, whose CPU
// kernel follows no simple rule; the oracle run golden/oracle/tie_lowest_index.h5 is the official
// code rerun with exactly this rule (a stable descending sort).
//
// Comparison is float comparison: -inf is the smallest value and +inf the largest, -0 == +0 (a
// tie). NaN has no place in the order and is an error.
//
// Example:
//   std::vector<int64_t> top = topk_lowest_index(scores, n, 4);  // 4 indices, best first
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41::reference {

// Indices of the k largest of scores[0, n), in selection order (value descending, then index
// ascending). 0 <= k <= n. scores: [n] fp32 (bf16 values in practice); no rounding happens.
std::vector<int64_t> topk_lowest_index(const float* scores, int64_t n, int64_t k);

// The same indices in the same order as topk_lowest_index (the same errors), by one pass over the
// row that keeps the k best so far in a heap: no [n] index array, a value not better than the k-th
// best so far costs one comparison, and a run of 16 such values (none NaN) is skipped by one test. For long rows and small k (the indexer's [T, N] rows);
// tests/reference/ops/topk_scan_test.cc checks the two agree, ties and -inf included.
std::vector<int64_t> topk_lowest_index_scan(const float* scores, int64_t n, int64_t k);

}  // namespace dsv41::reference
