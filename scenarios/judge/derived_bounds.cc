// scenarios/judge/derived_bounds.cc
//
// The derived default tolerances of order-variant sides (scenarios/judge/derived_bounds.h): one row per
// float component, its producing op chain read from reference/model/model.cc and
// reference/model/forward_attention.cc, its reduction lengths from the config.
#include "scenarios/judge/derived_bounds.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/error.h"
#include "reference/model/hooks.h"
#include "scenarios/judge/fp8_mma_bound.h"

namespace dsv41::scenarios::judge {

namespace {

constexpr double kU32 = 5.9604644775390625e-08;  // 2^-24
constexpr double kBf16Ulp = 0.0078125;           // 2^-7: one bf16 ulp relative to the value (at most)
constexpr double kE4M3Ulp = 0.125;               // 2^-3
constexpr double kE2M1Ulp = 0.5;                 // 2^-1 of the block's scale

double gamma_u32(int64_t n) { return static_cast<double>(n) * kU32 / (1.0 - static_cast<double>(n) * kU32); }

struct Quantizer {
  const char* format;  // "E4M3", "E2M1"
  int64_t n;           // the reduction it feeds
  const char* where;
  bool after_fp8 = false;  // its input comes from an fp8 linear of the chain (A5 under kFp8TensorCore)
};

// The fp8 linears of a chain (their reduction lengths K), for the kFp8TensorCore terms, and how many
// of them pass their systematic gain on to the component: a linear followed by an RMSNorm (wq_a ->
// q_norm, wkv -> kv_norm, main_proj -> main_norm) does not (the norm divides it out).
struct Fp8Linears {
  Accumulation acc = Accumulation::kFp32;
  std::vector<int64_t> k;
  int gain_linears = 0;
};

// Under kFp8TensorCore (derived_bounds.h "Accumulation"): one fp8 linear's term (A4) and a
// quantizer's flip probability per input element (A5).
double tensor_core_term(int64_t k) {
  return 6.0 * std::sqrt(32.0 / 3.0) * std::ldexp(1.0, -kFp8MmaKeptBits) +
         std::ldexp(1.0, -13) * std::sqrt(static_cast<double>(k) / 32.0);
}
double flip_probability(const char* format) {
  // one bf16 ulp (<= 2^-7 of the value) over the format's smallest relative step: E4M3 2^-3 / 1.875,
  // E2M1 1/3 (the step from 1.5 to 2, 3 to 4 or 4 to 6, over the value)
  return format[1] == '4' ? std::ldexp(1.0, -7) / (0.125 / 1.875) : std::ldexp(1.0, -7) * 3.0;
}

// One chain: the op, the bf16 roundings, the quantizers, the longest fp32 reduction.
DerivedBound make(const std::string& component, const std::string& op, int r16, std::vector<Quantizer> q, int64_t n,
                  const std::string& n_word, const std::string& precisions, bool fp32_out, double gain = 0,
                  std::string gain_why = "", const Fp8Linears& fp8 = {}) {
  DSV41_CHECK(n >= 1 && static_cast<double>(n) * kU32 < 0.5, "derived bound of ", component, ": reduction length ", n);
  const bool tc = fp8.acc == Accumulation::kFp8TensorCore;
  DerivedBound b;
  b.component = component;
  b.op = op;
  b.n = n;
  b.bf16_roundings = r16;
  b.precisions = precisions;
  b.fp32_out = fp32_out;
  std::ostringstream origin, qs;
  origin.precision(4);
  double bound = r16 * kBf16Ulp;
  origin << "derived (A1-A3" << (tc && !fp8.k.empty() ? ", A4-A5: fp8 tensor cores" : "") << "): ";
  if (r16 > 0) origin << r16 << " bf16 roundings x 2^-7 + ";
  for (const Quantizer& x : q) {
    DSV41_CHECK(x.n >= 1, "derived bound of ", component, ": quantizer reduction ", x.n);
    const double ulp = x.format[1] == '4' ? kE4M3Ulp : kE2M1Ulp;
    qs << (qs.tellp() > 0 ? ", " : "") << x.format << " " << x.where << " (n " << x.n << ")";
    if (tc && x.after_fp8) {  // A5: every input element may move by a bf16 ulp, each flips with p
      const double p = flip_probability(x.format);
      bound += ulp * std::sqrt(p + 1.0 / static_cast<double>(x.n));
      origin << "ulp(" << x.format << ") sqrt(" << p << " + 1/" << x.n << ") [" << x.where << ", A5] + ";
    } else {
      bound += ulp / std::sqrt(static_cast<double>(x.n));
      origin << "ulp(" << x.format << ")/sqrt(" << x.n << ") [" << x.where << "] + ";
    }
  }
  bound += gamma_u32(n) * std::sqrt(static_cast<double>(n));
  origin << "gamma_n(u32) sqrt(n), n = " << n_word << " = " << n;
  if (tc) {
    for (int64_t k : fp8.k) {
      bound += tensor_core_term(k);
      origin << " + the fp8 tensor-core block dots of a linear over K = " << k << " (A4): 6 sqrt(32/3) 2^-12 + "
             << "2^-13 sqrt(K/32)";
    }
    if (fp8.gain_linears > 0) {
      gain += fp8.gain_linears * std::ldexp(1.0, -13);
      gain_why = (gain_why.empty() ? "" : gain_why + "; ") + std::to_string(fp8.gain_linears) +
                 " fp8 linear(s) on the tensor cores not followed by an RMSNorm, each block sum normalised toward "
                 "zero: a gain <= 2^-13 each (A4)";
    }
  }
  if (fp32_out) {
    bound += 2 * kU32;
    origin << " + 2 u32 (fp32 output)";
  }
  b.quantizers = qs.str();
  b.bound = bound;
  b.gain = gain;
  b.gain_why = gain_why;
  origin << "; op: " << op << "; max |a - b| per row <= bound x the row's max |ref|";
  b.origin = origin.str();
  return b;
}

// index_scores' rows: the deciding ones, against the step's largest |score| (index_scores_rowrel).
DerivedBound step_scaled(DerivedBound b) {
  const std::string per_row = "max |a - b| per row <= bound x the row's max |ref|";
  const size_t at = b.origin.rfind(per_row);
  DSV41_CHECK(at != std::string::npos, "derived bound of ", b.component, ": no per-row statement in its origin");
  b.origin.replace(at, per_row.size(),
                   "max |a - b| per row <= bound x the step's max |ref score|, over the rows whose scores decide a "
                   "selection (judge::index_scores_rowrel: more keys reached than the top-k or the candidate pool "
                   "keeps; the step's rows share the scale of their terms, a row's own max is an order statistic "
                   "over its keys; the top-k's tie band takes the same scale)");
  return b;
}

// A6 (kFp8TensorCore): the row's last linear reads a quantizer an fp8 linear feeds (row_gain_sigmas).
DerivedBound correlated_flips(DerivedBound b, Accumulation acc, int64_t row, int64_t n_q, const char* quantizer) {
  if (acc != Accumulation::kFp8TensorCore || row <= n_q) return b;
  b.gain_sigmas = kRowGainSigmas * std::sqrt(static_cast<double>(row) / static_cast<double>(n_q));
  std::ostringstream why;
  why.precision(4);
  why << "x sqrt(" << row << "/" << n_q << ") (A6: the flips of the " << quantizer
      << " fed by an fp8 linear on the tensor cores reach the row's " << row << " outputs through one linear, "
      << "correlated errors whose spread HC0 underestimates by up to that factor)";
  b.gain_sigmas_why = why.str();
  return b;
}

}  // namespace

// The main-model component whose op chain a DSpark block component repeats (the block is written
// once, reference/model/block.h), or nullopt.
std::optional<reference::model::Component> dspark_twin(reference::model::Component id) {
  using reference::model::Component;
  switch (id) {
    case Component::kDSparkHcAttnPre: return Component::kHcAttnPre;
    case Component::kDSparkHcAttnPost: return Component::kHcAttnPost;
    case Component::kDSparkHcAttnComb: return Component::kHcAttnComb;
    case Component::kDSparkAttnIn: return Component::kAttnIn;
    case Component::kDSparkAttnOut: return Component::kAttnOut;
    case Component::kDSparkAttnStream: return Component::kAttnStream;
    case Component::kDSparkHcFfnPre: return Component::kHcFfnPre;
    case Component::kDSparkHcFfnPost: return Component::kHcFfnPost;
    case Component::kDSparkHcFfnComb: return Component::kHcFfnComb;
    case Component::kDSparkFfnIn: return Component::kFfnIn;
    case Component::kDSparkFfnOut: return Component::kFfnOut;
    case Component::kDSparkOutStream: return Component::kOutStream;
    case Component::kDSparkNormOut: return Component::kFinalNormOut;
    case Component::kDSparkHeadLogits: return Component::kLogits;
    default: return std::nullopt;
  }
}

std::optional<DerivedBound> derived_bound(const reference::ModelConfig& c, const std::string& component, Accumulation acc) {
  using reference::model::Component;
  const std::optional<Component> id = reference::model::component_from_name(component);
  DSV41_CHECK(id.has_value(), "derived bound: '", component, "' is not a component of reference/model/hooks.h");
  if (const std::optional<Component> twin = dspark_twin(*id)) {
    std::optional<DerivedBound> b = derived_bound(c, reference::model::name(*twin), acc);
    if (b) {
      b->component = component;
      b->op = std::string("the DSpark block's ") + reference::model::name(*twin) + ": " + b->op;
      b->origin = std::string("as ") + reference::model::name(*twin) + " (the same block): " + b->origin;
    }
    return b;
  }
  const int64_t D = c.dim, hc = std::max(1, c.hc_mult), ql = std::max(1, c.q_lora_rank);
  const int64_t K = std::max(1, c.window_size + c.index_topk);
  const int64_t og = std::max<int64_t>(1, static_cast<int64_t>(c.o_groups) * c.o_lora_rank);
  const int64_t Di = std::max(1, c.index_head_dim), Hi = std::max(1, c.index_n_heads);
  const int64_t inter = std::max(1, c.moe_inter_dim);
  const std::string bf = "bf16 in, fp32 accumulation, bf16 out";
  switch (*id) {
    case Component::kEngramOut:
      return make(component, "engram_lookup (exact) -> linear wkv -> engram_gate_residual (RMSNorms over dim, dot, sigmoid)",
                  3, {}, D, "dim", bf, false, 0, "", {acc, {D}, 1});
    case Component::kHcAttnPre:
    case Component::kHcAttnPost:
    case Component::kHcFfnPre:
    case Component::kHcFfnPost:
      return make(component, "hc_mixes: rsqrt over hc*dim, dot over hc*dim, sigmoid", 0, {}, hc * D, "hc*dim",
                  "bf16 stream, fp32 fn; fp32 (or wider) accumulation; fp32 out", true);
    case Component::kHcAttnComb:
    case Component::kHcFfnComb:
      return make(component,
                  "hc_mixes: dot over hc*dim, then Sinkhorn (2 x hc_sinkhorn_iters normalisations, gain 1 assumed: "
                  "no rigorous bound, docs/cuda.md)",
                  0, {}, hc * D, "hc*dim", "bf16 stream, fp32 fn; fp32 Sinkhorn; fp32 out", true);
    case Component::kAttnIn:
    case Component::kFfnIn:
    case Component::kFinalNormOut:
      return make(component, "hc_pre (sum over hc) -> rms_norm over dim", 2, {}, D, "dim", bf, false);
    case Component::kIndexScores:
      return step_scaled(make(component,
                  "wq_a -> q_norm -> idx_wq_b -> rope -> FP4 QDQ; keys: compressor -> idx_wk -> norm -> rope -> FP4; "
                  "idx_weights_proj; index_scores (dot over index_head_dim -> bf16, relu x w -> bf16, sum over heads)",
                  10, {{"E4M3", ql, "act_quant before idx_wq_b", true}, {"E2M1", Di, "FP4 q", true}, {"E2M1", Di, "FP4 keys"}},
                  std::max(D, Hi * Di), "max(dim, index heads x index_head_dim)", bf, false, 0, "", {acc, {D, ql}}));
    case Component::kAttnOut:
      return correlated_flips(make(component,
                  "q: wq_a -> q_norm -> wq_b -> rope; kv: wkv -> kv_norm -> rope -> FP8; sparse_attn over K = window + "
                  "top-k entries of head_dim (bf16 probabilities) -> inverse rope -> wo_a (grouped) -> wo_b",
                  12,
                  {{"E4M3", ql, "act_quant before wq_b", true}, {"E4M3", K, "FP8 window KV", true},
                   {"E2M1", K, "FP4 compressed KV"}, {"E4M3", og, "act_quant before wo_b", true}},
                  std::max({D, ql, og, static_cast<int64_t>(std::max(1, c.head_dim))}),
                  "max(dim, q_lora_rank, o_groups x o_lora_rank, head_dim)", bf, false, std::ldexp(1.0, -7),
                  "sparse_attn rounds each probability to bf16 relative to the running max, which depends on the "
                  "order: each coefficient of the output's few dominant value rows off by <= 2^-8 (half a bf16 "
                  "ulp, relative) on each side, a gain of <= 2^-7 (A2: no cancellation between the value rows)",
                  {acc, {D, ql, D, og}, 1}),
                              acc, D, og, "act_quant before wo_b");
    case Component::kAttnStream:
    case Component::kOutStream:
      return make(component, "hc_post: post x f + comb x stream (hc + 1 terms)", 1, {}, hc + 1, "hc + 1", bf, false);
    case Component::kFfnOut:
      return correlated_flips(
          make(component,
               "moe_experts: w1, w3 over dim -> bf16; silu x mul -> bf16; act_quant; w2 over moe_inter_dim -> bf16; "
               "weighted sum of top-k + shared experts",
               4, {{"E4M3", inter, "act_quant before w2", true}}, std::max(D, inter), "max(dim, moe_inter_dim)", bf, false,
               0, "", {acc, {D, D, inter}, 3}),
          acc, D, inter, "act_quant before w2");
    case Component::kLogits:
      return make(component, "head: linear_fp32 over dim", 0, {}, D, "dim", "bf16 in, fp32 weights and accumulation, fp32 out",
                  true);
    case Component::kDSparkMainX: {
      const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(c.dspark_target_layer_ids.size())) * D;
      return make(component, "main_proj (linear over n_targets x dim) -> main_norm (rms_norm over dim)", 2,
                  {{"E4M3", n, "act_quant before main_proj"}}, n, "n_targets x dim", bf, false, 0, "", {acc, {n}});
    }
    case Component::kDSparkMainKv:
      return make(component, "wkv -> kv_norm (rms_norm over head_dim) -> rope -> window_kv QDQ (FP8)", 3,
                  {{"E4M3", D, "act_quant before wkv"}, {"E4M3", 1, "the QDQ of each output element", true}}, D, "dim", bf,
                  false, 0, "", {acc, {D}});
    case Component::kDSparkMarkovBias:
      return make(component, "markov_head: linear_fp32 over dspark_markov_rank (of the exact Markov embedding)", 0, {},
                  std::max(1, c.dspark_markov_rank), "dspark_markov_rank",
                  "bf16 embedding, fp32 weights and accumulation, fp32 out", true);
    case Component::kDSparkLogits:
      // h W_head + e W_markov, added in fp32: one reduction of dim + rank terms in the worst order.
      return make(component,
                  "the draft head (linear_fp32 over dim) plus each slot's Markov bias (linear_fp32 over "
                  "dspark_markov_rank), added in fp32: one reduction of dim + dspark_markov_rank terms",
                  0, {}, D + std::max(1, c.dspark_markov_rank), "dim + dspark_markov_rank",
                  "bf16 in, fp32 weights and accumulation, fp32 out", true);
    case Component::kDSparkConfidence:
      return make(component,
                  "hc_pre (sum over hc) of the last block's stream -> linear_fp32 over cat(x, the Markov "
                  "embeddings): dim + dspark_markov_rank terms",
                  1, {}, D + std::max(1, c.dspark_markov_rank), "dim + dspark_markov_rank",
                  "bf16 in, fp32 weights and accumulation, fp32 out", true);
    default: return std::nullopt;
  }
}

