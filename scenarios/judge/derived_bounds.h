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

// THE ACCUMULATION an order-variant claim admits (docs/conform.md "Accumulation"):
//   kFp32            every fp32 accumulation correctly rounded, in any order (A1-A3 above)
//   kFp8TensorCore   the fp8 linears' 32-wide block dots on Hopper's fp8 tensor cores (wgmma: the
//                    products aligned to the largest one's exponent and truncated toward zero 12-13
//                    bits below it, the block sum normalised toward zero; fp8_mma_bound.h, DeepSeek-V3
//                    report §3.5.2), the rest as kFp32. What every Hopper port built on DeepGEMM-style
//                    kernels does, and the production `cuda` backend. Two more stated assumptions:
//     (A4) the truncated remainders (< q = 2^-12 of the block's largest product each) are independent
//          of the products' signs: an fp8 linear's output moves by at most 6 sigma = 6 sqrt(32/3) 2^-12
//          of the row max (A2's random signs: sqrt(sum of the block maxima^2) <= the row max), plus the
//          block sums' normalisation, 2^-13 each, sqrt(K/32) of them (A2); the normalisation's
//          systematic gain is <= 2^-13 per linear that no RMSNorm follows on the chain (row_gain's
//          chain gain: wo_b for attn_out, the three expert linears for ffn_out);
//     (A5) a quantizer fed by an fp8 linear of the chain sees every input element move by up to a
//          bf16 ulp (not one element per block, A3): each flips with probability p = 2^-7 over the
//          format's smallest relative step (E4M3 0.117, E2M1 0.023), the flips random-signed in the
//          next reduction: ulp sqrt(p + 1/n) in place of ulp/sqrt(n);
//     (A6) a component whose last linear reads such a quantizer (ffn_out, attn_out) gets its errors
//          as a linear image of the quantizer's n_q inputs: row_gain takes 6 sqrt(n / n_q) sigmas
//          (row_gain_sigmas below).
//   index_scores' row_gain and tensor statistics are measured under kFp8TensorCore (order_variant.h).
// (The claim's accumulation, at component level; `dsv41 exact`'s per-op models of one reduction are
// scenarios/exact/exact_eval.h's exact::Accumulation, the fp8 tensor-core linear's fp8_mma_bound.h.)
enum class Accumulation { kFp32, kFp8TensorCore };
const char* name(Accumulation a);  // "fp32", "fp8-tensor-core"
// A dsv41::Error naming the value and the valid names otherwise.
Accumulation accumulation_from_name(const std::string& s);

struct DerivedBound {
  std::string component;   // reference/model/hooks.h name
  std::string op;          // the producing op chain, from the forced inputs
  int64_t n = 0;           // the longest fp32 reduction on the chain (from the config)
  int bf16_roundings = 0;  // r16
  std::string quantizers;  // "E4M3 (n 128), ..." or ""
  std::string precisions;  // input, accumulation and output precisions
  bool fp32_out = false;
  double bound = 0;        // max_rowrel bound (units of the row's max |value|)
  double gain = 0;         // a systematic gain an order difference can make on the chain (row_gain)
  std::string gain_why;    // its reason ("" when 0)
  // The sigmas row_gain's lower confidence bound takes (kRowGainSigmas unless the row's errors are
  // correlated, A6 under kFp8TensorCore: row_gain_sigmas) and why.
  double gain_sigmas = 6.0;
  std::string gain_sigmas_why;
  std::string origin;      // "derived: 4 * 2^-7 + gamma_n(u32) sqrt(n), n = dim = 256; ..."
};

// The derived bound of a float component; nullopt for a component whose semantics are exact given
// equal inputs (embed, in_stream, in_pre, Engram ids, selections, caches, the DSpark embeddings).
// A DSpark block component takes its main-model twin's chain (dspark_attn_out: attn_out's). A
// dsv41::Error for an unknown component name.
std::optional<DerivedBound> derived_bound(const reference::ModelConfig& c, const std::string& component,
                                          Accumulation acc = Accumulation::kFp32);

// Every derived row of the table, in reference/model/hooks.h order.
std::vector<DerivedBound> derived_bound_table(const reference::ModelConfig& c, Accumulation acc = Accumulation::kFp32);

// The report tolerance of a derived bound (origin "analytic", note = its origin text).
reports::Tolerance derived_tolerance(const DerivedBound& b);

