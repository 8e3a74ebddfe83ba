#include "reference/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "formats/cache_format.h"
#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One (query, head) row of sparse_attn. q: [D] bf16, out: [D] bf16.
void sparse_attn_row(const float* q, const Tensor<float>& kv, float sink, const int32_t* idx,
                     int64_t k_total, float scale, float* out) {
  const int64_t d = kv.dim(1);
  const int64_t n = kv.dim(0);
  const std::vector<float> zero(static_cast<size_t>(d), 0.0f);  // the zeroed KV row of index -1
  std::vector<float> acc(static_cast<size_t>(d), 0.0f);   // fp32 numerator
  // The block's KV rows (rows [0, nb) are written before they are read): one buffer per thread.
  thread_local std::vector<float> block_kv;
  block_kv.resize(static_cast<size_t>(kSparseAttnBlock * d));
  OnlineSoftmax sm;  // running max and denominator (fp32)
  for (int64_t b0 = 0; b0 < k_total; b0 += kSparseAttnBlock) {
    const int64_t nb = std::min<int64_t>(kSparseAttnBlock, k_total - b0);
    // Scores: fp32 FMA chains in d order (fma_dot_f32: the order torch's CPU fp32 GEMM used for
    // the official einsums, measured in docs/attention.md), four rows side by side.
    float s[kSparseAttnBlock];
    const float* rows[kSparseAttnBlock];
    for (int64_t j = 0; j < nb; ++j) {
      const int32_t r = idx[b0 + j];
      DSV41_CHECK(r >= -1 && r < n, "sparse_attn: index ", r, " at column ", b0 + j,
                  " outside [-1, ", n, ")");
      rows[j] = r < 0 ? zero.data() : kv.row(r);
      std::copy(rows[j], rows[j] + d, block_kv.begin() + j * d);
    }
    int64_t j4 = 0;
    for (; j4 + 4 <= nb; j4 += 4) fma_dot_f32_x4(q, rows + j4, 1, d, s + j4);
    for (; j4 < nb; ++j4) s[j4] = fma_dot_f32(q, rows[j4], 1, d);
    for (int64_t j = 0; j < nb; ++j) s[j] = idx[b0 + j] < 0 ? -kInf : s[j] * scale;
    float p_bf16[kSparseAttnBlock];
    const float rescale = sm.block(s, nb, p_bf16);
    // P.V per channel: an FMA chain over the block's rows in j order, four channels side by side.
    float pv[4];
    int64_t c = 0;
    for (; c + 4 <= d; c += 4) {
      const float* cols[4] = {block_kv.data() + c, block_kv.data() + c + 1, block_kv.data() + c + 2,
                              block_kv.data() + c + 3};
      fma_dot_f32_x4(p_bf16, cols, d, nb, pv);
      for (int k = 0; k < 4; ++k) acc[static_cast<size_t>(c + k)] = acc[static_cast<size_t>(c + k)] * rescale + pv[k];
    }
    for (; c < d; ++c) {
      acc[static_cast<size_t>(c)] = acc[static_cast<size_t>(c)] * rescale + fma_dot_f32(p_bf16, block_kv.data() + c, d, nb);
    }
  }
  const float l = sm.finish(sink);  // the sink: denominator only, not scaled
  for (int64_t c = 0; c < d; ++c) out[c] = formats::round_to_bf16(acc[static_cast<size_t>(c)] / l);
}

}  // namespace

float OnlineSoftmax::block(const float* s, int64_t nb, float* p_bf16) {
  float block_max = -kInf;
  for (int64_t j = 0; j < nb; ++j) block_max = std::max(block_max, s[j]);
  const float m_new = std::max(m, block_max);
  const float rescale = std::exp(m - m_new);
  double p_sum = 0.0;
  for (int64_t j = 0; j < nb; ++j) {
    const float p = std::exp(s[j] - m_new);
    p_sum += static_cast<double>(p);
    p_bf16[j] = formats::round_to_bf16(p);  // K41:377: probabilities cast to bf16 before PV
  }
  l = l * rescale + static_cast<float>(p_sum);
  m = m_new;
  return rescale;
}

float OnlineSoftmax::finish(float sink) const { return l + std::exp(sink - m); }

Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& kv,
                          const std::vector<float>& sink, const Tensor<int32_t>& idxs,
                          float softmax_scale) {
  DSV41_CHECK(q.rank() == 3 && kv.rank() == 2 && idxs.rank() == 2, "sparse_attn: q ",
              q.rank(), "-d, kv ", kv.rank(), "-d, idxs ", idxs.rank(), "-d; want 3, 2, 2");
  const int64_t t_count = q.dim(0), heads = q.dim(1), d = q.dim(2);
  DSV41_CHECK(kv.dim(1) == d, "sparse_attn: kv width ", kv.dim(1), " != head_dim ", d);
  DSV41_CHECK(idxs.dim(0) == t_count, "sparse_attn: ", idxs.dim(0), " index rows for ", t_count,
              " queries");
  DSV41_CHECK(static_cast<int64_t>(sink.size()) == heads, "sparse_attn: ", sink.size(),
              " sink values for ", heads, " heads");
  Tensor<float> out({t_count, heads, d}, "sparse_attn_out");
  parallel_for(t_count * heads, [&](int64_t i) {
    const int64_t t = i / heads, h = i % heads;
    sparse_attn_row(q.row(t, h), kv, sink[static_cast<size_t>(h)], idxs.row(t), idxs.dim(1),
                    softmax_scale, out.row(t, h));
  });
  return out;
}