std::vector<DerivedBound> derived_bound_table(const reference::ModelConfig& c, Accumulation acc) {
  std::vector<DerivedBound> out;
  for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
    if (c.n_mtp_layers == 0 && std::string(row.name).rfind("dspark_", 0) == 0) continue;
    if (std::optional<DerivedBound> b = derived_bound(c, row.name, acc)) out.push_back(std::move(*b));
  }
  return out;
}

reports::Tolerance derived_tolerance(const DerivedBound& b) {
  reports::Tolerance t;
  t.bound = b.bound;
  t.higher_is_better = false;
  t.origin = "analytic";
  t.note = b.origin;
  return t;
}

double max_row_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t row, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  DSV41_CHECK(row >= 1 && a.size() % static_cast<size_t>(row) == 0, what, ": ", a.size(), " values in rows of ", row);
  double worst = 0;
  for (size_t r0 = 0; r0 < a.size(); r0 += static_cast<size_t>(row)) {
    double scale = 0, diff = 0;
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

ScoreSelection score_selection(const reference::ModelConfig& c, int layer) {
  ScoreSelection s;
  s.topk = std::max(0, c.index_topk);
  s.block_size = std::max(1, c.candidate_block_size);
  s.pool_blocks = c.candidate_source_layer >= 0 && layer == c.candidate_source_layer ? std::max(0, c.candidate_topk_blocks) : 0;
  return s;
}

std::optional<double> index_scores_rowrel(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                                          const ScoreSelection& s, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  DSV41_CHECK(row >= 1 && a.size() % static_cast<size_t>(row) == 0, what, ": ", a.size(), " values in rows of ", row);
  double scale = 0;
  std::vector<double> diffs;  // max |a - b| of each deciding row
  for (size_t r0 = 0; r0 < a.size(); r0 += static_cast<size_t>(row)) {
    int64_t finite = 0, last = -1;  // A's finite scores; its last finite position (the row's reach - 1)
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      if (std::isfinite(a[i])) {
        ++finite;
        last = static_cast<int64_t>(i - r0);
      }
    }
    const int64_t blocks = (last + 1 + s.block_size - 1) / s.block_size;
    const bool pool_keeps_all = s.pool_blocks == 0 || blocks <= s.pool_blocks;  // 0: no pool is chosen here
    if (finite <= s.topk && pool_keeps_all) continue;                            // keeps every key it reaches
    double diff = 0;
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    }
    diffs.push_back(diff);
  }
  if (diffs.empty()) return std::nullopt;
  const double worst = *std::max_element(diffs.begin(), diffs.end());
  return scale > 0 ? worst / scale : worst;
}

