// sparse_attn of the exact evaluation (scenarios/exact/exact_eval.h): the online softmax with the sink
// and the bf16 probabilities of the official kernel (reference/ops/attention.h), evaluated exactly.
//
// Semantics, per (t, h), with s_j = q . kv_j * scale exact, blocks of 64 indices, m_b the running
// max after block b (from -1e30), M the last one:
//   out = sum_j bf16(exp(s_j - m_b(j))) exp(m_b(j) - M) v_j / (sum_j exp(s_j - M) + exp(sink - M))
// (the bf16 rounding of each probability is the spec's; the denominator sums the unrounded ones).
// A row with no index gives 0.
//
// Bound (derived below, every step an a-priori factor): sigma_j bounds |s^_j - s_j| (an fp32 FMA
// chain of D terms, times scale), mu_b = max_{j in blocks <= b} sigma_j bounds the running max;
// the probability's argument is then within sigma_j + mu_b (plus one rounding) of s_j - m_b, so
// with expf within 1 ulp (rel 2u) the computed bf16 probability lies in [P_lo, P_hi] (an interval
// through the bf16 rounding); the rescale factors telescope to exp(m^_b - m^_B) up to one rounding
// and one expf per later block (rho_b). Numerator and denominator are compared after removing
// their common factor exp(M - m^_B), so the running max's error enters a weight only through
// exp(m^_b - m_b) (numerator) and the score's own error through exp(s^_j - s_j) (denominator).
// The numerator is a sum of K products with at most K + 2 B roundings; the denominator a sum of
// positive terms, relative error eps_l; then one division and bf16.
// OpCase::tensor_core_bound (the `cuda` backend's): the larger of this bound and the production
// kernel's (scenarios/judge/sparse_attn_mma_bound.h: tensor-core steps, exp2f, its own order);
// with DSV41_CUDA_ATTN_SPLIT=1 (the kernel may split each row's list over CTAs, slices picked by
// the device's SM count) also the split's bound for every slice length 1 .. B - 1.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference/ops/attention.h"
#include "scenarios/exact/exact_internal.h"
#include "scenarios/judge/sparse_attn_mma_bound.h"

