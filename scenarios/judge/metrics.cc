// scenarios/judge/metrics.cc
//
// The divergence metrics of scenarios/judge/metrics.h. Every sum is a double sum in flat-index order
// (deterministic); set operations work on sorted copies of each row. docs/metrics.md states each
// metric exactly as computed here.
#include "scenarios/judge/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace dsv41::scenarios::judge {

using reference::Tensor;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The storage bits of one value: the bf16 pattern (high 16 bits of the fp32 pattern) or the fp32
// pattern.
uint32_t storage_bits(float x, ValueType t) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return t == ValueType::kBf16 ? u >> 16 : u;
}

// Sign-magnitude storage bits -> an integer whose order is the order of the values and whose
// difference is the ULP distance (+0 and -0 both map to 0).
int64_t ordered(uint32_t bits, ValueType t) {
  const uint32_t sign = t == ValueType::kBf16 ? 0x8000u : 0x80000000u;
  const int64_t mag = static_cast<int64_t>(bits & (sign - 1));
  return (bits & sign) != 0 ? -mag : mag;
}

std::vector<int64_t> coord_of(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

// The argmax of x (lowest index among equal maxima), NaN never winning; -1 when all are NaN.
int64_t argmax_lowest(const std::vector<float>& x) {
  int64_t best = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  return best;
}

// Log-softmax in double, stable: x - max - log(sum exp(x - max)). x: finite.
std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = -kInf;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(x[i]) - lse;
  return out;
}

void check_rank2(const Tensor<int32_t>& t, const std::string& what, const char* side) {
  DSV41_CHECK(t.rank() == 2, what, ": index tensor ", side, " must be [T, k], got shape ", reference::shape_string(t.shape()));
}

// The valid (>= 0) entries of row t of x: [T, k] int32, sorted. -1 is padding; a duplicate or an
// entry below -1 is an error.
std::vector<int32_t> index_row(const Tensor<int32_t>& x, int64_t t, const std::string& what, const char* side) {
  const int64_t k = x.dim(1);
  const int32_t* row = x.data().data() + t * k;
  std::vector<int32_t> s;
  for (int64_t j = 0; j < k; ++j) {
    DSV41_CHECK(row[j] >= -1, what, ": side ", side, " row ", t, " slot ", j, " holds ", row[j],
                " (valid indices are >= 0, padding is -1)");
    if (row[j] >= 0) s.push_back(row[j]);
  }
  std::sort(s.begin(), s.end());
  const auto dup = std::adjacent_find(s.begin(), s.end());
  DSV41_CHECK(dup == s.end(), what, ": side ", side, " row ", t, " selects index ", (dup == s.end() ? -1 : *dup),
              " more than once (a top-k never repeats an index)");
  return s;
}

int64_t common_count(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int64_t n = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++n, ++i, ++j;
    }
  }
  return n;
}

void check_mask(const Tensor<uint8_t>& m, const std::string& what, const char* side) {
  const std::vector<uint8_t>& d = m.data();
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] > 1) {
      const std::vector<int64_t> c = coord_of(static_cast<int64_t>(i), m.shape());
      DSV41_FAIL(what, ": candidate mask ", side, " holds ", static_cast<int>(d[i]), " at row ", c[0], " position ",
                 c[1], " (a mask holds 0 or 1)");
    }
  }
}

}  // namespace

const char* name(ValueType t) {
  switch (t) {
    case ValueType::kBf16: return "bf16";
    case ValueType::kFp32: return "fp32";
  }
  return "?";
}

const char* name(FlipClass c) {
  switch (c) {
    case FlipClass::kNone: return "none";
    case FlipClass::kNearTie: return "near_tie";
    case FlipClass::kSubstantive: return "substantive";
  }
  return "?";
}

// ---- tensors ----

