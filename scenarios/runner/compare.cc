#include "scenarios/runner/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "reference/ops/indexer.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/runner/compare_internal.h"

namespace dsv41::scenarios::runner {

using compare_detail::align;
using compare_detail::Rows;
using compare_detail::tail_rows;

namespace {

using reference::Tensor;
using reports::MetricRow;
using reports::Tolerance;
using reports::Verdict;

std::string coord_str(const std::vector<int64_t>& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + "]";
}

// The tie band's width: tie_rel x the largest finite |score| (0: exact ties only).
double tie_band_width(const Tensor<float>& scores, double tie_rel) {
  double eps = 0;
  if (tie_rel <= 0) return eps;
  for (const float v : scores.data()) {
    if (std::isfinite(v)) eps = std::max(eps, tie_rel * std::fabs(static_cast<double>(v)));
  }
  return eps;
}

std::string what_of(const CapturedItem& it, const CompareContext& ctx) {
  return it.component + " (layer " + std::to_string(it.layer) + ", step " + std::to_string(ctx.step) + ")";
}

std::string float_detail(const judge::TensorMetrics& m) {
  std::ostringstream s;
  if (m.nan_mismatch + m.inf_mismatch > 0) s << m.nan_mismatch << " NaN / " << m.inf_mismatch << " Inf masks differ; ";
  if (m.first_mismatch >= 0) {
    s.precision(9);
    s << "first mismatch at " << coord_str(m.first_mismatch_coord) << " byte " << m.first_mismatch_byte
      << ": a=" << m.a_at_first << " b=" << m.b_at_first << "; " << (m.count - m.bit_equal) << " of " << m.count
      << " differ, max ulp " << m.max_ulp << ", nmse " << m.nmse;
  }
  return s.str();
}

// Whether a float output holds a value no comparison can vouch for: NaN or Inf on either side
// (index_scores: NaN only; its -inf marks unreachable positions, docs/indexer.md).
bool has_nonfinite(const std::string& component, const Tensor<float>& a, const Tensor<float>& b) {
  const bool scores = component == "index_scores";
  for (const Tensor<float>* t : {&a, &b}) {
    for (float v : t->data()) {
      if (scores ? std::isnan(v) : !std::isfinite(v)) return true;
    }
  }
  return false;
}

// An order-variant pair's statistics of a float output (conform's, docs/conform.md): max_rowrel
// (per row of `row` values, against the derived bound), row_gain, tensor_gain and tensor_bias.
void add_order_variant_rows(int layer, const std::string& c, const std::vector<float>& a, const std::vector<float>& b,
                            int64_t row, Rows& rows, const std::string& detail, const CompareContext& ctx) {
  const std::string what = c + " (layer " + std::to_string(layer) + ")";
  const int64_t n = std::max<int64_t>(1, row);
  const double sigmas = judge::row_gain_sigmas(*ctx.derived, c, ctx.accumulation);
  if (c != "index_scores") {
    rows.add(layer, c, judge::kRowRelMetric, judge::max_row_relative(a, b, n, what), std::nullopt, std::nullopt, detail);
  } else if (const std::optional<double> v =
                 judge::index_scores_rowrel(a, b, n, judge::score_selection(*ctx.derived, layer), what)) {
    rows.add(layer, c, judge::kRowRelMetric, *v, std::nullopt, std::nullopt, detail);  // else no row decides a selection
  }
  rows.add(layer, c, judge::kRowGainMetric, judge::max_row_gain(a, b, n, what, sigmas), std::nullopt, std::nullopt,
           detail);
  rows.add(layer, c, judge::kTensorGainMetric, judge::tensor_gain(a, b, what), std::nullopt, std::nullopt, detail);
  rows.add(layer, c, judge::kTensorBiasMetric, judge::tensor_bias(a, b, what), std::nullopt, std::nullopt, detail);
}

void compare_float(const CapturedItem& ia, const CapturedItem& ib, Rows& rows, StepComparison& out,
                   const CompareContext& ctx) {
  Tensor<float> a = ia.f;
  if (align(a, ib.f)) out.notes.push_back(ia.component + " layer " + std::to_string(ia.layer) + ": rows aligned by tail");
  const std::string what = ia.component + " (layer " + std::to_string(ia.layer) + ", step " + std::to_string(ctx.step) + ")";
  const judge::TensorMetrics m = compare_tensors(a, ib.f, ia.type, what);
  // An empty item ([T, 0] index_scores of a layer with no compressed position yet) holds nothing to vouch for.
  if (a.numel() > 0 && m.a_all_zero && m.b_all_zero) out.vacuous_items.push_back(what);
  if (has_nonfinite(ia.component, a, ib.f)) out.nonfinite_items.push_back(what);
  const std::string d = float_detail(m);
  const int L = ia.layer;
  const std::string& c = ia.component;
  rows.begin_item();
  if (c == "index_scores") {
    // -inf marks unreachable positions and positions outside the candidate pool: where two
    // pools legitimately differ (a tolerance pair), so does the -inf mask. NaN never may.
    rows.add(L, c, "nonfinite_mismatch", static_cast<double>(m.nan_mismatch + m.inf_mismatch),
             rows.stated_exact(false, 0), std::nullopt, d);
    rows.add(L, c, "nan_mismatch", static_cast<double>(m.nan_mismatch), rows.stated_exact(false, 0),
             judge::make_tolerance(0, false, "stated", "NaN masks are compared before any numeric tolerance"), d);
  } else {
    rows.add(L, c, "nonfinite_mismatch", static_cast<double>(m.nan_mismatch + m.inf_mismatch),
             rows.stated_exact(false, 0), judge::make_tolerance(0, false, "stated", "NaN/Inf masks are compared before any numeric tolerance"),
             d);
  }
  rows.add(L, c, "bit_equal_frac", m.bit_equal_frac, rows.stated_exact(true, 1.0), std::nullopt, d);
  rows.add(L, c, "max_ulp", m.max_ulp, std::nullopt, std::nullopt, d);
  rows.add(L, c, "max_abs", m.max_abs, std::nullopt, std::nullopt, d);
  rows.add(L, c, "nmse", m.nmse, std::nullopt, std::nullopt, d);
  rows.add(L, c, "first_mismatch", static_cast<double>(m.first_mismatch), std::nullopt, std::nullopt, d);
  rows.add(L, c, "first_mismatch_byte", static_cast<double>(m.first_mismatch_byte), std::nullopt, std::nullopt, d);
  if (ctx.derived != nullptr && a.shape() == ib.f.shape() && a.rank() > 0 && a.numel() > 0) {
    add_order_variant_rows(L, c, a.data(), ib.f.data(), a.dim(a.rank() - 1), rows, d, ctx);
  }
  rows.end_item(L, c, true);
}

void compare_logits_item(const StepCapture& a, const StepCapture& b, Rows& rows, const CompareContext& ctx,
                         StepComparison& out) {
  // [R, V]: the last position's logits (R = 1), or every kept position's of a speculative round.
  const int64_t R = a.logit_rows, n = static_cast<int64_t>(a.logits.size());
  DSV41_CHECK(R >= 1 && b.logit_rows == R && n > 0 && n % R == 0 && b.logits.size() == a.logits.size(), "step ",
              ctx.step, ": logits of ", a.logit_rows, " x ", a.logits.size(), " and ", b.logit_rows, " x ",
              b.logits.size(), " entries");
  const int64_t V = n / R;
  const Tensor<float> ta({R, V}, a.logits, "logits"), tb({R, V}, b.logits, "logits");
  const judge::TensorMetrics m = judge::compare_tensors(ta, tb, judge::ValueType::kFp32, "logits (step " + std::to_string(ctx.step) + ")");
  if (m.a_all_zero && m.b_all_zero) out.vacuous_items.push_back("logits (step " + std::to_string(ctx.step) + ")");
  if (m.nonfinite_a + m.nonfinite_b > 0) out.nonfinite_items.push_back("logits (step " + std::to_string(ctx.step) + ")");
  // The perturbation a pair is allowed: a flip where A's top-2 margin is within twice the allowed
  // max |d| can come from a perturbation inside the tolerance (near tie); 0 for bitexact pairs.
  double bound = 0;
  const judge::ToleranceRule* rule =
      ctx.expect != judge::Expectation::kBitExact && ctx.rules ? judge::rule_for(*ctx.rules, "logits", "max_abs") : nullptr;
  if (rule != nullptr) bound = 2 * rule->tolerance.bound;
  // An order-variant pair, teacher-forced: each logit within the derived bound x its row's max |A|
  // (derived_bounds.h, the head's fp32 linear), so a flip is a tie where the margin is within twice that.
  double derived_rel = 0;
  if (rule == nullptr && ctx.derived != nullptr && ctx.teacher_forced) {
    if (const std::optional<judge::DerivedBound> b = judge::derived_bound(*ctx.derived, "logits", ctx.accumulation)) derived_rel = b->bound;
  }
  // Per row; the worst row speaks for the item (the first flip, else the largest KL).
  judge::LogitMetrics lm;
  int64_t worst = 0;
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> ra(a.logits.begin() + r * V, a.logits.begin() + (r + 1) * V);
    const std::vector<float> rb(b.logits.begin() + r * V, b.logits.begin() + (r + 1) * V);
    double row_bound = bound;
    if (derived_rel > 0) {
      double peak = 0;
      for (const float v : ra) peak = std::isfinite(v) ? std::max(peak, std::fabs(static_cast<double>(v))) : peak;
      row_bound = 2 * derived_rel * peak;
    }
    const judge::LogitMetrics row = judge::compare_logits(ra, rb, row_bound);
    const bool worse = r == 0 || row.flip > lm.flip || (row.flip == lm.flip && !(row.kl <= lm.kl));
    if (worse) {
      lm = row;
      worst = r;
    }
  }
  std::ostringstream d;
  if (R > 1) d << "row " << worst << " of " << R << ": ";
  d << "top-1 a=" << lm.top1_a << " b=" << lm.top1_b << ", A's top-2 margin " << lm.margin_a << ", max |d| "
    << m.max_abs << ", KL " << lm.kl << "; " << float_detail(m);
  rows.begin_item();
  rows.add(-1, "logits", "nonfinite_mismatch", static_cast<double>(m.nan_mismatch + m.inf_mismatch),
           rows.stated_exact(false, 0), judge::make_tolerance(0, false, "stated", "NaN/Inf masks are compared before any numeric tolerance"),
           d.str());
  rows.add(-1, "logits", "bit_equal_frac", m.bit_equal_frac, rows.stated_exact(true, 1.0), std::nullopt, d.str());
  rows.add(-1, "logits", "max_abs", m.max_abs, std::nullopt, std::nullopt, d.str());
  rows.add(-1, "logits", "nmse", m.nmse, std::nullopt, std::nullopt, d.str());
  rows.add(-1, "logits", "kl", lm.kl, std::nullopt, std::nullopt, d.str());
  rows.add(-1, "logits", "top1_agree", lm.top1_agree ? 1.0 : 0.0, std::nullopt, std::nullopt, d.str());
  rows.add(-1, "logits", "margin_a", lm.margin_a, std::nullopt, std::nullopt, d.str());
  rows.add(-1, "logits", "flip_class", static_cast<double>(lm.flip), std::nullopt, std::nullopt, d.str());
  if (ctx.derived != nullptr) add_order_variant_rows(-1, "logits", a.logits, b.logits, V, rows, d.str(), ctx);
  rows.end_item(-1, "logits", true);
}

void compare_index(const CapturedItem& ia, const CapturedItem& ib, const StepCapture& a, const StepCapture& b,
                   Rows& rows, StepComparison& out, const CompareContext& ctx) {
  Tensor<int32_t> ta = ia.i;
  if (align(ta, ib.i)) out.notes.push_back(ia.component + " layer " + std::to_string(ia.layer) + ": rows aligned by tail");
  const CapturedItem* scores = ia.component == "topk" ? a.find(ia.layer, "index_scores") : nullptr;
  Tensor<float> sa;
  if (scores != nullptr) {
    sa = scores->f;
    DSV41_CHECK(sa.dim(0) >= ta.dim(0), what_of(ia, ctx), ": side A has ", sa.dim(0), " rows of index scores for ",
                ta.dim(0), " rows of top-k");
    if (sa.dim(0) != ta.dim(0)) sa = tail_rows(sa, ta.dim(0));
  }
  const std::string what = ia.component + " (layer " + std::to_string(ia.layer) + ", step " + std::to_string(ctx.step) + ")";
  const auto experts = ia.component == "experts" ? ctx.expert_scores.find(ia.layer) : ctx.expert_scores.end();
  const bool expert_ties = experts != ctx.expert_scores.end() && experts->second.biased.rank() == 2 &&
                           experts->second.biased.dim(0) == ta.dim(0);
  const double tie_eps = scores != nullptr ? tie_band_width(sa, ctx.topk_tie_rel) : 0.0;
  const judge::IndexMetrics m =
      expert_ties ? judge::compare_index_sets_banded(ta, ib.i, experts->second.biased, experts->second.band, what)
                  : judge::compare_index_sets(ta, ib.i, scores ? &sa : nullptr, tie_eps, what);
  std::ostringstream d;
  if (m.first_row_differs >= 0) {
    const judge::IndexRowMetrics& r = m.per_row[static_cast<size_t>(m.first_row_differs)];
    d << "first differing row " << m.first_row_differs << ": jaccard " << r.jaccard << ", recall " << r.recall
      << ", tie band " << r.tie_band
      << (r.tie_band < 0 ? "" : r.tie_equivalent ? " (every difference is a tie: inside the band; another tie rule)" : " (differences outside the tie band: not a tie)");
  }
  const int L = ia.layer;
  const std::string& c = ia.component;
  const double rows_equal = m.rows ? static_cast<double>(m.rows_equal) / static_cast<double>(m.rows) : 1.0;
  rows.begin_item();
  rows.add(L, c, "rows_equal_frac", rows_equal, rows.stated_exact(true, 1.0), std::nullopt, d.str());
  rows.add(L, c, "jaccard_min", m.min_jaccard, std::nullopt, std::nullopt, d.str());
  rows.add(L, c, "recall_min", m.min_recall, std::nullopt, std::nullopt, d.str());
  rows.add(L, c, "recall_mean", m.mean_recall, std::nullopt, std::nullopt, d.str());
  if (scores != nullptr || expert_ties) {
    rows.add(L, c, "tie_band_max", static_cast<double>(m.max_tie_band), std::nullopt, std::nullopt, d.str());
    rows.add(L, c, "tie_equivalent", m.tie_equivalent ? 1.0 : 0.0, std::nullopt, std::nullopt, d.str());
  }
  // Level 2 of the hierarchical indexer: recall inside B's own candidate pool, so that a wrong
  // pool (level 1) does not count against this layer. Free-running only (forced B uses A's pool).
  if (c == "topk" && !ctx.teacher_forced && ctx.candidate_source_layer >= 0 && L > ctx.candidate_source_layer) {
    const CapturedItem* mb = b.find(ctx.candidate_source_layer, "candidates");
    if (mb != nullptr && mb->m.dim(0) == ib.i.dim(0)) {
      rows.add(L, c, "recall_within_candidates", judge::recall_within_candidates(ta, ib.i, mb->m), std::nullopt,
               std::nullopt, d.str());
    }
  }
  rows.end_item(L, c, true);
}

// The candidate blocks of each row of a mask [T, N] (a block is kept when any of its positions
// is), as index rows [T, max kept] with -1 padding: the selection the indexer made.
Tensor<int32_t> kept_blocks(const Tensor<uint8_t>& mask, int block_size) {
  const int64_t rows = mask.dim(0), n = mask.dim(1), blocks = (n + block_size - 1) / block_size;
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(rows));
  size_t width = 0;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      for (int64_t p = blk * block_size; p < std::min(n, (blk + 1) * block_size); ++p) {
        if (mask.data()[static_cast<size_t>(t * n + p)] != 0) {
          kept[static_cast<size_t>(t)].push_back(static_cast<int32_t>(blk));
          break;
        }
      }
    }
    width = std::max(width, kept[static_cast<size_t>(t)].size());
  }
  Tensor<int32_t> out({rows, static_cast<int64_t>(width)}, "candidate_blocks", -1);
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<int32_t>& k = kept[static_cast<size_t>(t)];
    std::copy(k.begin(), k.end(), out.data().begin() + t * static_cast<int64_t>(width));
  }
  return out;
}

