#include "reference/ops/compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "formats/minifloat.h"

namespace dsv41::reference {

void pool_group(const float* const* kv_rows, const float* const* score_rows, int ratio,
                int64_t dim, float* out) {
  std::vector<float> e(static_cast<size_t>(ratio));
  for (int64_t c = 0; c < dim; ++c) {
    float m = score_rows[0][c];
    for (int t = 1; t < ratio; ++t) m = std::max(m, score_rows[t][c]);
    float z = 0.0f;
    for (int t = 0; t < ratio; ++t) {
      e[static_cast<size_t>(t)] = std::exp(score_rows[t][c] - m);
      z += e[static_cast<size_t>(t)];
    }
    float acc = 0.0f;
    for (int t = 0; t < ratio; ++t) {
      const float w = e[static_cast<size_t>(t)] / z;
      const float prod = kv_rows[t][c] * w;  // rounded to fp32 before the sum
      acc += prod;
    }
    out[c] = acc;
  }
}

CompressedLatents compress(const Tensor<float>& kv, const Tensor<float>& score, int64_t start_pos, int ratio,
                           Tensor<float>& kv_state, Tensor<float>& score_state) {
  DSV41_CHECK(ratio >= 2, "compress: ratio ", ratio, " (ratio 1 has no pooling: latent = norm(wkv(x)), no state)");
  DSV41_CHECK(kv_state.rank() == 2 && kv_state.dim(0) == ratio && score_state.shape() == kv_state.shape(),
              "compress: state ", shape_string(kv_state.shape()), " / ", shape_string(score_state.shape()),
              ", want [", ratio, ", dim] both");
  const int64_t dim = kv_state.dim(1);
  DSV41_CHECK(kv.rank() == 2 && score.rank() == 2 && kv.shape() == score.shape() &&
                  kv.dim(1) == dim,
              "compress: kv ", kv.rank() == 2 ? kv.dim(0) : -1, "x", kv.rank() == 2 ? kv.dim(1) : -1,
              ", score ", score.rank() == 2 ? score.dim(0) : -1, "x",
              score.rank() == 2 ? score.dim(1) : -1, ", want [T, ", dim, "] both");
  const int64_t seqlen = kv.dim(0);
  const int64_t end_pos = start_pos + seqlen;
  // Group g ends at token g * ratio + ratio - 1: the groups completed here are
  // [start_pos / ratio, end_pos / ratio).
  CompressedLatents result;
  result.first_group = start_pos / ratio;
  const int64_t end_group = end_pos / ratio;
  const int64_t n = std::max<int64_t>(0, end_group - result.first_group);
  result.latent = Tensor<float>({n, dim}, "compressor_latent");

  std::vector<const float*> kv_rows(static_cast<size_t>(ratio));
  std::vector<const float*> score_rows(static_cast<size_t>(ratio));
  std::vector<float> pooled(static_cast<size_t>(dim));
  for (int64_t g = result.first_group; g < end_group; ++g) {
    const bool inside = g * ratio >= start_pos;  // every token of the group is in this call
    for (int t = 0; t < ratio; ++t) {
      const int64_t p = g * ratio + t;
      if (inside) {
        kv_rows[static_cast<size_t>(t)] = kv.row(p - start_pos);
        score_rows[static_cast<size_t>(t)] = score.row(p - start_pos);
      } else {
        if (p >= start_pos) {  // decode-style: write the slot, then pool from the state
          std::copy(kv.row(p - start_pos), kv.row(p - start_pos) + dim, kv_state.row(t));
          std::copy(score.row(p - start_pos), score.row(p - start_pos) + dim, score_state.row(t));
        }
        kv_rows[static_cast<size_t>(t)] = kv_state.row(t);
        score_rows[static_cast<size_t>(t)] = score_state.row(t);
      }
    }
    pool_group(kv_rows.data(), score_rows.data(), ratio, dim, pooled.data());
    float* out = result.latent.row(g - result.first_group);
    for (int64_t c = 0; c < dim; ++c) out[c] = formats::round_to_bf16(pooled[static_cast<size_t>(c)]);
  }
  // The trailing partial group waits in its slots.
  for (int64_t p = std::max(start_pos, end_group * ratio); p < end_pos; ++p) {
    const int64_t slot = p % ratio;
    std::copy(kv.row(p - start_pos), kv.row(p - start_pos) + dim, kv_state.row(slot));
    std::copy(score.row(p - start_pos), score.row(p - start_pos) + dim, score_state.row(slot));
  }
  return result;
}

}  // namespace dsv41::reference