TensorMetrics compare_tensors(const Tensor<float>& a, const Tensor<float>& b, ValueType type,
                              const std::string& what) {
  DSV41_CHECK(a.shape() == b.shape(), what, ": shapes differ: A ", reference::shape_string(a.shape()), " vs B ",
              reference::shape_string(b.shape()));
  const std::vector<float>& av = a.data();
  const std::vector<float>& bv = b.data();
  if (type == ValueType::kBf16) {
    for (size_t i = 0; i < av.size(); ++i) {
      for (const auto& [side, v] : {std::pair{"A", av[i]}, std::pair{"B", bv[i]}}) {
        const uint32_t u = std::bit_cast<uint32_t>(v);
        DSV41_CHECK((u & 0xFFFFu) == 0, what, ": side ", side, " flat index ", i, " holds ", v, " (bits 0x",
                    std::hex, u, std::dec, "), not a bf16 value");
      }
    }
  }

  TensorMetrics m;
  m.count = a.numel();
  double sum_d2 = 0, sum_a2 = 0;          // over pairs finite on both sides
  double sq_a = 0, sq_b = 0;              // over finite elements of each side
  int64_t fin_a = 0, fin_b = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    const float x = av[i], y = bv[i];
    const bool fx = std::isfinite(x), fy = std::isfinite(y);
    const bool nx = std::isnan(x), ny = std::isnan(y);
    if (!fx) ++m.nonfinite_a;
    if (!fy) ++m.nonfinite_b;
    if (x != 0) m.a_all_zero = false;  // NaN != 0 is true: a NaN is not zero
    if (y != 0) m.b_all_zero = false;
    if (nx != ny) {
      ++m.nan_mismatch;
    } else if (!nx && (std::isinf(x) || std::isinf(y)) && x != y) {
      ++m.inf_mismatch;  // Inf on one side only, or Infs of opposite signs
    }
    if (fx) ++fin_a, sq_a += static_cast<double>(x) * x;
    if (fy) ++fin_b, sq_b += static_cast<double>(y) * y;

    const uint32_t sx = storage_bits(x, type), sy = storage_bits(y, type);
    if (sx == sy) {
      ++m.bit_equal;
    } else if (m.first_mismatch < 0) {
      m.first_mismatch = static_cast<int64_t>(i);
      m.first_mismatch_coord = coord_of(m.first_mismatch, a.shape());
      m.first_mismatch_byte = std::countr_zero(sx ^ sy) / 8;  // little-endian: byte 0 = bits 0..7
      m.a_at_first = x;
      m.b_at_first = y;
    }
    if (fx && fy) {
      const double d = static_cast<double>(x) - static_cast<double>(y);
      if (std::fabs(d) > m.max_abs) {
        m.max_abs = std::fabs(d);
        m.max_abs_index = static_cast<int64_t>(i);
      }
      sum_d2 += d * d;
      sum_a2 += static_cast<double>(x) * x;
      const double ulp = static_cast<double>(std::llabs(ordered(sx, type) - ordered(sy, type)));
      m.max_ulp = std::max(m.max_ulp, ulp);
    }
  }
  m.bit_equal_frac = m.count == 0 ? 1.0 : static_cast<double>(m.bit_equal) / static_cast<double>(m.count);
  m.nmse = sum_a2 == 0 ? sum_d2 : sum_d2 / sum_a2;
  m.a_rms = fin_a == 0 ? 0.0 : std::sqrt(sq_a / static_cast<double>(fin_a));
  m.b_rms = fin_b == 0 ? 0.0 : std::sqrt(sq_b / static_cast<double>(fin_b));
  return m;
}

// ---- logits ----