void compare_mask(const CapturedItem& ia, const CapturedItem& ib, const StepCapture& a, Rows& rows,
                  StepComparison& out, const CompareContext& ctx) {
  Tensor<uint8_t> ta = ia.m;
  if (align(ta, ib.m)) out.notes.push_back(ia.component + " layer " + std::to_string(ia.layer) + ": rows aligned by tail");
  const std::string what = ia.component + " (layer " + std::to_string(ia.layer) + ", step " + std::to_string(ctx.step) + ")";
  const judge::CandidateMetrics m = judge::compare_candidates(ta, ib.m, ctx.candidate_block_size, what);
  const std::optional<judge::IndexMetrics> ties =
      candidate_block_ties(ta, ib.m, a, ia.layer, ctx.candidate_block_size, ctx.topk_tie_rel, what);
  std::ostringstream d;
  if (m.first_row_differs >= 0) {
    d << "first differing row " << m.first_row_differs;
    if (ties) {
      const judge::IndexMetrics& b = *ties;
      if (b.first_row_differs >= 0) {
        const judge::IndexRowMetrics& r = b.per_row[static_cast<size_t>(b.first_row_differs)];
        d << ": blocks jaccard " << r.jaccard << ", tie band " << r.tie_band << " blocks";
      }
      d << (b.tie_equivalent ? "; every differing block is a tie: its block score lies in the tie band at A's last "
                               "kept block's score (another tie rule; the reference's lower block wins)"
                             : "; blocks differ outside the tie band (not a tie)");
    }
  }
  const int L = ia.layer;
  const std::string& c = ia.component;
  rows.begin_item();
  rows.add(L, c, "rows_equal_frac", m.rows ? static_cast<double>(m.rows_equal) / static_cast<double>(m.rows) : 1.0,
           rows.stated_exact(true, 1.0), std::nullopt, d.str());
  rows.add(L, c, "block_recall_min", m.min_block_recall, std::nullopt, std::nullopt, d.str());
  rows.add(L, c, "token_recall_min", m.min_token_recall, std::nullopt, std::nullopt, d.str());
  if (ties) {
    rows.add(L, c, "tie_band_max", static_cast<double>(ties->max_tie_band), std::nullopt, std::nullopt, d.str());
    rows.add(L, c, "tie_equivalent", ties->tie_equivalent ? 1.0 : 0.0, std::nullopt, std::nullopt, d.str());
  }
  rows.end_item(L, c, true);
}