namespace {
// A cache's pre-quantisation chain (nullopt: not a cache), its two sides' quantisation term and the
// term's text; the compressor's fp32 rows have no quantizer (quant 0, format "").
std::optional<DerivedBound> cache_chain(const reference::ModelConfig& c, const std::string& component, double& quant,
                                        std::string& format, Accumulation acc) {
  const int64_t D = std::max(1, c.dim);
  const std::string bf = "bf16 in, fp32 accumulation, bf16 values, then the cache format";
  const std::vector<Quantizer> act = {{"E4M3", D, "act_quant before the projection"}};
  std::optional<DerivedBound> b;
  quant = 0;
  format.clear();
  if (component == "cache.window_kv" || component == "cache.dspark_window_kv") {
    b = make(component, "wkv -> kv_norm -> rope -> FP8 (E4M3 + E8M0/32)", 3, act, D, "dim", bf, false, 0, "", {acc, {D}});
    quant = 2 * std::ldexp(1.0, -4);
    format = "FP8 E4M3 + E8M0/32: 2 x 2^-4";
  } else if (component == "cache.compressed_kv") {
    b = make(component, "compressor (wkv, wgate; softmax over the group, fp32) -> norm -> rope -> FP4 (E2M1 + E4M3/16)", 3,
             act, D, "dim", bf, false);
    quant = 2 * (1.0 / 6.0) * (1 + 0.125) + 0.0625;
    format = "FP4 E2M1 + E4M3/16: 2 x (1/6)(1 + 2^-3) + 2^-4";
  } else if (component == "cache.index_keys") {
    b = make(component, "the indexer's compressor -> norm -> rope -> FP4 (E2M1 + E8M0/32)", 3, act, D, "dim", bf, false);
    quant = 2 * (1.0 / 3.0);
    format = "FP4 E2M1 + E8M0/32: 2 x 1/3";
  } else if (component == "cache.compressor") {  // fp32 rows, no quantizer: the chain alone
    b = make(component, "compressor wkv / wgate: fp32 projections of attn_in (the pending group's kv and score rows)", 0,
             act, D, "dim", "bf16 in, fp32 accumulation, fp32 rows", true);
  }
  return b;
}
}  // namespace