LogitMetrics compare_logits(const std::vector<float>& a, const std::vector<float>& b, double perturbation_bound,
                            const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": vocab sizes differ: A ", a.size(), " vs B ", b.size());
  DSV41_CHECK(!a.empty(), what, ": empty logits");
  LogitMetrics m;
  m.vocab = static_cast<int64_t>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) ++m.nonfinite_a;
    if (!std::isfinite(b[i])) ++m.nonfinite_b;
  }
  m.top1_a = argmax_lowest(a);
  m.top1_b = argmax_lowest(b);
  m.top1_agree = m.top1_a == m.top1_b;

  if (m.nonfinite_a != 0 || m.nonfinite_b != 0) {
    m.max_abs = m.nmse = m.kl = m.margin_a = kNaN;
    m.flip = m.top1_agree ? FlipClass::kNone : FlipClass::kSubstantive;
    return m;
  }

  double sum_d2 = 0, sum_a2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    m.max_abs = std::max(m.max_abs, std::fabs(d));
    sum_d2 += d * d;
    sum_a2 += static_cast<double>(a[i]) * a[i];
  }
  m.nmse = sum_a2 == 0 ? sum_d2 : sum_d2 / sum_a2;

  const std::vector<double> la = log_softmax(a), lb = log_softmax(b);
  double kl = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double p = std::exp(la[i]);
    if (p > 0) kl += p * (la[i] - lb[i]);
  }
  m.kl = std::max(kl, 0.0);  // >= 0 in exact arithmetic; rounding may leave -1e-17

  // A's top-2 margin: top-1 minus the best of the other indices (0 when tied, +inf for vocab 1).
  double second = -kInf;
  for (size_t i = 0; i < a.size(); ++i) {
    if (static_cast<int64_t>(i) != m.top1_a) second = std::max(second, static_cast<double>(a[i]));
  }
  m.margin_a = a.size() == 1 ? kInf : static_cast<double>(a[static_cast<size_t>(m.top1_a)]) - second;

  if (m.top1_agree) {
    m.flip = FlipClass::kNone;
  } else {
    m.flip = m.margin_a <= perturbation_bound ? FlipClass::kNearTie : FlipClass::kSubstantive;
  }
  return m;
}

// ---- index sets ----

IndexMetrics compare_index_sets(const Tensor<int32_t>& a, const Tensor<int32_t>& b, const Tensor<float>* scores_a,
                                double tie_eps, const std::string& what) {
  check_rank2(a, what, "A");
  check_rank2(b, what, "B");
  DSV41_CHECK(a.dim(0) == b.dim(0), what, ": row counts differ: A ", reference::shape_string(a.shape()), " vs B ",
              reference::shape_string(b.shape()));
  DSV41_CHECK(tie_eps >= 0, what, ": tie_eps must be >= 0, got ", tie_eps);
  const int64_t rows = a.dim(0);
  int64_t n_scores = 0;
  if (scores_a != nullptr) {
    DSV41_CHECK(scores_a->rank() == 2 && scores_a->dim(0) == rows, what, ": scores_a must be [T, N] with T = ",
                rows, ", got shape ", reference::shape_string(scores_a->shape()));
    n_scores = scores_a->dim(1);
  }

  IndexMetrics m;
  m.rows = rows;
  m.max_tie_band = scores_a != nullptr && rows > 0 ? 0 : -1;
  double sum_j = 0, sum_r = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<int32_t> sa = index_row(a, t, what, "A");
    const std::vector<int32_t> sb = index_row(b, t, what, "B");
    IndexRowMetrics r;
    r.size_a = static_cast<int64_t>(sa.size());
    r.size_b = static_cast<int64_t>(sb.size());
    r.common = common_count(sa, sb);
    const int64_t uni = r.size_a + r.size_b - r.common;
    r.jaccard = uni == 0 ? 1.0 : static_cast<double>(r.common) / static_cast<double>(uni);
    r.recall = r.size_a == 0 ? 1.0 : static_cast<double>(r.common) / static_cast<double>(r.size_a);
    const bool equal = sa == sb;

    if (scores_a == nullptr) {
      r.tie_band = -1;
      r.tie_equivalent = equal;
      r.score_gap_at_k = kNaN;
    } else {
      const float* s = scores_a->data().data() + t * n_scores;
      // s_k: A's k-th (lowest selected) score; NaN when A selects nothing.
      double s_k = kNaN;
      for (int32_t i : sa) {
        DSV41_CHECK(i < n_scores, what, ": side A row ", t, " selects index ", i, " outside the ", n_scores,
                    " scored positions");
        DSV41_CHECK(!std::isnan(s[i]), what, ": side A row ", t, " selects index ", i, " whose score is NaN");
        s_k = std::isnan(s_k) ? s[i] : std::min(s_k, static_cast<double>(s[i]));
      }
      const auto in_band = [&](int32_t i) {
        if (i >= n_scores) return false;  // B may select a position A never scored
        const double v = s[i];
        return std::isfinite(v) && std::fabs(v - s_k) <= tie_eps;
      };
      r.tie_band = 0;
      double best_unselected = kNaN;
      for (int64_t n = 0; n < n_scores; ++n) {
        if (in_band(static_cast<int32_t>(n))) ++r.tie_band;
        if (std::isfinite(s[n]) && !std::binary_search(sa.begin(), sa.end(), static_cast<int32_t>(n))) {
          best_unselected = std::isnan(best_unselected) ? s[n] : std::max(best_unselected, static_cast<double>(s[n]));
        }
      }
      r.score_gap_at_k = s_k - best_unselected;  // NaN when either is missing
      std::vector<int32_t> diff;
      std::set_symmetric_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(diff));
      r.tie_equivalent = r.size_a == r.size_b && std::all_of(diff.begin(), diff.end(), in_band);
      m.max_tie_band = std::max(m.max_tie_band, r.tie_band);
    }

    if (equal) {
      ++m.rows_equal;
    } else if (m.first_row_differs < 0) {
      m.first_row_differs = t;
    }
    m.tie_equivalent = m.tie_equivalent && r.tie_equivalent;
    m.min_jaccard = std::min(m.min_jaccard, r.jaccard);
    m.min_recall = std::min(m.min_recall, r.recall);
    sum_j += r.jaccard;
    sum_r += r.recall;
    m.per_row.push_back(r);
  }
  if (rows > 0) {
    m.mean_jaccard = sum_j / static_cast<double>(rows);
    m.mean_recall = sum_r / static_cast<double>(rows);
  }
  return m;
}