void compare_ids(const CapturedItem& ia, const CapturedItem& ib, Rows& rows, const CompareContext& ctx) {
  std::vector<int64_t> a = ia.ids;
  if (a.size() > ib.ids.size() && !ib.ids.empty() && ia.ids_shape.size() == 2 && ib.ids_shape.size() == 2 &&
      ia.ids_shape[1] == ib.ids_shape[1]) {
    a.erase(a.begin(), a.end() - static_cast<std::ptrdiff_t>(ib.ids.size()));
  }
  const judge::IntMetrics m = judge::compare_ints(
      a, ib.ids, ia.component + " (layer " + std::to_string(ia.layer) + ", step " + std::to_string(ctx.step) + ")");
  const std::string d = m.first_mismatch >= 0 ? "first mismatch at flat index " + std::to_string(m.first_mismatch) : "";
  // Engram ids are exact on every pair; an accept decision [m, next token] only where the logits
  // are (bitexact pairs): elsewhere a near-tie flip of the target's argmax may change it (measured).
  const bool accept = ia.component == reference::model::name(reference::model::Component::kAccept);
  std::optional<reports::Tolerance> t;
  if (!accept) t = judge::make_tolerance(1.0, true, "analytic", "Engram ids are an integer hash of the token ids: exact on every backend");
  rows.begin_item();
  rows.add(ia.layer, ia.component, "equal_frac",
           m.count ? static_cast<double>(m.equal) / static_cast<double>(m.count) : 1.0, rows.stated_exact(true, 1.0),
           t, accept ? "accept [m, next token]: a=[" + std::to_string(ia.ids.at(0)) + ", " + std::to_string(ia.ids.at(1)) +
                           "] b=[" + std::to_string(ib.ids.at(0)) + ", " + std::to_string(ib.ids.at(1)) + "]"
                     : d);
  rows.end_item(ia.layer, ia.component, false);
}

}  // namespace

