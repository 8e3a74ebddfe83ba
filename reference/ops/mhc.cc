// reference/ops/mhc.cc: single-pass mHC mixes, Sinkhorn, hc_pre and hc_post (see mhc.h).
#include "reference/ops/mhc.h"

#include <algorithm>
#include <cmath>

#include "base/base.h"
#include "base/error.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"

namespace dsv41::reference {
namespace {

// 2^q as a float for -126 <= q <= 127 (exponent field only).
float pow2i(int q) { return f32_from_bits(static_cast<uint32_t>(q + 127) << 23); }

// c[i][j] /= (sum_j c[i][j] + e) for every row i; the sum is sequential from 0.
void normalise_rows(float* c, int hc, float e) {
  for (int i = 0; i < hc; ++i) {
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum += c[i * hc + j];
    const float d = sum + e;
    for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / d;
  }
}

// c[i][j] /= (sum_i c[i][j] + e) for every column j; the sum is sequential from 0.
void normalise_cols(float* c, int hc, float e) {
  for (int j = 0; j < hc; ++j) {
    float sum = 0.0f;
    for (int i = 0; i < hc; ++i) sum += c[i * hc + j];
    const float d = sum + e;
    for (int i = 0; i < hc; ++i) c[i * hc + j] = c[i * hc + j] / d;
  }
}

}  // namespace

Tensor<float> hc_raw_mixes(const Tensor<float>& stream, const std::vector<float>& fn,
                           double norm_eps) {
  DSV41_CHECK(stream.rank() == 3, "hc_mixes: stream must be [T, hc, dim], got rank ",
              stream.rank());
  const int64_t tokens = stream.dim(0), hc = stream.dim(1), dim = stream.dim(2);
  const int64_t width = hc * dim;
  const int64_t n_mix = hc_mix_count(hc);
  DSV41_CHECK(static_cast<int64_t>(fn.size()) == n_mix * width, "hc_mixes: hc_fn must be [", n_mix,
              ", ", width, "], got ", fn.size(), " values");
  const float eps = static_cast<float>(norm_eps);
  const float width_f = static_cast<float>(width);
  Tensor<float> mixes({tokens, n_mix}, "hc_mixes");
  parallel_for(tokens, [&](int64_t t) {
    const float* x = stream.row(t, 0);  // the hc copies are contiguous: [hc * dim]
    std::vector<float> sq(static_cast<size_t>(width));
    for (int64_t k = 0; k < width; ++k) sq[static_cast<size_t>(k)] = x[k] * x[k];
    const float r = 1.0f / std::sqrt(torch_sum_f32(sq.data(), width) / width_f + eps);
    int64_t k = 0;
    for (; k + 4 <= n_mix; k += 4) {  // four mixes side by side, each its own chain in index order
      const float* rows[4] = {fn.data() + k * width, fn.data() + (k + 1) * width, fn.data() + (k + 2) * width,
                              fn.data() + (k + 3) * width};
      float v[4];
      dot_f64_f32_x4(x, rows, width, v);
      for (int j = 0; j < 4; ++j) mixes.at(t, k + j) = v[j] * r;
    }
    for (; k < n_mix; ++k) mixes.at(t, k) = dot_f64_f32(x, fn.data() + k * width, width) * r;
  });
  return mixes;
}

float torch_vec_exp_f32(float x) {
  constexpr float kLog2e = 1.442695040888963407359924681001892137426645954152985934135449406931f;
  constexpr float kLn2Hi = 0.693145751953125f;         // ln 2 split: hi has 17 significant bits
  constexpr float kLn2Lo = 1.428606765330187045e-06f;  // ln 2 - kLn2Hi
  // exp(s) - 1 - s = s^2 * (1/2 + s/6 + ...) on |s| <= ln2/2: minimax coefficients, highest first.
  constexpr float kPoly[] = {0.000198527617612853646278381f, 0.00139304355252534151077271f,
                             0.00833336077630519866943359f,  0.0416664853692054748535156f,
                             0.166666671633720397949219f,    0.5f};
  if (std::isnan(x)) return x;
  if (x < -104.0f) return 0.0f;      // below the fp32 subnormal range
  if (x > 100.0f) return HUGE_VALF;  // SLEEF's overflow threshold (exp(100) < FLT_MAX, kept as is)
  const int q = static_cast<int>(std::nearbyint(x * kLog2e));  // default rounding: ties to even
  const float qf = static_cast<float>(q);
  float s = std::fma(qf, -kLn2Hi, x);
  s = std::fma(qf, -kLn2Lo, s);
  float u = kPoly[0];
  for (int k = 1; k < 6; ++k) u = std::fma(u, s, kPoly[k]);
  u = 1.0f + std::fma(s * s, u, s);
  return u * pow2i(q >> 1) * pow2i(q - (q >> 1));  // 2^q in two steps: each factor normal
}

float torch_sigmoid_f32(float z) { return 1.0f / (1.0f + torch_vec_exp_f32(-z)); }

void hc_comb_logits_row(const float* mix, const float* scale, const float* base, int hc,
                        float* logits) {
  const int off = 2 * hc;
  for (int k = 0; k < hc * hc; ++k) logits[k] = mix[off + k] * scale[2] + base[off + k];
  for (int i = 0; i < hc; ++i) {
    float* row = logits + i * hc;
    float mx = row[0];
    for (int j = 1; j < hc; ++j) mx = std::max(mx, row[j]);
    for (int j = 0; j < hc; ++j) row[j] = row[j] - mx;
  }
}

void hc_sinkhorn_row(float* comb, int hc, int iters, double hc_eps) {
  DSV41_CHECK(hc >= 1 && iters >= 1, "hc_sinkhorn: need hc >= 1 and iters >= 1, got ", hc, ", ",
              iters);
  const float e = static_cast<float>(hc_eps);
  // The softmax's division (by the plain row sum), then + e.
  for (int i = 0; i < hc; ++i) {
    float* row = comb + i * hc;
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum += row[j];
    for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + e;
  }
  normalise_cols(comb, hc, e);
  for (int it = 1; it < iters; ++it) {
    normalise_rows(comb, hc, e);
    normalise_cols(comb, hc, e);
  }
}

void hc_split_sinkhorn_row(const float* mix, const float* scale, const float* base, int hc,
                           int iters, double hc_eps, float* pre, float* post, float* comb) {
  DSV41_CHECK(hc >= 1, "hc_split_sinkhorn: need hc >= 1, got ", hc);
  const float e = static_cast<float>(hc_eps);
  for (int i = 0; i < hc; ++i) {
    pre[i] = torch_sigmoid_f32(mix[i] * scale[0] + base[i]) + e;
    post[i] = 2.0f * torch_sigmoid_f32(mix[hc + i] * scale[1] + base[hc + i]);
  }
  hc_comb_logits_row(mix, scale, base, hc, comb);
  for (int k = 0; k < hc * hc; ++k) comb[k] = std::exp(comb[k]);
  hc_sinkhorn_row(comb, hc, iters, hc_eps);
}

HcMixes hc_split_sinkhorn(const Tensor<float>& mixes, const std::vector<float>& scale,
                          const std::vector<float>& base, int hc, int iters, double hc_eps) {
  const int64_t n_mix = hc_mix_count(hc);
  DSV41_CHECK(mixes.rank() == 2 && mixes.dim(1) == n_mix, "hc_split_sinkhorn: mixes must be [T, ",
              n_mix, "], got ", shape_string(mixes.shape()));
  DSV41_CHECK(scale.size() == 3, "hc_split_sinkhorn: hc_scale must hold 3 values, got ",
              scale.size());
  DSV41_CHECK(static_cast<int64_t>(base.size()) == n_mix, "hc_split_sinkhorn: hc_base must hold ",
              n_mix, " values, got ", base.size());
  const int64_t tokens = mixes.dim(0);
  HcMixes m{Tensor<float>({tokens, hc}, "hc_pre_mix"), Tensor<float>({tokens, hc}, "hc_post_mix"),
            Tensor<float>({tokens, hc, hc}, "hc_comb")};
  for (int64_t t = 0; t < tokens; ++t) {
    hc_split_sinkhorn_row(mixes.row(t), scale.data(), base.data(), hc, iters, hc_eps, m.pre.row(t),
                          m.post.row(t), m.comb.row(t, 0));
  }
  return m;
}

HcMixes hc_mixes(const Tensor<float>& stream, const std::vector<float>& fn,
                 const std::vector<float>& scale, const std::vector<float>& base, double norm_eps,
                 int iters, double hc_eps) {
  const Tensor<float> raw = hc_raw_mixes(stream, fn, norm_eps);
  return hc_split_sinkhorn(raw, scale, base, static_cast<int>(stream.dim(1)), iters, hc_eps);
}

Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc) {
  DSV41_CHECK(tokens >= 0 && hc >= 1, "hc_identity_pre: tokens ", tokens, ", hc ", hc);
  Tensor<float> pre({tokens, hc}, "hc_identity_pre");
  for (int64_t t = 0; t < tokens; ++t) pre.at(t, 0) = 1.0f;
  return pre;
}