namespace {
// Row t of a [rows, n] tensor, as [1, n].
template <typename T>
Tensor<T> row_slice(const Tensor<T>& x, int64_t t) {
  const int64_t n = x.dim(1);
  return Tensor<T>({1, n}, std::vector<T>(x.data().begin() + t * n, x.data().begin() + (t + 1) * n), x.name());
}
}  // namespace

IndexMetrics compare_index_sets_banded(const Tensor<int32_t>& a, const Tensor<int32_t>& b, const Tensor<float>& scores_a,
                                       const std::vector<double>& tie_eps, const std::string& what) {
  DSV41_CHECK(a.rank() == 2 && b.rank() == 2 && scores_a.rank() == 2 && a.dim(0) == b.dim(0) &&
                  scores_a.dim(0) == a.dim(0) && static_cast<int64_t>(tie_eps.size()) == a.dim(0),
              what, ": selections ", reference::shape_string(a.shape()), " and ", reference::shape_string(b.shape()), ", scores ",
              reference::shape_string(scores_a.shape()), ", ", tie_eps.size(), " tie bands: expected one row of each per row");
  const int64_t rows = a.dim(0);
  IndexMetrics m;
  m.max_tie_band = rows > 0 ? 0 : -1;
  double sum_j = 0, sum_r = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const Tensor<float> scores = row_slice(scores_a, t);
    const IndexMetrics r =
        compare_index_sets(row_slice(a, t), row_slice(b, t), &scores, tie_eps[static_cast<size_t>(t)], what + " row " + std::to_string(t));
    const IndexRowMetrics& x = r.per_row.front();
    if (r.rows_equal == 1) {
      ++m.rows_equal;
    } else if (m.first_row_differs < 0) {
      m.first_row_differs = t;
    }
    m.max_tie_band = std::max(m.max_tie_band, x.tie_band);
    m.tie_equivalent = m.tie_equivalent && x.tie_equivalent;
    m.min_jaccard = std::min(m.min_jaccard, x.jaccard);
    m.min_recall = std::min(m.min_recall, x.recall);
    sum_j += x.jaccard;
    sum_r += x.recall;
    m.per_row.push_back(x);
  }
  m.rows = rows;
  if (rows > 0) {
    m.mean_jaccard = sum_j / static_cast<double>(rows);
    m.mean_recall = sum_r / static_cast<double>(rows);
  }
  return m;
}