// max over rows of max |a - b| / max |a| (rows = the last dimension; a row whose max |a| is 0
// counts |a - b| itself; NaN/Inf pairs are left to the mask rows). Same size required.
double max_row_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                        const std::string& what);

// INDEX SCORES under order variance (docs/conform.md "Index scores"): max_rowrel over the rows
// whose scores decide a selection, each against the largest |score| of those rows in the step.
//   - A row decides nothing when every key it reaches is kept whatever the scores: at most index_topk
//     finite scores (-inf marks unreachable keys and keys outside the candidate pool) and, at the
//     candidate source layer, at most candidate_topk_blocks blocks reached. Its values cannot
//     change the forward (the top-k and the pool keep everything), so no bound is asserted on them.
//   - A score is a sum over heads of relu(q.k) x w whose terms share one scale across the step's
//     rows (RMS-normed queries and index weights, the same normed keys), while a row's realised max
//     is an order statistic over its keys and can sit far below that scale by cancellation (a row of
//     two keys peaking at a tenth of the others). The top-k's tie band takes the same scale
//     (runner/compare.cc tie_band_width).
// nullopt: no row of the step decides a selection.
struct ScoreSelection {
  int64_t topk = 0;              // index_topk
  int64_t pool_blocks = 0;       // candidate_topk_blocks at the candidate source, else 0 (no pool chosen)
  int64_t block_size = 1;        // candidate_block_size
};
ScoreSelection score_selection(const reference::ModelConfig& c, int layer);
std::optional<double> index_scores_rowrel(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                                          const ScoreSelection& s, const std::string& what);

// ROW GAIN: the statistic that sees a small systematic error of one row, which a worst-case bound
// on max_rowrel cannot (docs/conform.md "Row gain"). Per row (the last dimension, at least
// kRowGainMinLength finite pairs, sum a^2 > 0):
//   g  = <a, b - a> / <a, a>                      the row's gain error: b = (1 + e) a gives g = e
//   se = sqrt(sum r_i^2 a_i^2) / <a, a>,  r = b - a - g a
//                                                 its heteroscedasticity-robust (HC0) standard error
//   row_gain = max(0, |g| - kRowGainSigmas * se)  the lower confidence bound of |g|
// and the metric is the max over rows. An order difference's errors are rounding noise,
// uncorrelated with a (round-to-nearest-even is unbiased; a lone flipped element gives |g| ~ se),
// so its row_gain is 0 up to a kRowGainSigmas-sigma event; the only systematic gains it makes are
// those of its fp32 normalisers (RMSNorm's rsqrt, softmax's denominator: gamma_n(u32) relative).
inline constexpr const char* kRowGainMetric = "row_gain";
inline constexpr int64_t kRowGainMinLength = 16;
inline constexpr double kRowGainSigmas = 6.0;
double max_row_gain(const std::vector<float>& a, const std::vector<float>& b, int64_t row, const std::string& what,
                    double sigmas = kRowGainSigmas);
// The sigmas of a component's row_gain (its derived bound's gain_sigmas; kRowGainSigmas for a
// component without one). (A6, kFp8TensorCore only) A component whose last linear reads a quantizer
// fed by an fp8 linear (ffn_out: the act_quant before w2; attn_out: before wo_b) carries that
// quantizer's frequent flips (A5) through the linear: its row's errors are a linear image of the
// quantizer's n_q input errors, correlated across the row's n outputs, which HC0's standard error
// (independent errors per output) underestimates by up to sqrt(n / n_q): sigmas = 6 sqrt(max(1, n / n_q)).
double row_gain_sigmas(const reference::ModelConfig& c, const std::string& component,
                       Accumulation acc = Accumulation::kFp32);
// The bound of row_gain for a derived component (origin "analytic"): max(2^-12, 2 gamma_n(u32) + gain),
// n the component's longest reduction: above the systematic gain of two fp32 normalisers and the
// chain's own (attn_out: bf16 probabilities rounded relative to an order-dependent running max).
reports::Tolerance row_gain_tolerance(const DerivedBound& b);

