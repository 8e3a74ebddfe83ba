#include "reference/ops/indexer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "formats/cache_format.h"
#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "reference/ops/indexer_fast.h"
#include "reference/ops/numerics.h"
#include "reference/ops/topk.h"

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

}  // namespace

namespace indexer_detail {

// The scores of 16 keys for one query (index_scores' formula, below): q [heads, d] and w [heads]
// of the query, kt the 16 keys transposed (kt[i * 16 + lane] = key lane's value i). Every lane is
// its own computation: its dot is a double chain in index order (acc += double(q[i]) * double(k[i]),
// then one rounding to fp32, as dot_f64_f32) and its fp32 sum runs over the heads in order, so
// each lane has the bits of that key computed alone; the lanes only run side by side in vector
// registers (four chains of four for the dots, which also hides the adds' latency).
DSV41_SIMD_CLONES void scores16(const float* q, const float* w, const float* kt, int64_t heads, int64_t d,
                                float* out) {
  typedef float v4f __attribute__((vector_size(16)));
  typedef double v4d __attribute__((vector_size(32)));
  float sum[16] = {};  // fp32 accumulation over heads, in head order
  for (int64_t h = 0; h < heads; ++h) {
    const float* a = q + h * d;
    v4d acc[4] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};
    for (int64_t i = 0; i < d; ++i) {
      const double x = static_cast<double>(a[i]);
      for (int g = 0; g < 4; ++g) {
        v4f k;
        std::memcpy(&k, kt + i * 16 + g * 4, sizeof k);
        acc[g] += x * __builtin_convertvector(k, v4d);
      }
    }
    for (int l = 0; l < 16; ++l) {
      const float dot = formats::round_to_bf16(static_cast<float>(acc[l / 4][l % 4]));
      sum[l] += formats::round_to_bf16((dot > 0.0f ? dot : 0.0f) * w[h]);
    }
  }
  for (int l = 0; l < 16; ++l) out[l] = formats::round_to_bf16(sum[l]);
}

void check_score_inputs(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                        const std::vector<int64_t>& reach, const char* what) {
  DSV41_CHECK(q.rank() == 3 && keys.rank() == 2 && weights.rank() == 2, what,
              ": q [T, Hi, Di], keys [N, Di], weights [T, Hi]; got ranks ", q.rank(), ", ", keys.rank(), ", ",
              weights.rank());
  const int64_t t_count = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.dim(0);
  DSV41_CHECK(keys.dim(1) == d && weights.dim(0) == t_count && weights.dim(1) == heads, what, ": q [", t_count,
              ", ", heads, ", ", d, "], keys [", n, ", ", keys.dim(1), "], weights [", weights.dim(0), ", ",
              weights.dim(1), "]");
  check_reach(reach, t_count, n, what);
}

// The double path. The keys any query reaches, in groups of 16 transposed for scores16.
std::vector<float> transposed_keys(const Tensor<float>& keys, int64_t reached) {
  const int64_t d = keys.dim(1), groups = (reached + 15) / 16;
  std::vector<float> kt(static_cast<size_t>(groups * d * 16), 0.0f);  // [groups, d, 16]
  parallel_for(groups, [&](int64_t g) {
    for (int64_t l = 0; l < 16 && g * 16 + l < reached; ++l) {
      const float* k = keys.row(g * 16 + l);
      for (int64_t i = 0; i < d; ++i) kt[static_cast<size_t>((g * d + i) * 16 + l)] = k[i];
    }
  });
  return kt;
}

