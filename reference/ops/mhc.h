// reference/ops/mhc.h
//
// Single-pass mHC (manifold-constrained hyper-connections), as the official Block.hc_mixes /
// hc_pre / hc_post (model.py) and hc_split_sinkhorn (kernel.py, via its CPU port) compute them.
// The residual stream is hc copies of the hidden state, [T, hc, dim] bf16. Around each sublayer F:
//
//   mixes      = hc_mixes(stream, fn, scale, base)    pre [T, hc], post [T, hc], comb [T, hc, hc]
//   in         = hc_pre(stream, pre_prev)             [T, dim] bf16  (pre of the PREVIOUS sublayer;
//                                                     layer 0's attention: hc_identity_pre)
//   stream'    = hc_post(F(norm(in)), stream, post, comb)             [T, hc, dim] bf16
//
// Arithmetic (all fp32 unless stated; no FMA outside torch_vec_exp_f32; bf16 rounding only where
// named):
//   hc_raw_mixes   x = stream[t] flattened to hc*dim;
//                  r = 1 / sqrt(torch_sum_f32(x*x) / (hc*dim) + (float)norm_eps)   (norm_eps, NOT
//                  hc_eps; torch's CPU sum order, reference/ops/rmsnorm.h);
//                  mix[k] = dot_f64_f32(x, fn[k]) * r   (F.linear in fp32: double accumulation in
//                  index order, rounded once; the oracle's BLAS order is unknown).
//   hc_split_sinkhorn (per token, m = mix, s = scale, b = base, e = (float)hc_eps):
//                  pre[i]  = sigmoid(m[i]*s0 + b[i]) + e
//                  post[i] = 2 * sigmoid(m[hc+i]*s1 + b[hc+i])
//                  c[i][j] = m[2hc + i*hc + j]*s2 + b[2hc + i*hc + j]   (row-major [i][j])
//                  c[i][j] = exp(c[i][j] - max_j c[i][.]); c[i][j] = c[i][j] / rowsum_i + e;
//                  c[i][j] = c[i][j] / (colsum_j + e);
//                  (iters - 1) times: c /= (rowsum + e) per row, then c /= (colsum + e) per column.
//                  sigmoid(z) = 1 / (1 + torch_vec_exp_f32(-z)) (torch's CPU sigmoid, below); the
//                  comb's exp is std::exp (the oracle's MKL exp differs only at near-ties). Every
//                  row/column sum is sequential in index order from 0 (torch's order for 4 values).
//   hc_pre         y[d] = bf16(sum_i pre[i] * x[i][d])   products fp32, sum sequential over i.
//   hc_post        y[j][d] = bf16(post[j] * f[d] + sum_i comb[i][j] * res[i][d]): the products
//                  are fp32, the sum over i is sequential from 0, then ONE fp32 add of the two
//                  parts, then bf16. Note the index: out copy j takes column j of comb.
//
// Exactness against the oracle (tests/reference/ops/mhc_test.cc, docs/mhc.md): split + Sinkhorn on
// kernels.h5: pre and post bit-exact, comb bit-exact except tokens where the oracle's MKL exp
// rounded a near-tie the other way (5 of 48, each proven); hc_pre and hc_post bit-exact on every
// layer of the prefill and the decode steps; hc_raw_mixes within the error budget of the oracle's
// fp32 GEMM (its summation order is unknown), worst 4% of it.
//
// Example:
//   HcMixes m = hc_mixes(stream, w.hc_attn.fn, w.hc_attn.scale, w.hc_attn.base, c.norm_eps,
//                        c.hc_sinkhorn_iters, c.hc_eps);
//   Tensor<float> in = hc_pre(stream, pre_prev);                  // -> attention
//   Tensor<float> next = hc_post(attn_out, stream, m.post, m.comb);
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

// The mHC weights of one sublayer (checkpoint "<P>hc_attn_*" or "<P>hc_ffn_*").
struct HcWeights {
  Tensor<float> fn;     // [(2+hc)*hc, hc*dim] fp32
  Tensor<float> base;   // [(2+hc)*hc] fp32
  Tensor<float> scale;  // [3] fp32
};

// The three coefficient sets of one sublayer.
struct HcMixes {
  Tensor<float> pre;   // [T, hc] fp32, in [hc_eps, 1 + hc_eps]
  Tensor<float> post;  // [T, hc] fp32, in [0, 2]
  Tensor<float> comb;  // [T, hc, hc] fp32 [i][j], doubly stochastic up to the Sinkhorn residual
};