std::optional<judge::IndexMetrics> candidate_block_ties(const Tensor<uint8_t>& ma, const Tensor<uint8_t>& mb,
                                                       const StepCapture& a, int layer, int block_size,
                                                       double tie_rel, const std::string& what) {
  const CapturedItem* scores = a.find(layer, "index_scores");
  if (scores == nullptr || scores->f.rank() != 2 || ma.rank() != 2 || scores->f.dim(1) != ma.dim(1) ||
      scores->f.dim(0) < ma.dim(0) || mb.shape() != ma.shape()) {
    return std::nullopt;
  }
  const Tensor<float> sa = scores->f.dim(0) == ma.dim(0) ? scores->f : tail_rows(scores->f, ma.dim(0));
  const int64_t rows = sa.dim(0), n = sa.dim(1);
  std::vector<int64_t> reach(static_cast<size_t>(rows), 0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = n - 1; j >= 0; --j) {
      if (std::isfinite(sa.data()[static_cast<size_t>(t * n + j)])) {
        reach[static_cast<size_t>(t)] = j + 1;
        break;
      }
    }
  }
  const int bs = std::max(1, block_size);
  const Tensor<float> block_scores = reference::candidate_block_scores(sa, reach, bs);
  return judge::compare_index_sets(kept_blocks(ma, bs), kept_blocks(mb, bs), &block_scores,
                                   tie_band_width(sa, tie_rel), what + " blocks");
}