void double_path_rows(const Tensor<float>& q, const std::vector<float>& kt, const Tensor<float>& weights,
                      const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool, const ScoreRows& rows,
                      IndexScoresTally& tally) {
  const int64_t heads = q.dim(1), d = q.dim(2);
  std::vector<int64_t> scored(static_cast<size_t>(rows.t1 - rows.t0), 0);  // groups scored per query
  parallel_for(rows.t1 - rows.t0, [&](int64_t r) {
    const int64_t t = rows.t0 + r;
    const int64_t reach_t = reach[static_cast<size_t>(t)];
    DSV41_CHECK(((reach_t + 15) / 16) * d * 16 <= static_cast<int64_t>(kt.size()), "index_scores: query row ", t,
                " reaches ", reach_t, " keys, more than were transposed");
    const float* w = weights.row(t);  // [Hi]
    float* out = rows.out + r * rows.width;
    if (rows.fill) std::fill(out, out + rows.width, -kInf);
    // score of key j: bf16(sum over heads in head order of bf16(relu(bf16(q.k)) * w)), 16 keys at once.
    const uint8_t* in_pool = pool != nullptr ? pool->row(t) : nullptr;  // [N] or null: every key
    for (int64_t g = 0; g * 16 < reach_t; ++g) {
      const int64_t width = std::min<int64_t>(16, reach_t - g * 16);
      if (group_outside_pool(in_pool, g * 16, width)) {
        continue;  // the whole group outside the pool: -inf as apply_score_mask leaves it
      }
      float s16[16];
      scores16(heads > 0 ? q.row(t, 0) : nullptr, w, kt.data() + g * d * 16, heads, d, s16);
      store_group(s16, in_pool, g * 16, width, out);
      scored[static_cast<size_t>(r)] += 1;
    }
    if (rows.done) rows.done(t, t + 1);
  });
  for (const int64_t c : scored) tally.double_groups += c;
}

}  // namespace indexer_detail

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

namespace {

// index_scores and index_scores_in_pool: pool null scores every reachable key.
Tensor<float> scores_where(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                           const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool, IndexScoresPath path,
                           IndexScoresTally* tally);

}  // namespace

Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& keys,
                           const Tensor<float>& weights, const std::vector<int64_t>& reach,
                           IndexScoresPath path, IndexScoresTally* tally) {
  return scores_where(q, keys, weights, reach, nullptr, path, tally);
}

Tensor<float> index_scores_in_pool(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                                   const std::vector<int64_t>& reach, const Tensor<uint8_t>& pool,
                                   IndexScoresPath path, IndexScoresTally* tally) {
  DSV41_CHECK(pool.rank() == 2 && q.rank() == 3 && keys.rank() == 2 && pool.dim(0) == q.dim(0) &&
                  pool.dim(1) == keys.dim(0),
              "index_scores_in_pool: the pool ", shape_string(pool.shape()), " must be [T, N] = [",
              q.rank() == 3 ? q.dim(0) : -1, ", ", keys.rank() == 2 ? keys.dim(0) : -1, "]");
  return scores_where(q, keys, weights, reach, &pool, path, tally);
}

namespace {

Tensor<float> scores_where(const Tensor<float>& q, const Tensor<float>& keys, const Tensor<float>& weights,
                           const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool, IndexScoresPath path,
                           IndexScoresTally* tally) {
  indexer_detail::check_score_inputs(q, keys, weights, reach, "index_scores");
  const int64_t t_count = q.dim(0), d = q.dim(2), n = keys.dim(0);
  Tensor<float> scores({t_count, n}, "index_score", -kInf);
  IndexScoresTally count;
  const int64_t reached = reach.empty() ? 0 : *std::max_element(reach.begin(), reach.end());
  indexer_detail::ScoreRows rows;
  rows.t0 = 0;
  rows.t1 = t_count;
  rows.width = n;
  rows.out = scores.data().data();
  if (path == IndexScoresPath::kInteger && indexer_detail::integer_path_fits(d)) {  // the same bits
    indexer_detail::integer_path_rows(q, keys, indexer_detail::encode_keys(keys, reached), weights, reach, pool, rows,
                                      count);
  } else {
    indexer_detail::double_path_rows(q, indexer_detail::transposed_keys(keys, reached), weights, reach, pool, rows,
                                     count);
  }
  if (tally != nullptr) *tally = count;
  return scores;
}

}  // namespace

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
  apply_score_mask(scores, candidates.mask_for(expected_owner), candidates.owner_layer);
}

void apply_score_mask(Tensor<float>& scores, const Tensor<uint8_t>& mask, int owner_layer) {
  DSV41_CHECK(mask.shape() == scores.shape(), "apply_candidate_mask: mask of layer ", owner_layer,
              " has ", mask.numel(), " entries, scores ", scores.numel());
  const int64_t rows = scores.rank() >= 1 && scores.numel() > 0 ? scores.dim(0) : 0;
  const int64_t per_row = rows > 0 ? scores.numel() / rows : 0;
  const uint8_t* m = mask.data().data();
  float* v = scores.data().data();
  parallel_for(rows, [&](int64_t t) {  // rows are independent
    for (int64_t i = t * per_row; i < (t + 1) * per_row; ++i) {
      if (m[i] == 0) v[i] = -kInf;
    }
  });
}

