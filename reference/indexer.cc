#include "reference/indexer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

}  // namespace

Tensor<float> fp4_qdq_index(const Tensor<float>& x) {
  DSV41_CHECK(x.rank() >= 1, "fp4_qdq_index: scalar input");
  const int64_t d = x.dim(x.rank() - 1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  Tensor<float> out(x.shape(), x.name() + "_qdq");
  out.data() = formats::qdq_rows(formats::CacheFormat::kIndexKeyFp4, x.data(),
                                 static_cast<int>(rows), static_cast<int>(d));
  return out;
}

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
  parallel_for(t_count, [&](int64_t t) {
    const int64_t reach_t = reach[static_cast<size_t>(t)];
    for (int64_t j = 0; j < reach_t; ++j) {
      float sum = 0.0f;  // fp32 accumulation over heads, in head order
      for (int64_t h = 0; h < heads; ++h) {
        const float dot = formats::round_to_bf16(dot_f64_f32(q.row(t, h), keys.row(j), d));
        const float relu = dot > 0.0f ? dot : 0.0f;
        sum += formats::round_to_bf16(relu * weights.at(t, h));
      }
      scores.at(t, j) = formats::round_to_bf16(sum);
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

IndexKeyCache::IndexKeyCache(int owner_layer, int ratio, int64_t index_head_dim, int64_t capacity,
                             int64_t position_offset, CachePrecision precision)
    : owner_layer_(owner_layer),
      ratio_(ratio),
      dim_(index_head_dim),
      capacity_(capacity),
      position_offset_(position_offset),
      precision_(precision),
      format_(stored_format(precision, formats::CacheFormat::kIndexKeyFp4)),
      entry_bytes_(formats::entry_bytes(format_, static_cast<int>(index_head_dim))) {
  DSV41_CHECK(owner_layer >= 0 && ratio >= 1 && capacity >= 0 && position_offset >= 0,
              "index-key cache: owner ", owner_layer, ", ratio ", ratio, ", capacity ", capacity,
              ", position_offset ", position_offset);
  bytes_.assign(static_cast<size_t>(capacity * entry_bytes_), 0);
}

void IndexKeyCache::write(int64_t first_entry, const Tensor<float>& roped_keys) {
  DSV41_CHECK(roped_keys.rank() == 2 && roped_keys.dim(1) == dim_, "index-key cache of layer ",
              owner_layer_, ": rows of width ", roped_keys.rank() == 2 ? roped_keys.dim(1) : -1,
              ", want ", dim_);
  const int64_t n = roped_keys.dim(0);
  DSV41_CHECK(first_entry >= 0 && first_entry <= size_ && first_entry + n <= capacity_,
              "index-key cache of layer ", owner_layer_, ": write of ", n, " entries at ",
              first_entry, " (size ", size_, ", capacity ", capacity_, ")");
  const std::vector<uint8_t> packed =  // kIndexKeyFp4: the QDQ happens here; kBf16: none
      formats::pack_rows(format_, roped_keys.data(), static_cast<int>(n), static_cast<int>(dim_));
  std::copy(packed.begin(), packed.end(), bytes_.begin() + first_entry * entry_bytes_);
  size_ = first_entry + n;
}

const uint8_t* IndexKeyCache::entry(int64_t e) const {
  DSV41_CHECK(e >= 0 && e < size_, "index-key cache of layer ", owner_layer_, ": entry ", e,
              " of ", size_);
  return bytes_.data() + e * entry_bytes_;
}

void IndexKeyCache::restore(const uint8_t* bytes, int64_t count) {
  DSV41_CHECK(count >= 0 && count <= capacity_, "index-key cache of layer ", owner_layer_,
              ": restore of ", count, " entries, capacity ", capacity_);
  if (precision_ == CachePrecision::kBf16) {  // raw bf16: finite values are all it can hold
    try {
      formats::unpack_rows(format_, std::vector<uint8_t>(bytes, bytes + count * entry_bytes_),
                           static_cast<int>(count), static_cast<int>(dim_));
    } catch (const Error& e) {
      DSV41_FAIL("index-key cache of layer ", owner_layer_, " (bf16): ", e.what());
    }
    std::copy(bytes, bytes + count * entry_bytes_, bytes_.begin());
    size_ = count;
    return;
  }
  // The scales the quantizer can write: from the amax floor to the largest finite amax.
  const uint8_t lo = formats::index_scale(0.0f);
  const uint8_t hi = formats::index_scale(std::numeric_limits<float>::max());
  const auto hex_byte = [](uint8_t v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", v);
    return std::string(buf);
  };
  for (int64_t e = 0; e < count; ++e) {
    const uint8_t* scales = bytes + e * entry_bytes_ + dim_ / 2;
    for (int64_t b = 0; b < dim_ / formats::kIndexBlock; ++b) {
      if (scales[b] < lo || scales[b] > hi) {
        DSV41_FAIL("index-key cache of layer ", owner_layer_, ": entry ", e, " block ", b,
                   " has scale byte ", hex_byte(scales[b]), ", not an E8M0 scale the quantizer writes [",
                   hex_byte(lo), ", ", hex_byte(hi), "]");
      }
    }
  }
  std::copy(bytes, bytes + count * entry_bytes_, bytes_.begin());
  size_ = count;
}

Tensor<float> IndexKeyCache::read(int expected_owner, int expected_ratio, int64_t count) const {
  if (expected_owner != owner_layer_ || expected_ratio != ratio_) {
    DSV41_FAIL("index-key cache: a consumer expects the keys of layer ", expected_owner,
               " (ratio ", expected_ratio, ") but this cache belongs to layer ", owner_layer_,
               " (ratio ", ratio_, ")");
  }
  DSV41_CHECK(count >= 0 && count <= size_, "index-key cache of layer ", owner_layer_,
              ": read of ", count, " entries, ", size_, " written");
  const std::vector<uint8_t> bytes(bytes_.begin(), bytes_.begin() + count * entry_bytes_);
  return Tensor<float>({count, dim_},
                       formats::unpack_rows(format_, bytes, static_cast<int>(count), static_cast<int>(dim_)),
                       "index_k");
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