ErrorShape error_shape(const std::vector<float>& a, const std::vector<float>& b, ValueType t, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": ", a.size(), " values against ", b.size());
  ErrorShape e;
  double n = 0, sa = 0, sd = 0, saa = 0, sdd = 0, sad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    const int64_t ulp = std::llabs(ordered(storage_bits(a[i], t), t) - ordered(storage_bits(b[i], t), t));
    ++e.ulp_hist[ulp == 0 ? 0 : ulp == 1 ? 1 : ulp <= 4 ? 2 : ulp <= 16 ? 3 : 4];
    const double x = a[i], d = static_cast<double>(b[i]) - x;
    n += 1;
    sa += x;
    sd += d;
    saa += x * x;
    sdd += d * d;
    sad += x * d;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n == 0 || sdd == 0) {
    e.mean_over_rms = e.corr = nan;
    return e;
  }
  e.mean_over_rms = (sd / n) / std::sqrt(sdd / n);
  const double va = saa / n - (sa / n) * (sa / n), vd = sdd / n - (sd / n) * (sd / n);
  e.corr = va > 0 && vd > 0 ? (sad / n - (sa / n) * (sd / n)) / std::sqrt(va * vd) : nan;
  return e;
}

std::string describe(const ErrorShape& e) {
  int64_t total = 0;
  for (int64_t c : e.ulp_hist) total += c;
  std::ostringstream s;
  s.precision(2);
  s << "ulps 0/1/2-4/5-16/>16:";
  for (size_t k = 0; k < e.ulp_hist.size(); ++k) {
    s << (k ? "/" : " ") << std::fixed << (total ? 100.0 * static_cast<double>(e.ulp_hist[k]) / static_cast<double>(total) : 0.0) << "%";
  }
  s << std::showpos << "; mean/rms error " << e.mean_over_rms << "; corr(ref, error) " << e.corr;
  return s.str();
}

// ---- candidate pools ----

CandidateMetrics compare_candidates(const Tensor<uint8_t>& a, const Tensor<uint8_t>& b, int block_size,
                                    const std::string& what) {
  DSV41_CHECK(a.rank() == 2, what, ": candidate mask A must be [T, N], got shape ", reference::shape_string(a.shape()));
  DSV41_CHECK(a.shape() == b.shape(), what, ": shapes differ: A ", reference::shape_string(a.shape()), " vs B ",
              reference::shape_string(b.shape()));
  DSV41_CHECK(block_size >= 1, what, ": block_size must be >= 1, got ", block_size);
  check_mask(a, what, "A");
  check_mask(b, what, "B");
  const int64_t rows = a.dim(0), n = a.dim(1);
  const int64_t blocks = (n + block_size - 1) / block_size;

  CandidateMetrics m;
  m.rows = rows;
  double sum_block = 0, sum_token = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const uint8_t* ra = a.data().data() + t * n;
    const uint8_t* rb = b.data().data() + t * n;
    int64_t tok_a = 0, tok_both = 0, blk_a = 0, blk_both = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      bool kept_a = false, kept_b = false;
      for (int64_t p = blk * block_size; p < std::min(n, (blk + 1) * block_size); ++p) {
        kept_a = kept_a || ra[p] != 0;
        kept_b = kept_b || rb[p] != 0;
        tok_a += ra[p];
        tok_both += ra[p] & rb[p];
      }
      blk_a += kept_a;
      blk_both += kept_a && kept_b;
    }
    const double block_recall = blk_a == 0 ? 1.0 : static_cast<double>(blk_both) / static_cast<double>(blk_a);
    const double token_recall = tok_a == 0 ? 1.0 : static_cast<double>(tok_both) / static_cast<double>(tok_a);
    if (std::equal(ra, ra + n, rb)) {
      ++m.rows_equal;
    } else if (m.first_row_differs < 0) {
      m.first_row_differs = t;
    }
    m.min_block_recall = std::min(m.min_block_recall, block_recall);
    m.min_token_recall = std::min(m.min_token_recall, token_recall);
    sum_block += block_recall;
    sum_token += token_recall;
  }
  if (rows > 0) {
    m.mean_block_recall = sum_block / static_cast<double>(rows);
    m.mean_token_recall = sum_token / static_cast<double>(rows);
  }
  return m;
}