Tensor<float> hc_pre(const Tensor<float>& stream, const Tensor<float>& pre) {
  DSV41_CHECK(stream.rank() == 3, "hc_pre: stream must be [T, hc, dim], got rank ", stream.rank());
  const int64_t tokens = stream.dim(0), hc = stream.dim(1), dim = stream.dim(2);
  DSV41_CHECK(pre.rank() == 2 && pre.dim(0) == tokens && pre.dim(1) == hc, "hc_pre: pre must be [",
              tokens, ", ", hc, "], got ", shape_string(pre.shape()));
  Tensor<float> y({tokens, dim}, "hc_pre_out");
  for (int64_t t = 0; t < tokens; ++t) {
    const float* p = pre.row(t);          // [hc]
    const float* x = stream.row(t, 0);    // [hc, dim]
    float* yr = y.row(t);
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.0f;
      for (int64_t i = 0; i < hc; ++i) sum += p[i] * x[i * dim + d];
      yr[d] = round_to_bf16(sum);
    }
  }
  return y;
}

Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& residual,
                      const Tensor<float>& post, const Tensor<float>& comb) {
  DSV41_CHECK(residual.rank() == 3, "hc_post: residual must be [T, hc, dim], got rank ",
              residual.rank());
  const int64_t tokens = residual.dim(0), hc = residual.dim(1), dim = residual.dim(2);
  DSV41_CHECK(f.rank() == 2 && f.dim(0) == tokens && f.dim(1) == dim, "hc_post: f must be [",
              tokens, ", ", dim, "], got ", shape_string(f.shape()));
  DSV41_CHECK(post.rank() == 2 && post.dim(0) == tokens && post.dim(1) == hc,
              "hc_post: post must be [", tokens, ", ", hc, "], got ",
              shape_string(post.shape()));
  DSV41_CHECK(comb.rank() == 3 && comb.dim(0) == tokens && comb.dim(1) == hc && comb.dim(2) == hc,
              "hc_post: comb must be [", tokens, ", ", hc, ", ", hc, "], got ",
              shape_string(comb.shape()));
  Tensor<float> y({tokens, hc, dim}, "hc_post_out");
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = comb.row(t, 0);      // [hc, hc] [i][j]
    const float* res = residual.row(t, 0);  // [hc, dim]
    const float* ft = f.row(t);           // [dim]
    for (int64_t j = 0; j < hc; ++j) {
      const float pj = post.at(t, j);
      float* yr = y.row(t, j);
      for (int64_t d = 0; d < dim; ++d) {
        float mixed = 0.0f;
        for (int64_t i = 0; i < hc; ++i) mixed += c[i * hc + j] * res[i * dim + d];
        yr[d] = round_to_bf16(pj * ft[d] + mixed);
      }
    }
  }
  return y;
}

}  // namespace dsv41::reference