namespace indexer_detail {
namespace {

// Row t of candidate_block_scores: o [blocks] = each block's max of s [n] in index order from -inf,
// the newest reachable block (the one holding position reach - 1) pinned to +inf.
void block_scores_row(const float* s, int64_t n, int64_t reach, int block_size, float* o) {
  const int64_t blocks = (n + block_size - 1) / block_size;
  for (int64_t b = 0; b < blocks; ++b) {
    float m = -kInf;
    for (int64_t j = b * block_size; j < std::min<int64_t>(n, (b + 1) * block_size); ++j) m = std::max(m, s[j]);
    o[b] = m;
  }
  const int64_t last = floor_div(reach - 1, block_size);
  if (last >= 0) o[last] = kInf;  // the newest, partly filled block is always kept
}

}  // namespace

void candidate_row(const float* s, int64_t n, int64_t reach, int topk_blocks, int block_size, float* block_scratch,
                   uint8_t* mask) {
  const int64_t blocks = (n + block_size - 1) / block_size;
  block_scores_row(s, n, reach, block_size, block_scratch);
  std::fill(mask, mask + n, uint8_t{0});
  for (int64_t b : topk_lowest_index_scan(block_scratch, blocks, std::min<int64_t>(topk_blocks, blocks))) {
    if (!(block_scratch[b] > -kInf)) continue;  // an unreachable block picked as filler
    for (int64_t j = b * block_size; j < std::min<int64_t>(n, (b + 1) * block_size); ++j) mask[j] = 1;
  }
}

void topk_row(const float* s, int64_t n, int64_t reach, int64_t k, int64_t offset, int32_t* idxs) {
  std::vector<int64_t> pick = topk_lowest_index_scan(s, n, k);
  std::sort(pick.begin(), pick.end());
  for (int64_t i = 0; i < k; ++i) {
    const int64_t pos = pick[static_cast<size_t>(i)];
    idxs[i] = pos < reach ? static_cast<int32_t>(pos + offset) : -1;
  }
}

}  // namespace indexer_detail

Tensor<float> candidate_block_scores(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                     int block_size) {
  DSV41_CHECK(scores.rank() == 2 && block_size > 0, "candidate_block_scores: scores rank ",
              scores.rank(), ", block_size ", block_size);
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  check_reach(reach, rows, n, "candidate_block_scores");
  const int64_t blocks = (n + block_size - 1) / block_size;
  Tensor<float> out({rows, blocks}, "cand_block_scores", -kInf);  // -inf: the padding
  parallel_for(rows, [&](int64_t t) {  // rows are independent
    indexer_detail::block_scores_row(scores.row(t), n, reach[static_cast<size_t>(t)], block_size, out.row(t));
  });
  return out;
}

CandidateMask select_candidate_blocks(const Tensor<float>& scores, const std::vector<int64_t>& reach,
                                      int topk_blocks, int block_size, int owner_layer) {
  DSV41_CHECK(topk_blocks > 0 && block_size > 0 && scores.rank() == 2, "select_candidate_blocks: topk_blocks ",
              topk_blocks, ", block_size ", block_size, ", scores rank ", scores.rank());
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  check_reach(reach, rows, n, "select_candidate_blocks");
  CandidateMask result;
  result.owner_layer = owner_layer;
  result.mask = Tensor<uint8_t>({rows, n}, "candidates", 0);
  parallel_for(rows, [&](int64_t t) {  // rows are independent
    std::vector<float> block(static_cast<size_t>((n + block_size - 1) / block_size));
    indexer_detail::candidate_row(scores.row(t), n, reach[static_cast<size_t>(t)], topk_blocks, block_size,
                                  block.data(), result.mask.row(t));
  });
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
    indexer_detail::topk_row(scores.row(t), n, reach[static_cast<size_t>(t)], k, offset, result.idxs.row(t));
  });
  return result;
}

}  // namespace dsv41::reference