// TENSOR STATISTICS: the same test pooled over the whole tensor (every row of every position), for
// a small systematic error spread over many rows, or over rows too short for row_gain (the mHC
// mixes: hc values a row). Over the finite pairs (at least kRowGainMinLength):
//   tensor_gain = row_gain with one row = the tensor (its HC0 standard error)
//   tensor_bias = max(0, |mean(b - a)| - kRowGainSigmas * sd(b - a) / sqrt(n)) / rms(a)
// the signed mean error against the RMS error: rounding noise has mean 0 (round-to-nearest-even is
// unbiased), an offset does not. Bounds (tensor_stat_tolerance): row_gain's; a normaliser gain g_r
// per row moves the pooled gain by at most max |g_r| and the mean by at most max |g_r| rms(a).
// ROUTED EXPERTS' TIES: the choice ranks biased gate scores s = sqrt(softplus(l / temp)) + bias with
// l = <x, w_e> an fp32 dot product of length n. Two orders differ by |dl| <= 2 gamma_n(u32) sum_i |x_i w_ei|,
// which moves s by |ds/dl| |dl|, ds/dl = sigmoid(l / temp) / (2 temp sqrt(softplus(l / temp))), plus
// 4 fp32 ulps of the score (the port's own softplus and sqrt) and one of the biased sum. Two experts
// whose biased scores lie within the sum of their bands may be ranked either way: a tie.
double expert_score_band(double logit, double abs_dot, int64_t n, double temp, double biased);
inline constexpr const char* kExpertTieNote =
    "order-variant: identical outside the tie band of the biased gate scores (per row: twice the largest expert's "
    "band, 2 gamma_n(u32) sum |x w| through d sqrt(softplus)/dl, plus 5 fp32 ulps; derived_bounds.h "
    "expert_score_band); a difference inside it is a tie";

inline constexpr const char* kTensorGainMetric = "tensor_gain";
inline constexpr const char* kTensorBiasMetric = "tensor_bias";
double tensor_gain(const std::vector<float>& a, const std::vector<float>& b, const std::string& what);
double tensor_bias(const std::vector<float>& a, const std::vector<float>& b, const std::string& what);
reports::Tolerance tensor_stat_tolerance(const DerivedBound& b, const std::string& metric);

// DECODED CACHE VALUES under order variance: a cache's bytes may differ (a quantizer input that
// differs by rounding noise can land on the other side of a rounding boundary, or move its block's
// scale), but what the bytes decode to stays close. The metric is decoded_rowrel: max_row_relative
// of the two sides' decoded entries (rows = entries), and the bound of a cache ("cache.window_kv",
// "cache.compressed_kv", "cache.index_keys", "cache.dspark_window_kv") is its pre-quantisation chain
// (as a float component's) plus both sides' quantisation error at the entry's scale, each at most
// half a step of the format's top binade relative to the block max: FP8 E4M3 + E8M0/32 2^-4;
// FP4 E2M1 + E4M3/16 (1/6)(1 + 2^-3) + 2^-4 (a scale rounded below amax/6 saturates the max);
// FP4 E2M1 + E8M0/32 1/3 (the power-of-2 scale is up to 2x amax/6). nullopt for another component.
inline constexpr const char* kDecodedRowRelMetric = "decoded_rowrel";
// And per scale block (the format's block of 16 or 32 values within an entry), the decoded values'
// gain error: max_row_gain over blocks (the lower 6-sigma bound of |<a, b-a>/<a, a>|). Each side
// rounds to nearest on its own scale's grid (unbiased), so a legitimate flip or a moved scale is
// noise; a scale byte off by one step scales its whole block (E4M3: by 1/16 to 1/8; E8M0: by 2).
inline constexpr const char* kDecodedBlockGainMetric = "decoded_block_gain";
reports::Tolerance decoded_block_gain_tolerance();
std::optional<DerivedBound> derived_cache_bound(const reference::ModelConfig& c, const std::string& component,
                                                Accumulation acc = Accumulation::kFp32);
// The same cache's pre-quantisation chain alone (what its quantizer's input may differ by between
// two orders), relative to the entry's max |value|; nullopt for another component.
std::optional<DerivedBound> derived_cache_chain_bound(const reference::ModelConfig& c, const std::string& component,
                                                      Accumulation acc = Accumulation::kFp32);
std::vector<DerivedBound> derived_cache_bound_table(const reference::ModelConfig& c,
                                                   Accumulation acc = Accumulation::kFp32);

// The relative tie band of the top-k under order variance: index_scores' bound.
double topk_tie_band(const reference::ModelConfig& c, Accumulation acc = Accumulation::kFp32);

}  // namespace dsv41::scenarios::judge