std::optional<DerivedBound> derived_cache_chain_bound(const reference::ModelConfig& c, const std::string& component,
                                                      Accumulation acc) {
  double quant = 0;
  std::string format;
  std::optional<DerivedBound> b = cache_chain(c, component, quant, format, acc);
  if (b) b->origin = "derived: the pre-quantisation chain (" + b->origin + "), per entry: max |a - b| <= bound x the entry's max |a|";
  return b;
}

std::optional<DerivedBound> derived_cache_bound(const reference::ModelConfig& c, const std::string& component,
                                                Accumulation acc) {
  double quant = 0;
  std::string format;
  std::optional<DerivedBound> b = cache_chain(c, component, quant, format, acc);
  if (!b) return std::nullopt;
  if (component == "cache.compressor") {
    b->origin = "derived: the chain (" + b->origin + "), per pending row of dim fp32 values: max |a - b| <= bound x the row's max |a|";
    return b;
  }
  b->bound += quant;
  b->origin = "derived: the pre-quantisation chain (" + b->origin + ") + both sides' quantisation error, " + format +
              " of the block max; max |decoded a - decoded b| per entry <= bound x the entry's max |decoded a|";
  return b;
}

reports::Tolerance decoded_block_gain_tolerance() {
  reports::Tolerance t;
  t.bound = std::ldexp(1.0, -5);
  t.higher_is_better = false;
  t.origin = "analytic";
  std::ostringstream note;
  note << "derived: a scale block's gain error g = <a, b-a>/<a, a> of the decoded values, its lower " << kRowGainSigmas
       << "-sigma bound (HC0) <= 2^-5: each side rounds to nearest on its own scale's grid (unbiased: a flipped code or "
          "a moved scale is noise); a scale byte off by one step scales the block by >= 1/16 (E4M3) or 2 (E8M0)";
  t.note = note.str();
  return t;
}

