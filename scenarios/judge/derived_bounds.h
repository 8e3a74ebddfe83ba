// scenarios/judge/derived_bounds.h
//
// The derived default tolerance of each float component for a side that claims ORDER-VARIANT
// results (a port or backend that computes the reference's function in the reference's precisions
// but sums in its own order: tensor cores, split-K, fused kernels), docs/conform.md "Claims".
// One place for `dsv41 conform --order-variant` and for `dsv41 run`'s comparison of a backend that
// declares itself order-variant.
//
// The metric is max_rowrel: over every row (the last dimension) of a component, max |a - b| over
// the row divided by the row's max |a| (a = the reference recomputed from the same inputs). The
// bound of a component is derived from the op chain that produces it from its (teacher-forced)
// inputs, in units of the row's max |value|:
//
//   bound = r16 * 2^-7                      one bf16 ulp per bf16 rounding on the chain
//         + sum_q  ulp_rel(q) / sqrt(n_q)   one flipped element per quantizer q (E4M3 2^-3, E2M1
//                                           2^-1 of its block) feeding a reduction of length n_q
//         + gamma_n(u32) * sqrt(n)          the fp32 accumulation of the chain's longest reduction
//         + 2 u_out                         the final rounding when the output is fp32
//
// under three stated assumptions (the tolerance file overrides any of it): (A1) every stage
// passes a perturbation of e (row scale) on as at most e (row scale) (gain 1: normalised weights,
// RMSNorm between the stages); (A2) no cancellation beyond sum |terms| <= sqrt(n) * row max |y|
// (random-sign operands); (A3) an order difference flips at most one element of a quantizer's
// input block, whose share of the next reduction is 1/sqrt(n). The per-op bounds that assume
// nothing (exact evaluation, docs/cuda.md) are `dsv41 exact`'s.
//
// Example:
//   for (const DerivedBound& b : derived_bound_table(config)) std::cout << b.component << " " << b.bound;
//   std::optional<DerivedBound> b = derived_bound(config, "attn_out");  // nullopt: exact component
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/tensor.h"
#include "reports/report.h"

namespace dsv41::scenarios::judge {

inline constexpr const char* kRowRelMetric = "max_rowrel";

struct DerivedBound {
  std::string component;   // reference/model/hooks.h name
  std::string op;          // the producing op chain, from the forced inputs
  int64_t n = 0;           // the longest fp32 reduction on the chain (from the config)
  int bf16_roundings = 0;  // r16
  std::string quantizers;  // "E4M3 (n 128), ..." or ""
  std::string precisions;  // input, accumulation and output precisions
  bool fp32_out = false;
  double bound = 0;        // max_rowrel bound (units of the row's max |value|)
  std::string origin;      // "derived: 4 * 2^-7 + gamma_n(u32) sqrt(n), n = dim = 256; ..."
};

// The derived bound of a float component; nullopt for a component whose semantics are exact given
// equal inputs (embed, in_stream, in_pre, Engram ids, selections, caches) or one not derived here
// (DSpark drafts). A dsv41::Error for an unknown component name.
std::optional<DerivedBound> derived_bound(const reference::ModelConfig& c, const std::string& component);

// Every derived row of the table, in reference/model/hooks.h order.
std::vector<DerivedBound> derived_bound_table(const reference::ModelConfig& c);

// The report tolerance of a derived bound (origin "analytic", note = its origin text).
reports::Tolerance derived_tolerance(const DerivedBound& b);

// max over rows of max |a - b| / max |a| (rows = the last dimension; a row whose max |a| is 0
// counts |a - b| itself; NaN/Inf pairs are left to the mask rows). Same size required.
double max_row_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                        const std::string& what);

// The relative tie band of the top-k under order variance: index_scores' bound.
double topk_tie_band(const reference::ModelConfig& c);

}  // namespace dsv41::scenarios::judge
