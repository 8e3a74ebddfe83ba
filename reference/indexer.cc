#include "reference/indexer.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "formats/cache_format.h"
#include "formats/error.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "reference/numerics.h"
#include "reference/topk.h"

namespace dsv41::reference {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void check_reach(const std::vector<int64_t>& reach, int64_t rows, int64_t n, const char* what) {
  DSV41_CHECK(static_cast<int64_t>(reach.size()) == rows, what, ": ", reach.size(),
              " reach values for ", rows, " query rows");
  for (size_t t = 0; t < reach.size(); ++t) {
    DSV41_CHECK(reach[t] >= 0 && reach[t] <= n, what, ": reach ", reach[t], " of query row ", t,
                " outside [0, ", n, "]");
  }
}

// Python's floor division for a possibly negative numerator (the official `(reach - 1) // bs`).
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The bits a row of fp32 values spans: every nonzero value is a multiple of 2^low and below
// 2^high in magnitude (read off the bits: no frexp). span = high - low; 0 for an all-zero row;
// kNoSpan when a value is not finite.
constexpr int kNoSpan = 1 << 20;
int row_span(const float* x, int64_t n) {
  int low = INT32_MAX, high = INT32_MIN;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &x[i], sizeof bits);
    const uint32_t e = (bits >> 23) & 0xFFu, m = bits & 0x7FFFFFu;
    if (e == 0xFFu) return kNoSpan;  // inf or NaN
    if (e == 0 && m == 0) continue;  // +-0
    // v = sig * 2^(e_min), sig an integer: (2^23 | m) * 2^(e - 150) when normal, m * 2^-149 when not.
    const uint32_t sig = e == 0 ? m : (m | 0x800000u);
    const int base = e == 0 ? -149 : static_cast<int>(e) - 150;
    low = std::min(low, base + std::countr_zero(sig));
    high = std::max(high, base + 32 - std::countl_zero(sig));  // |v| < 2^high
  }
  return low > high ? 0 : high - low;
}

// The exact sum_i a[i]*b[i] rounded once to fp32, for rows whose spans make every partial sum
// exact in double (order-free, so taken in vectors; see index_scores): the same bits as
// dot_f64_f32.
DSV41_SIMD_CLONES float dot_exact_wide(const float* a, const float* b, int64_t n) {
  typedef float v4f __attribute__((vector_size(16)));
  typedef double v4d __attribute__((vector_size(32)));
  v4d acc0 = {0.0, 0.0, 0.0, 0.0}, acc1 = acc0;
  const int64_t whole = n / 8 * 8;
  for (int64_t i = 0; i < whole; i += 8) {
    v4f x0, y0, x1, y1;
    std::memcpy(&x0, a + i, sizeof x0);
    std::memcpy(&y0, b + i, sizeof y0);
    std::memcpy(&x1, a + i + 4, sizeof x1);
    std::memcpy(&y1, b + i + 4, sizeof y1);
    acc0 += __builtin_convertvector(x0, v4d) * __builtin_convertvector(y0, v4d);
    acc1 += __builtin_convertvector(x1, v4d) * __builtin_convertvector(y1, v4d);
  }
  const v4d acc = acc0 + acc1;
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int64_t k = whole; k < n; ++k) sum += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return static_cast<float>(sum);
}

}  // namespace

float index_weight_scale(int index_head_dim, int index_n_heads) {
  DSV41_CHECK(index_head_dim > 0 && index_n_heads > 0, "index_weight_scale: Di ", index_head_dim,
              ", Hi ", index_n_heads);
  const double s = std::pow(static_cast<double>(index_head_dim), -0.5) *
                   std::pow(static_cast<double>(index_n_heads), -0.5);
  return static_cast<float>(s);
}

Tensor<float> index_weights(const Tensor<float>& proj, int index_head_dim) {
  DSV41_CHECK(proj.rank() == 2, "index_weights: proj must be [T, Hi], rank ", proj.rank());
  const float scale = index_weight_scale(index_head_dim, static_cast<int>(proj.dim(1)));
  Tensor<float> w(proj.shape(), "index_weights");
  for (int64_t i = 0; i < proj.numel(); ++i) {
    w.data()[static_cast<size_t>(i)] = formats::round_to_bf16(proj.data()[static_cast<size_t>(i)] * scale);
  }
  return w;
}