std::vector<DerivedBound> derived_cache_bound_table(const reference::ModelConfig& c, Accumulation acc) {
  std::vector<DerivedBound> out;
  for (const char* k : {"cache.window_kv", "cache.compressed_kv", "cache.index_keys", "cache.compressor", "cache.dspark_window_kv"}) {
    if (c.n_mtp_layers == 0 && std::string(k) == "cache.dspark_window_kv") continue;
    out.push_back(*derived_cache_bound(c, k, acc));
  }
  return out;
}

double max_row_gain(const std::vector<float>& a, const std::vector<float>& b, int64_t row, const std::string& what,
                    double sigmas) {
  DSV41_CHECK(sigmas >= 0 && std::isfinite(sigmas), what, ": row gain sigmas ", sigmas);
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  DSV41_CHECK(row >= 1 && a.size() % static_cast<size_t>(row) == 0, what, ": ", a.size(), " values in rows of ", row);
  double worst = 0;
  for (size_t r0 = 0; r0 < a.size(); r0 += static_cast<size_t>(row)) {
    double aa = 0, ad = 0;
    int64_t n = 0;
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      const double x = a[i], d = static_cast<double>(b[i]) - x;
      aa += x * x;
      ad += x * d;
      ++n;
    }
    if (n < kRowGainMinLength || aa <= 0) continue;
    const double g = ad / aa;
    double v = 0;
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      const double x = a[i], r = static_cast<double>(b[i]) - x - g * x;
      v += r * r * x * x;
    }
    const double se = std::sqrt(v) / aa;
    worst = std::max(worst, std::fabs(g) - sigmas * se);
  }
  return worst;
}