// Number of mixes per token: hc pre + hc post + hc*hc comb.
inline constexpr int64_t hc_mix_count(int64_t hc) { return (2 + hc) * hc; }

// Unnormalised mixes of the flattened stream.
// stream: [T, hc, dim] bf16, fn: [(2+hc)*hc, hc*dim] fp32 -> [T, (2+hc)*hc] fp32.
Tensor<float> hc_raw_mixes(const Tensor<float>& stream, const std::vector<float>& fn,
                           double norm_eps);

// The exp of torch's CPU Vectorized<float>::exp (AVX2): SLEEF's expf_u10 algorithm, re-derived
// here in fp32 with explicit fused multiply-adds (std::fma, correctly rounded everywhere):
//   q = rint(x * log2(e)) (ties to even), s = fma(q, -ln2_hi, x), s = fma(q, -ln2_lo, s),
//   u = degree-5 polynomial in s by Horner fmas, u = 1 + fma(s*s, u, s), u = u * 2^(q>>1) *
//   2^(q - (q>>1)); x < -104 -> 0, x > 100 -> +Inf, NaN -> NaN. Within 1 ulp of exp(x), not
//   correctly rounded.
// It is what torch's CPU sigmoid uses on full vectors (see torch_sigmoid_f32).
float torch_vec_exp_f32(float x);

// sigmoid(z) = 1 / (1 + torch_vec_exp_f32(-z)) in fp32: torch's CPU sigmoid kernel (vector path),
// bit-exact on kernels.h5 hc_sinkhorn pre/post (192/192 each; std::exp in its place: 184 and 188).
// Shared by mHC and Engram.
float torch_sigmoid_f32(float z);

// The comb's softmax arguments: l[i][j] = c[i][j] - max_j c[i][j] with c[i][j] = m[2hc + i*hc + j]
// * s2 + b[2hc + i*hc + j] (fp32). mix: [(2+hc)*hc], scale: [3], base: [(2+hc)*hc] -> [hc*hc].
void hc_comb_logits_row(const float* mix, const float* scale, const float* base, int hc,
                        float* logits);

// Sinkhorn normalisation of one comb, given e[i][j] = exp(l[i][j]) (std::exp in the reference):
// rows: e / rowsum + eps; columns: / (colsum + eps); then (iters - 1) x {rows / (rowsum + eps),
// columns / (colsum + eps)}. comb: [hc*hc] row-major, in place; fp32, sums sequential from 0.
void hc_sinkhorn_row(float* comb, int hc, int iters, double hc_eps);

// Split of one token's mixes and Sinkhorn normalisation of comb (all fp32): pre and post with
// torch_sigmoid_f32, comb = hc_sinkhorn_row(std::exp(hc_comb_logits_row(...))).
// mix: [(2+hc)*hc], scale: [3], base: [(2+hc)*hc] -> pre: [hc], post: [hc], comb: [hc*hc]
// row-major.
void hc_split_sinkhorn_row(const float* mix, const float* scale, const float* base, int hc,
                           int iters, double hc_eps, float* pre, float* post, float* comb);

// hc_split_sinkhorn_row over tokens. mixes: [T, (2+hc)*hc] fp32 -> HcMixes.
HcMixes hc_split_sinkhorn(const Tensor<float>& mixes, const std::vector<float>& scale,
                          const std::vector<float>& base, int hc, int iters, double hc_eps);

// Block.hc_mixes: hc_raw_mixes then hc_split_sinkhorn. stream: [T, hc, dim] bf16.
HcMixes hc_mixes(const Tensor<float>& stream, const std::vector<float>& fn,
                 const std::vector<float>& scale, const std::vector<float>& base, double norm_eps,
                 int iters, double hc_eps);

// The one-hot pre of the first sublayer (make_identity_pre_mix): [T, hc] fp32, [1, 0, ..., 0].
Tensor<float> hc_identity_pre(int64_t tokens, int64_t hc);

// Collapse the copies. stream: [T, hc, dim] bf16, pre: [T, hc] fp32 -> [T, dim] bf16.
Tensor<float> hc_pre(const Tensor<float>& stream, const Tensor<float>& pre);

// Expand the sublayer output back to hc copies and mix the residual in.
// f: [T, dim] bf16, residual: [T, hc, dim] bf16, post: [T, hc] fp32, comb: [T, hc, hc] fp32
// -> [T, hc, dim] bf16.
Tensor<float> hc_post(const Tensor<float>& f, const Tensor<float>& residual,
                      const Tensor<float>& post, const Tensor<float>& comb);

}  // namespace dsv41::reference