std::vector<int64_t> compressed_reach(int64_t start_pos, int64_t seqlen, int ratio) {
  DSV41_CHECK(start_pos >= 0 && seqlen >= 0 && ratio >= 1, "compressed_reach: start_pos ",
              start_pos, ", seqlen ", seqlen, ", ratio ", ratio);
  std::vector<int64_t> reach(static_cast<size_t>(seqlen));
  for (int64_t t = 0; t < seqlen; ++t) reach[static_cast<size_t>(t)] = (start_pos + t + 1) / ratio;
  return reach;
}

Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& keys,
                           const Tensor<float>& weights, const std::vector<int64_t>& reach) {
  DSV41_CHECK(q.rank() == 3 && keys.rank() == 2 && weights.rank() == 2,
              "index_scores: q [T, Hi, Di], keys [N, Di], weights [T, Hi]; got ranks ", q.rank(),
              ", ", keys.rank(), ", ", weights.rank());
  const int64_t t_count = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.dim(0);
  DSV41_CHECK(keys.dim(1) == d && weights.dim(0) == t_count && weights.dim(1) == heads,
              "index_scores: q [", t_count, ", ", heads, ", ", d, "], keys [", n, ", ",
              keys.dim(1), "], weights [", weights.dim(0), ", ", weights.dim(1), "]");
  check_reach(reach, t_count, n, "index_scores");
  Tensor<float> scores({t_count, n}, "index_score", -kInf);
  // The order-free path: the dot of a q row (span sq) and a key row (span sk) has every product
  // exact in double (two fp32 values: at most 48 significant bits) and a multiple of
  // 2^(low_q + low_k), and every partial sum below d * 2^(high_q + high_k); when
  // sq + sk + ceil(log2 d) <= 53 every partial sum is an exact double, so any order gives the exact
  // sum, which dot_f64_f32 rounds once: the same bits. FP4-QDQ rows (E2M1 codes times one E8M0
  // scale per 32 channels) span a few bits plus their scales' spread; other pairs take the
  // index-order sum.
  const int64_t keys_reached = reach.empty() ? 0 : *std::max_element(reach.begin(), reach.end());
  std::vector<int> key_span(static_cast<size_t>(keys_reached));
  parallel_for((keys_reached + 4095) / 4096, [&](int64_t b) {
    for (int64_t j = b * 4096; j < std::min(keys_reached, (b + 1) * 4096); ++j) {
      key_span[static_cast<size_t>(j)] = row_span(keys.row(j), d);
    }
  });
  const int log2_d = d <= 1 ? 0 : 64 - std::countl_zero(static_cast<uint64_t>(d - 1));
  parallel_for(t_count, [&](int64_t t) {
    const int64_t reach_t = reach[static_cast<size_t>(t)];
    const float* w = weights.row(t);  // [Hi]
    float* out = scores.row(t);
    std::vector<int> budget(static_cast<size_t>(heads));  // the key span each head's q row allows
    for (int64_t h = 0; h < heads; ++h) {
      const int sq = row_span(q.row(t, h), d);
      budget[static_cast<size_t>(h)] = sq >= kNoSpan ? -1 : 53 - log2_d - sq;
    }
    // score of key j: bf16(sum over heads in head order of bf16(relu(bf16(q.k)) * w)); four keys side
    // by side, each with its own sums (the same bits as one at a time).
    int64_t j = 0;
    for (; j + 4 <= reach_t; j += 4) {
      const float* rows[4] = {keys.row(j), keys.row(j + 1), keys.row(j + 2), keys.row(j + 3)};
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // fp32 accumulation over heads, in head order
      const int span4 = std::max(std::max(key_span[static_cast<size_t>(j)], key_span[static_cast<size_t>(j + 1)]),
                                 std::max(key_span[static_cast<size_t>(j + 2)], key_span[static_cast<size_t>(j + 3)]));
      for (int64_t h = 0; h < heads; ++h) {
        float dots[4];
        if (span4 <= budget[static_cast<size_t>(h)]) {
          for (int k = 0; k < 4; ++k) dots[k] = dot_exact_wide(q.row(t, h), rows[k], d);
        } else {
          dot_f64_f32_x4(q.row(t, h), rows, d, dots);
        }
        for (int k = 0; k < 4; ++k) {
          const float dot = formats::round_to_bf16(dots[k]);
          sum[k] += formats::round_to_bf16((dot > 0.0f ? dot : 0.0f) * w[h]);
        }
      }
      for (int k = 0; k < 4; ++k) out[j + k] = formats::round_to_bf16(sum[k]);
    }
    for (; j < reach_t; ++j) {
      float sum = 0.0f;
      for (int64_t h = 0; h < heads; ++h) {
        const float dot = formats::round_to_bf16(dot_f64_f32(q.row(t, h), keys.row(j), d));
        sum += formats::round_to_bf16((dot > 0.0f ? dot : 0.0f) * w[h]);
      }
      out[j] = formats::round_to_bf16(sum);
    }
  });
  return scores;
}