StepComparison compare_step(const StepCapture& a, const StepCapture& b, const CompareContext& ctx) {
  StepComparison out;
  Rows rows(ctx, out, a.start_pos);
  for (const CapturedItem& ia : a.items) {
    const CapturedItem* ib = b.find(ia.layer, ia.component);
    if (ib == nullptr || ib->kind != ia.kind) {
      rows.add(ia.layer, ia.component, "present", 0.0, rows.stated_exact(true, 1.0),
               judge::make_tolerance(1.0, true, "stated", "both sides must produce every component output"),
               "side B has no '" + ia.component + "' at layer " + std::to_string(ia.layer));
      ++out.items;
      continue;
    }
    ++out.items;
    switch (ia.kind) {
      case CapturedItem::kFloat: compare_float(ia, *ib, rows, out, ctx); break;
      case CapturedItem::kIndex: compare_index(ia, *ib, a, b, rows, out, ctx); break;
      case CapturedItem::kMask: compare_mask(ia, *ib, a, rows, out, ctx); break;
      case CapturedItem::kIds: compare_ids(ia, *ib, rows, ctx); break;
    }
  }
  for (const CapturedItem& ib : b.items) {
    if (a.find(ib.layer, ib.component) == nullptr) {
      rows.add(ib.layer, ib.component, "present", 0.0, rows.stated_exact(true, 1.0),
               judge::make_tolerance(1.0, true, "stated", "both sides must produce every component output"),
               "side A has no '" + ib.component + "' at layer " + std::to_string(ib.layer));
      ++out.items;
    }
  }
  if (!a.logits.empty() || !b.logits.empty()) {
    compare_logits_item(a, b, rows, ctx, out);
    ++out.items;
  }
  compare_detail::compare_caches(a, b, rows, out);
  return out;
}

}  // namespace dsv41::scenarios::runner