double row_gain_sigmas(const reference::ModelConfig& c, const std::string& component, Accumulation acc) {
  const std::optional<reference::model::Component> id = reference::model::component_from_name(component);
  if (!id || reference::model::component_info(*id).kind != reference::model::ComponentKind::kTensor) return kRowGainSigmas;
  const std::optional<DerivedBound> b = derived_bound(c, component, acc);
  return b ? b->gain_sigmas : kRowGainSigmas;
}

reports::Tolerance row_gain_tolerance(const DerivedBound& b) {
  const double u32 = std::ldexp(1.0, -24);
  const double normaliser = 2.0 * static_cast<double>(b.n) * u32;  // two fp32 normalisers of length n
  std::ostringstream note;
  const double gamma = normaliser / (1.0 - normaliser / 2.0);
  const double bound = std::max(std::ldexp(1.0, -12), gamma + b.gain);
  note << "derived: a row's gain error g = <a, b-a>/<a, a>, its lower " << b.gain_sigmas
       << "-sigma bound (HC0 standard error" << (b.gain_sigmas_why.empty() ? "" : ", " + b.gain_sigmas_why)
       << "; rows of >= " << kRowGainMinLength
       << " values) must stay <= max(2^-12, 2 gamma_n(u32)" << (b.gain > 0 ? " + chain gain" : "") << ") = " << bound
       << ": an order difference's errors are unbiased rounding noise (expected 0); its systematic gains: fp32 "
          "normalisers (RMSNorm's rsqrt, softmax's denominator), <= 2 gamma_n(u32) = "
       << gamma << " (n = " << b.n << ")";
  if (b.gain > 0) note << "; chain gain " << b.gain << ": " << b.gain_why;
  note << "; a row scaled by (1+e) has g = e";
  reports::Tolerance t;
  t.bound = bound;
  t.higher_is_better = false;
  t.origin = "analytic";
  t.note = note.str();
  return t;
}