const Tensor<int32_t>& PublishedTopk::idxs_for(int expected_owner, int expected_ratio,
                                               int64_t expected_offset) const {
  if (expected_owner != owner_layer || expected_ratio != ratio || expected_offset != offset) {
    DSV41_FAIL("published top-k: a consumer expects the top-k of layer ", expected_owner,
               " (ratio ", expected_ratio, ", offset ", expected_offset,
               ") but this one belongs to layer ", owner_layer, " (ratio ", ratio, ", offset ",
               offset, ")");
  }
  return idxs;
}

const Tensor<uint8_t>& CandidateMask::mask_for(int expected_owner) const {
  if (expected_owner != owner_layer) {
    DSV41_FAIL("candidate mask: a consumer expects the mask of layer ", expected_owner,
               " but this one belongs to layer ", owner_layer);
  }
  return mask;
}

void apply_candidate_mask(Tensor<float>& scores, const CandidateMask& candidates,
                          int expected_owner) {
  const Tensor<uint8_t>& mask = candidates.mask_for(expected_owner);
  DSV41_CHECK(mask.shape() == scores.shape(), "apply_candidate_mask: mask of layer ",
              candidates.owner_layer, " has ", mask.numel(), " entries, scores ", scores.numel());
  for (int64_t i = 0; i < scores.numel(); ++i) {
    if (mask.data()[static_cast<size_t>(i)] == 0) scores.data()[static_cast<size_t>(i)] = -kInf;
  }
}

Tensor<float> candidate_block_scores(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                     int block_size) {
  DSV41_CHECK(scores.rank() == 2 && block_size > 0, "candidate_block_scores: scores rank ",
              scores.rank(), ", block_size ", block_size);
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  check_reach(reach, rows, n, "candidate_block_scores");
  const int64_t blocks = (n + block_size - 1) / block_size;
  Tensor<float> out({rows, blocks}, "cand_block_scores", -kInf);  // -inf: the padding
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      float& b = out.at(t, j / block_size);
      b = std::max(b, scores.at(t, j));
    }
    const int64_t last = floor_div(reach[static_cast<size_t>(t)] - 1, block_size);
    if (last >= 0) out.at(t, last) = kInf;  // the newest, partly filled block is always kept
  }
  return out;
}

CandidateMask select_candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                      int topk_blocks, int block_size, int owner_layer) {
  DSV41_CHECK(topk_blocks > 0, "select_candidate_blocks: topk_blocks ", topk_blocks);
  const Tensor<float> block = candidate_block_scores(scores, reach, block_size);
  const int64_t rows = scores.dim(0), n = scores.dim(1), blocks = block.dim(1);
  const int64_t k = std::min<int64_t>(topk_blocks, blocks);
  CandidateMask result;
  result.owner_layer = owner_layer;
  result.mask = Tensor<uint8_t>({rows, n}, "candidates", 0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b : topk_lowest_index(block.row(t), blocks, k)) {
      if (!(block.at(t, b) > -kInf)) continue;  // an unreachable block picked as filler
      for (int64_t j = b * block_size; j < std::min<int64_t>(n, (b + 1) * block_size); ++j) {
        result.mask.at(t, j) = 1;
      }
    }
  }
  return result;
}

PublishedTopk select_index_topk(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                int index_topk, int64_t offset, int owner_layer, int ratio) {
  DSV41_CHECK(scores.rank() == 2 && index_topk > 0 && offset >= 0, "select_index_topk: scores rank ",
              scores.rank(), ", index_topk ", index_topk, ", offset ", offset);
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  check_reach(reach, rows, n, "select_index_topk");
  DSV41_CHECK(rows == 0 || reach.back() == n, "select_index_topk: ", n,
              " score columns but the last query reaches ", reach.back(),
              " (the columns must be end_pos / ratio)");
  const int64_t k = std::min<int64_t>(index_topk, n);
  PublishedTopk result;
  result.owner_layer = owner_layer;
  result.ratio = ratio;
  result.offset = offset;
  result.idxs = Tensor<int32_t>({rows, k}, "indexer_topk");
  parallel_for(rows, [&](int64_t t) {
    std::vector<int64_t> pick = topk_lowest_index(scores.row(t), n, k);
    std::sort(pick.begin(), pick.end());
    for (int64_t i = 0; i < k; ++i) {
      const int64_t pos = pick[static_cast<size_t>(i)];
      result.idxs.at(t, i) =
          pos < reach[static_cast<size_t>(t)] ? static_cast<int32_t>(pos + offset) : -1;
    }
  });
  return result;
}

}  // namespace dsv41::reference