double recall_within_candidates(const Tensor<int32_t>& topk_a, const Tensor<int32_t>& topk_b,
                                const Tensor<uint8_t>& mask_b, const std::string& what) {
  check_rank2(topk_a, what, "A");
  check_rank2(topk_b, what, "B");
  DSV41_CHECK(mask_b.rank() == 2, what, ": candidate mask B must be [T, N], got shape ", reference::shape_string(mask_b.shape()));
  DSV41_CHECK(topk_a.dim(0) == topk_b.dim(0) && topk_a.dim(0) == mask_b.dim(0), what, ": row counts differ: A ",
              reference::shape_string(topk_a.shape()), ", B ", reference::shape_string(topk_b.shape()), ", mask B ", reference::shape_string(mask_b.shape()));
  check_mask(mask_b, what, "B");
  const int64_t rows = topk_a.dim(0), n = mask_b.dim(1);
  if (rows == 0) return 1.0;
  double sum = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<int32_t> sa = index_row(topk_a, t, what, "A");
    const std::vector<int32_t> sb = index_row(topk_b, t, what, "B");
    const uint8_t* mb = mask_b.data().data() + t * n;
    int64_t in_pool = 0, kept = 0;
    for (int32_t i : sa) {
      DSV41_CHECK(i < n, what, ": side A row ", t, " selects index ", i, " outside the ", n, " mask positions");
      if (mb[i] == 0) continue;
      ++in_pool;
      kept += std::binary_search(sb.begin(), sb.end(), i);
    }
    sum += in_pool == 0 ? 1.0 : static_cast<double>(kept) / static_cast<double>(in_pool);
  }
  return sum / static_cast<double>(rows);
}

// ---- bytes and integers ----

BytesMetrics compare_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int64_t entry_bytes,
                           const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": sizes differ: A ", a.size(), " bytes vs B ", b.size());
  DSV41_CHECK(entry_bytes >= 1, what, ": entry_bytes must be >= 1, got ", entry_bytes);
  DSV41_CHECK(static_cast<int64_t>(a.size()) % entry_bytes == 0, what, ": ", a.size(),
              " bytes is not a whole number of ", entry_bytes, "-byte entries");
  BytesMetrics m;
  m.bytes = static_cast<int64_t>(a.size());
  m.entries = m.bytes / entry_bytes;
  for (int64_t e = 0; e < m.entries; ++e) {
    bool entry_equal = true;
    for (int64_t k = 0; k < entry_bytes; ++k) {
      const size_t i = static_cast<size_t>(e * entry_bytes + k);
      if (a[i] == b[i]) {
        ++m.bytes_equal;
        continue;
      }
      entry_equal = false;
      if (m.first_mismatch_entry < 0) {
        m.first_mismatch_entry = e;
        m.first_mismatch_byte = k;
      }
    }
    m.entries_equal += entry_equal;
  }
  return m;
}

IntMetrics compare_ints(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::string& what) {
  DSV41_CHECK(a.size() == b.size(), what, ": sizes differ: A ", a.size(), " vs B ", b.size());
  IntMetrics m;
  m.count = static_cast<int64_t>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) {
      ++m.equal;
    } else if (m.first_mismatch < 0) {
      m.first_mismatch = static_cast<int64_t>(i);
    }
  }
  return m;
}

}  // namespace dsv41::scenarios::judge