double expert_score_band(double logit, double abs_dot, int64_t n, double temp, double biased) {
  const double u32 = std::ldexp(1.0, -24);
  const double nu = static_cast<double>(n) * u32;
  const double dl = 2.0 * (nu / (1.0 - nu)) * abs_dot;
  const double z = logit / temp;
  const double softplus = z > 30 ? z : std::log1p(std::exp(z));
  const double s = std::sqrt(softplus);
  const double sigmoid = 1.0 / (1.0 + std::exp(-z));
  const double slope = s > 0 ? sigmoid / (2.0 * temp * s) : 0.0;
  return slope * dl + 4.0 * u32 * s + u32 * std::fabs(biased);
}

double tensor_gain(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  return a.empty() ? 0.0 : max_row_gain(a, b, static_cast<int64_t>(a.size()), what);
}

double tensor_bias(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  double sd = 0, sdd = 0, saa = 0;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    const double d = static_cast<double>(b[i]) - a[i];
    sd += d;
    sdd += d * d;
    saa += static_cast<double>(a[i]) * a[i];
    ++n;
  }
  if (n < kRowGainMinLength || saa <= 0) return 0.0;
  const double mean = sd / static_cast<double>(n);
  const double var = std::max(0.0, sdd / static_cast<double>(n) - mean * mean);
  const double rms_a = std::sqrt(saa / static_cast<double>(n));
  return std::max(0.0, std::fabs(mean) - kRowGainSigmas * std::sqrt(var / static_cast<double>(n))) / rms_a;
}

reports::Tolerance tensor_stat_tolerance(const DerivedBound& b, const std::string& metric) {
  reports::Tolerance t = row_gain_tolerance(b);
  const std::string what = metric == kTensorBiasMetric
                               ? "the tensor's signed mean error |mean(b-a)|, less " + std::to_string(static_cast<int>(kRowGainSigmas)) +
                                     " standard errors, over rms(a)"
                               : "the tensor's pooled gain error (every row together)";
  t.note = "derived: " + what + " must stay <= row_gain's bound " + std::to_string(t.bound) +
           " (docs/conform.md \"Tensor statistics\"): rounding noise is unbiased, and the fp32 normalisers' per-row "
           "gains move the pooled gain and the mean (over rms(a)) by at most their max. Row gain's origin: " + t.note;
  return t;
}

double topk_tie_band(const reference::ModelConfig& c, Accumulation acc) {
  return derived_bound(c, "index_scores", acc)->bound;
}

const char* name(Accumulation a) { return a == Accumulation::kFp8TensorCore ? "fp8-tensor-core" : "fp32"; }

Accumulation accumulation_from_name(const std::string& s) {
  if (s == "fp32") return Accumulation::kFp32;
  if (s == "fp8-tensor-core") return Accumulation::kFp8TensorCore;
  DSV41_FAIL("accumulation '", s, "': not one of fp32, fp8-tensor-core");
}

}  // namespace dsv41::scenarios::judge