Tensor<int32_t> window_topk_idxs_prefill(int window, int64_t start_pos, int64_t seqlen,
                                         int64_t kv_first_pos) {
  DSV41_CHECK(window > 0 && start_pos >= 0 && seqlen > 0, "window index rows: window ", window,
              ", start_pos ", start_pos, ", seqlen ", seqlen);
  const int64_t first_needed = std::max<int64_t>(0, start_pos - window + 1);
  DSV41_CHECK(kv_first_pos >= 0 && kv_first_pos <= first_needed, "window index rows: KV rows start at position ",
              kv_first_pos, " but query ", start_pos, " reads position ", first_needed);
  const int64_t width = std::min<int64_t>(start_pos + seqlen, window);
  Tensor<int32_t> idx({seqlen, width}, "window_topk_idxs");
  for (int64_t t = 0; t < seqlen; ++t) {
    const int64_t p = start_pos + t;
    const int64_t lo = std::max<int64_t>(0, p - window + 1);
    for (int64_t j = 0; j < width; ++j) {
      const int64_t pos = lo + j;
      idx.at(t, j) = pos > p ? -1 : static_cast<int32_t>(pos - kv_first_pos);
    }
  }
  return idx;
}

Tensor<int32_t> window_topk_idxs_decode(int window, int64_t pos) {
  DSV41_CHECK(window > 0 && pos >= 0, "window index row: window ", window, ", pos ", pos);
  Tensor<int32_t> idx({1, window}, "window_topk_idxs");
  const int64_t oldest = pos % window + 1;
  for (int64_t j = 0; j < window; ++j) {
    const int64_t slot = (oldest + j) % window;  // oldest .. W-1, then 0 .. oldest-1
    idx.at(0, j) = slot > pos ? -1 : static_cast<int32_t>(slot);
  }
  return idx;
}

Tensor<int32_t> concat_topk_idxs(const Tensor<int32_t>& window, const Tensor<int32_t>& compressed) {
  DSV41_CHECK(window.rank() == 2 && compressed.rank() == 2 && window.dim(0) == compressed.dim(0),
              "concat_topk_idxs: window rows ", window.dim(0), ", compressed rows ",
              compressed.rank() == 2 ? compressed.dim(0) : -1);
  const int64_t rows = window.dim(0), kw = window.dim(1), kc = compressed.dim(1);
  Tensor<int32_t> out({rows, kw + kc}, "topk_idxs");
  for (int64_t t = 0; t < rows; ++t) {
    std::copy(window.row(t), window.row(t) + kw, out.row(t));
    std::copy(compressed.row(t), compressed.row(t) + kc, out.row(t) + kw);
  }
  return out;
}

Tensor<float> concat_kv_rows(const Tensor<float>& window, const Tensor<float>& compressed) {
  DSV41_CHECK(window.rank() == 2 && compressed.rank() == 2 && window.dim(1) == compressed.dim(1),
              "concat_kv_rows: widths ", window.dim(1), " and ",
              compressed.rank() == 2 ? compressed.dim(1) : -1);
  Tensor<float> out({window.dim(0) + compressed.dim(0), window.dim(1)}, "sparse_kv");
  std::copy(window.data().begin(), window.data().end(), out.data().begin());
  // The compressed rows in blocks side by side (a copy; 512 MB per layer at 2^20 entries of 128).
  constexpr int64_t kBlock = 1 << 16;
  const int64_t count = compressed.numel();
  parallel_for((count + kBlock - 1) / kBlock, [&](int64_t b) {
    const int64_t first = b * kBlock, last = std::min(count, first + kBlock);
    std::copy(compressed.data().begin() + first, compressed.data().begin() + last,
              out.data().begin() + window.numel() + first);
  });
  return out;
}

Tensor<int32_t> window_index_rows(int window, int64_t start_pos, int64_t seqlen, int64_t kv_first_pos,
                                  int64_t floor) {
  DSV41_CHECK(window > 0 && start_pos >= 0 && seqlen >= 0, "window index rows: window ", window, ", start_pos ",
              start_pos, ", seqlen ", seqlen);
  Tensor<int32_t> out({seqlen, window}, "window_idxs", -1);
  for (int64_t t = 0; t < seqlen; ++t) {
    const int64_t p = start_pos + t, first = std::max<int64_t>(floor, p - window + 1);
    DSV41_CHECK(first >= kv_first_pos, "window row of position ", p, " needs position ", first,
                " before the first KV row ", kv_first_pos);
    int32_t* row = out.row(t);  // [window]; unchecked: q - first < window
    for (int64_t q = first; q <= p; ++q) row[q - first] = static_cast<int32_t>(q - kv_first_pos);
  }
  return out;
}

Tensor<int32_t> attention_index_rows(const Tensor<int32_t>& window, const Tensor<int32_t>& topk, int64_t offset,
                                     int64_t width) {
  DSV41_CHECK(window.rank() == 2 && topk.rank() == 2 && topk.dim(0) == window.dim(0) && topk.dim(1) <= width &&
                  offset >= 0,
              "attention_index_rows: window ", shape_string(window.shape()), ", top-k ", shape_string(topk.shape()),
              ", width ", width, ", offset ", offset);
  const int64_t rows = window.dim(0), kw = window.dim(1), k = topk.dim(1);
  Tensor<int32_t> out({rows, kw + width}, "topk_idxs", -1);
  for (int64_t t = 0; t < rows; ++t) {
    int32_t* o = out.row(t);
    const int32_t* sel = k > 0 ? topk.row(t) : nullptr;
    std::copy(window.row(t), window.row(t) + kw, o);
    for (int64_t j = 0; j < k; ++j) o[kw + j] = sel[j] < 0 ? -1 : static_cast<int32_t>(sel[j] + offset);
  }
  return out;
}

}  // namespace dsv41::reference