namespace dsv41::scenarios::exact {

using reference::Tensor;

OpCase sparse_attn_case(const std::string& inputs, const Tensor<float>& q, const Tensor<float>& kv,
                        const Tensor<float>& sink, const Tensor<int32_t>& idxs, float scale) {
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), K = idxs.dim(1);
  const int64_t B = (K + reference::kSparseAttnBlock - 1) / reference::kSparseAttnBlock;
  const double u = kU32, gD = gamma(D, u);
  const char* split_env = std::getenv("DSV41_CUDA_ATTN_SPLIT");
  const bool split = split_env != nullptr && std::string(split_env) == "1";
  OpCase c;
  c.op = "sparse_attn";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = std::max(D, K);
  c.row = D;
  c.out = kBf16;
  c.precisions = "q, kv bf16, sink fp32; fp32 FMA scores, fp32 online softmax (expf), bf16 probabilities, fp32 P.V";
  c.formula = "E_num / (l (1 - eps_l)) + |o| eps_l / (1 - eps_l) + u32|o| + ulp_bf16/2 (docs/cuda.md)";
  const Exact ex_scale = exact_of(scale);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      // Scores, their bounds, and the running maxima per block.
      std::vector<Exact> s(static_cast<size_t>(K));
      std::vector<double> sigma(static_cast<size_t>(K), 0.0);
      std::vector<Exact> m(static_cast<size_t>(B));
      std::vector<double> mu(static_cast<size_t>(B), 0.0);
      Exact run = exact_of(reference::kSparseAttnInitMax);
      double run_mu = 0.0;
      bool any = false;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t ix = idxs.at(t, j);
        if (ix >= 0) {
          Exact dot = 0, mag = 0;
          for (int64_t dd = 0; dd < D; ++dd) {
            const Exact p = exact_of(q.at(t, h, dd)) * exact_of(kv.at(ix, dd));
            dot += p;
            mag += mp::abs(p);
          }
          s[static_cast<size_t>(j)] = dot * ex_scale;
          const double e_dot = gD * to_double(mag) * static_cast<double>(scale);
          sigma[static_cast<size_t>(j)] = e_dot * (1 + u) + u * (std::fabs(to_double(s[static_cast<size_t>(j)])) + e_dot);
          run = std::max<Exact>(run, s[static_cast<size_t>(j)]);
          run_mu = std::max(run_mu, sigma[static_cast<size_t>(j)]);
          any = true;
        }
        if (j % reference::kSparseAttnBlock == reference::kSparseAttnBlock - 1 || j == K - 1) {
          m[static_cast<size_t>(j / reference::kSparseAttnBlock)] = run;
          mu[static_cast<size_t>(j / reference::kSparseAttnBlock)] = run_mu;
        }
      }
      if (!any) {
        for (int64_t dd = 0; dd < D; ++dd) {
          c.exact.push_back(Exact(0));
          c.bound.push_back(0.0);
          c.tensor_core_bound.push_back(0.0);
        }
        continue;
      }
      const Exact M = m.back();
      const double mu_last = mu.back();
      // Every computed weight is compared after removing the common factor C = exp(M - m^_B)
      // (it cancels in acc / l). rho[b]: the rounding part of the rescale product after block b
      // (its exact part telescopes to exp(m^_b - m^_B)): one fl() of the max difference and one
      // expf per later block.
      std::vector<double> rho(static_cast<size_t>(B), 0.0);
      for (int64_t b = 0; b < B; ++b) {
        double arg = 0.0;
        int later = 0;
        for (int64_t b2 = b + 1; b2 < B; ++b2, ++later) {
          const double dm = to_double(m[static_cast<size_t>(b2)] - m[static_cast<size_t>(b2 - 1)]);
          arg += u * (dm + mu[static_cast<size_t>(b2)] + mu[static_cast<size_t>(b2 - 1)]);
        }
        rho[static_cast<size_t>(b)] = std::exp(arg) * std::pow(1 + 2 * u, later) - 1;
      }
      // Per index: exact weight w_j = p_j exp(m_b - M). The computed one over C is
      // p^_j exp(m^_b - m_b) exp(m_b - M) (1 +- rho_b), p^_j in [P_lo, P_hi] (its argument within
      // sigma_j + mu_b, through fl, expf and bf16) and |m^_b - m_b| <= mu_b: its distance to p_j is
      // at most dev_j = max |P exp(+-mu_b) - p_j| over both ends (p_j (exp(mu_b) - 1) when the
      // interval does not straddle a bf16 boundary: the score error itself then cancels).
      // The denominator's terms over C: exp(s_j - M) exp(s^_j - s_j) (fl, expf) (1 +- rho_b):
      // relative eps_j; the sink's: exp(sink - M) (fl of sink - m^_B, expf).
      std::vector<Exact> w(static_cast<size_t>(K), Exact(0));
      std::vector<double> w_dev(static_cast<size_t>(K), 0.0), w_max(static_cast<size_t>(K), 0.0);
      const Exact ex_sink = exact_of(sink.data()[static_cast<size_t>(h)]);
      Exact l = mp::exp(ex_sink - M);
      double eps_terms = std::exp(u * (std::fabs(to_double(ex_sink - M)) + mu_last)) * (1 + 2 * u) - 1;
      for (int64_t j = 0; j < K; ++j) {
        if (idxs.at(t, j) < 0) continue;
        const size_t b = static_cast<size_t>(j / reference::kSparseAttnBlock);
        const Exact a = s[static_cast<size_t>(j)] - m[b];  // <= 0
        const double spread = sigma[static_cast<size_t>(j)] + mu[b];
        const Exact a_lo = (a - Exact(spread)) * Exact(1 + u);
        const Exact a_hi = std::min<Exact>(Exact(0), a + Exact(spread)) * Exact(1 - u);
        const Exact p = round_to(mp::exp(a), kBf16);
        const Exact p_lo = round_chain(mp::exp(a_lo) * Exact(1 - 2 * u), {kF32, kBf16});
        const Exact p_hi = round_chain(mp::exp(a_hi) * Exact(1 + 2 * u), {kF32, kBf16});
        const Exact up = Exact(std::exp(mu[b])), down = Exact(std::exp(-mu[b]));
        Exact dev = 0;
        for (const Exact& pe : {p_lo, p_hi}) {
          dev = std::max<Exact>(dev, std::max<Exact>(mp::abs(pe * up - p), mp::abs(pe * down - p)));
        }
        const Exact resc = mp::exp(m[b] - M);
        w[static_cast<size_t>(j)] = p * resc;
        const double r = rho[b];
        w_dev[static_cast<size_t>(j)] = to_double(resc * (dev * Exact(1 + r) + p * Exact(r)));
        w_max[static_cast<size_t>(j)] = to_double(resc * (p + dev)) * (1 + r);
        l += mp::exp(s[static_cast<size_t>(j)] - M);
        const double sj = sigma[static_cast<size_t>(j)];
        const double eq = std::exp(sj + u * (std::fabs(to_double(a)) + spread)) * (1 + 2 * u) - 1;
        eps_terms = std::max(eps_terms, (1 + eq) * (1 + r) - 1);
      }
      const double eps_l = (1 + eps_terms) * (1 + gamma(2 * B + 2, u)) * (1 + u + gamma(reference::kSparseAttnBlock, kU64)) - 1;
      const double g_acc = gamma(K + 2 * B, u);
      const double l_d = to_double(l);
      for (int64_t dd = 0; dd < D; ++dd) {
        Exact num = 0;
        double e_num = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          const int32_t ix = idxs.at(t, j);
          if (ix < 0) continue;
          const Exact v = exact_of(kv.at(ix, dd));
          num += w[static_cast<size_t>(j)] * v;
          const double av = std::fabs(to_double(v));
          e_num += av * (w_dev[static_cast<size_t>(j)] + g_acc * w_max[static_cast<size_t>(j)]);
        }
        const Exact o = num / l;
        const double ao = std::fabs(to_double(o));
        const double e_div = e_num / (l_d * (1 - eps_l)) + ao * eps_l / (1 - eps_l);
        c.exact.push_back(o);
        c.bound.push_back(finish_bound(o, e_div + u * (ao + e_div), kBf16));
      }
      // The production kernel's bound (tensor-core steps, exp2f, its order: sparse_attn_mma_bound.h),
      // around its double evaluation of the exact value (2^-40 relative covers the difference); the
      // larger of the two, since the `cuda` backend runs the exact kernels for other head dims or
      // with DSV41_CUDA_PRODUCTION_OPS leaving sparse_attn out.
      std::vector<const float*> rows(static_cast<size_t>(K));
      for (int64_t j = 0; j < K; ++j) rows[static_cast<size_t>(j)] = idxs.at(t, j) < 0 ? nullptr : kv.row(idxs.at(t, j));
      const judge::SparseAttnRowBound tc = judge::sparse_attn_row_bound(
          q.row(t, h), rows, D, sink.data()[static_cast<size_t>(h)], scale, judge::AttnArith::kMma);
      const size_t first = c.bound.size() - static_cast<size_t>(D);
      std::vector<double> widest = tc.bound;
      for (int64_t per = 1; split && per < B; ++per) {
        const judge::SparseAttnRowBound ts = judge::sparse_attn_row_bound(
            q.row(t, h), rows, D, sink.data()[static_cast<size_t>(h)], scale, judge::AttnArith::kMma, per);
        for (size_t k = 0; k < widest.size(); ++k) widest[k] = std::max(widest[k], ts.bound[k]);
      }
      for (int64_t dd = 0; dd < D; ++dd) {
        const size_t i = first + static_cast<size_t>(dd);
        const double mma = widest[static_cast<size_t>(dd)] + 0x1p-40 * std::fabs(tc.exact[static_cast<size_t>(dd)]);
        c.tensor_core_bound.push_back(std::max(c.bound[i], mma));
      }
    }
  }
  c.run = [q, kv, sink, idxs, scale, D](const reference::seam::Ops& ops) {
    const Tensor<uint8_t> none({0, formats::entry_bytes(formats::CacheFormat::kCompressedKvFp4, static_cast<int>(D))},
                               "compressed");
    const Tensor<uint8_t> dev_none = ops.upload(none);
    const reference::CacheRows empty{formats::CacheFormat::kCompressedKvFp4, D, 0, &dev_none};
    return ops.download(ops.sparse_attn(ops.upload(q), ops.upload(kv), empty, ops.upload(sink), ops.upload(idxs), scale))
        .data();
  };
  return c;
}

}  // namespace dsv41::scenarios::exact
