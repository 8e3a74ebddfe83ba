#include "scenarios/judge/sparse_attn_mma_bound.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dsv41::scenarios::judge {
namespace {

constexpr double kU = 0x1p-24;
constexpr double kU64 = 0x1p-53;
constexpr int64_t kBlock = 64;            // reference::kSparseAttnBlock
constexpr double kInitMax = -1e30f;       // reference::kSparseAttnInitMax (as fp32)

double gamma(int64_t n, double u) { return static_cast<double>(n) * u / (1.0 - static_cast<double>(n) * u); }

double half_ulp_bf16(double v) {
  if (v < 0x1p-126) return 0x1p-133 / 2;
  return std::ldexp(1.0, std::ilogb(v) - 7) / 2;
}

// x (>= 0, finite) rounded to the nearest bf16 value, ties to even.
double bf16_round(double x) {
  if (x == 0) return 0;
  const int e = std::max(std::ilogb(x), -126);
  const double q = std::ldexp(1.0, e - 7);
  return std::nearbyint(x / q) * q;
}
double f32_round(double x) { return static_cast<double>(static_cast<float>(x)); }

// The kernels' dot of q and one row, each tensor-core step of 16 channels from a zero accumulator:
// cuda/attention_wgmma.cu runs one chain of D/16 steps in channel order; cuda/attention_mma.cu one
// chain of D/32 steps per channel half, then one add. Returns the larger of the two bounds on
// |dot^ - dot|; dot, mag exact (double).
double mma_dot_error(const float* q, const float* k, int64_t D, double& dot, double& mag) {
  const int64_t half = D / 2;
  double err[2] = {0, 0}, sum[2] = {0, 0}, one_err = 0, one_sum = 0;
  mag = 0;
  for (int h = 0; h < 2; ++h) {
    const int64_t lo = h * half, hi = h == 0 ? half : D;
    for (int64_t k0 = lo; k0 < hi; k0 += kSparseAttnMmaStep) {
      double step = 0, prod = 0;
      for (int64_t d = k0; d < std::min(hi, k0 + kSparseAttnMmaStep); ++d) {
        const double p = static_cast<double>(q[d]) * static_cast<double>(k[d]);  // exact: 16-bit significands
        step += p;
        prod += std::fabs(p);
      }
      err[h] += bf16_mma_step_error(std::fabs(sum[h]) + err[h], prod);
      sum[h] += step;
      mag += prod;
    }
  }
  for (int64_t k0 = 0; k0 < D; k0 += kSparseAttnMmaStep) {  // the single chain (steps over the halves' boundary too)
    double step = 0, prod = 0;
    for (int64_t d = k0; d < std::min(D, k0 + kSparseAttnMmaStep); ++d) {
      const double p = static_cast<double>(q[d]) * static_cast<double>(k[d]);
      step += p;
      prod += std::fabs(p);
    }
    one_err += bf16_mma_step_error(std::fabs(one_sum) + one_err, prod);
    one_sum += step;
  }
  dot = sum[0] + sum[1];
  const double split = err[0] + err[1] + kU * (std::fabs(dot) + err[0] + err[1]);
  return std::max(split, one_err);
}

}  // namespace

SparseAttnRowBound sparse_attn_row_bound(const float* q, const std::vector<const float*>& rows, int64_t D, float sink,
                                         float scale, AttnArith arith, int64_t slice_blocks) {
  const bool mma = arith == AttnArith::kMma;
  const int64_t K = static_cast<int64_t>(rows.size()), B = (K + kBlock - 1) / kBlock;
  // The split: slices of `per` blocks (one slice: the unsplit kernel), S of them.
  const int64_t per = mma && slice_blocks > 0 && slice_blocks < B ? slice_blocks : std::max<int64_t>(B, 1);
  const int64_t S = (B + per - 1) / per;
  const bool split = S > 1;
  const double u = kU, sc = static_cast<double>(scale);
  // expf / exp2f relative error (1 ulp glibc, 2 ulp CUDA exp2f), plus the double evaluation's
  const double e_exp = (mma ? 4 * u : 2 * u) + 8 * kU64;
  SparseAttnRowBound out;
  out.exact.assign(static_cast<size_t>(D), 0.0);
  out.bound.assign(static_cast<size_t>(D), 0.0);
  // Scores, their bounds sigma_j, the running maxima m_b and their bounds mu_b.
  std::vector<double> s(static_cast<size_t>(K), -std::numeric_limits<double>::infinity());
  // m: the kernel's running max (of its slice), m_spec the spec's (of the whole list: the same unsplit)
  std::vector<double> sigma(static_cast<size_t>(K), 0.0), m(static_cast<size_t>(B)), mu(static_cast<size_t>(B)),
      m_spec(static_cast<size_t>(B));
  double run = kInitMax, run_mu = 0, run_spec = kInitMax;
  bool any = false;
  for (int64_t j = 0; j < K; ++j) {
    if (j % (per * kBlock) == 0) {  // a slice's first index: its running max starts over
      run = kInitMax;
      run_mu = 0;
    }
    if (rows[static_cast<size_t>(j)] != nullptr) {
      const float* k = rows[static_cast<size_t>(j)];
      double dot = 0, mag = 0, sj = 0, sg = 0;
      if (mma) {
        const double e_dot = mma_dot_error(q, k, D, dot, mag);
        sj = dot * sc;
        const double r2 = (1 + u) * (1 + u);
        sg = sc * e_dot * r2 + std::fabs(sj) * (r2 - 1);
      } else {
        for (int64_t d = 0; d < D; ++d) {
          const double p = static_cast<double>(q[d]) * static_cast<double>(k[d]);
          dot += p;
          mag += std::fabs(p);
        }
        sj = dot * sc;
        const double e_dot = gamma(D, u) * mag * sc;
        sg = e_dot * (1 + u) + u * (std::fabs(sj) + e_dot);
      }
      s[static_cast<size_t>(j)] = sj;
      sigma[static_cast<size_t>(j)] = sg;
      run = std::max(run, sj);
      run_spec = std::max(run_spec, sj);
      run_mu = std::max(run_mu, sg);
      out.max_score_error = std::max(out.max_score_error, sg);
      any = true;
    }
    if (j % kBlock == kBlock - 1 || j == K - 1) {
      m[static_cast<size_t>(j / kBlock)] = run;
      m_spec[static_cast<size_t>(j / kBlock)] = run_spec;
      mu[static_cast<size_t>(j / kBlock)] = run_mu;
    }
  }
  if (!any) return out;  // the output is exactly 0 on both sides
  // M: the largest slice max (unsplit: the last running max), mu_last its bound.
  const double M = *std::max_element(m.begin(), m.end()), mu_last = *std::max_element(mu.begin(), mu.end());
  // rho_b: the roundings of the rescale product after block b (argument, exp, and for the kernel
  // the fl(O * r) multiply), its exact part telescoping to exp(m^_b - m^_e) (e: the last block of
  // b's slice), and with a split the combine's factor fl(O_s * exp2f(fl(m^_e - M^))) (one more
  // argument, exp and multiply), telescoping to exp(m^_b - M^).
  std::vector<double> rho(static_cast<size_t>(B), 0.0);
  const double per_block = mma ? (1 + e_exp) * (1 + u) : (1 + e_exp);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t e = std::min(B, (b / per + 1) * per) - 1;
    double arg = 0;
    int later = 0;
    for (int64_t b2 = b + 1; b2 <= e; ++b2, ++later) {
      const double dm = m[static_cast<size_t>(b2)] - m[static_cast<size_t>(b2 - 1)];
      arg += u * (dm + mu[static_cast<size_t>(b2)] + mu[static_cast<size_t>(b2 - 1)]);
    }
    if (split) {
      arg += u * (M - m[static_cast<size_t>(e)] + mu[static_cast<size_t>(e)] + mu_last);
      ++later;
    }
    rho[static_cast<size_t>(b)] = std::exp(arg) * std::pow(per_block, later) - 1;
  }
  // Weights over the common factor C = exp(M - m^_B): exact w_j = p_j exp(m_b - M) (the spec's
  // running max m_b); the computed one within w_dev_j (the probability's interval through bf16,
  // exp(+-mu_b), rho_b) of the kernel's ideal bf16(exp(s_j - mk_b)) exp(mk_b - M) (mk_b its slice's
  // running max), which with a split differs from w_j by the other place of the bf16 rounding.
  std::vector<double> w(static_cast<size_t>(K), 0.0), w_dev(static_cast<size_t>(K), 0.0),
      w_max(static_cast<size_t>(K), 0.0);
  double l = std::exp(static_cast<double>(sink) - M);
  const double sink_arg = mma ? std::fabs(static_cast<double>(sink)) * ((1 + u) * (1 + u) - 1) : 0.0;
  double eps_terms = std::exp(sink_arg + u * (std::fabs(static_cast<double>(sink) - M) + mu_last)) * (1 + e_exp) - 1;
  for (int64_t j = 0; j < K; ++j) {
    if (rows[static_cast<size_t>(j)] == nullptr) continue;
    const size_t b = static_cast<size_t>(j / kBlock);
    const double a = s[static_cast<size_t>(j)] - m[b];  // <= 0
    const double spread = sigma[static_cast<size_t>(j)] + mu[b];
    const double a_lo = (a - spread) * (1 + u), a_hi = std::min(0.0, a + spread) * (1 - u);
    const double p = bf16_round(std::exp(a));
    const double p_lo = bf16_round(f32_round(std::exp(a_lo) * (1 - e_exp)));
    const double p_hi = bf16_round(f32_round(std::exp(a_hi) * (1 + e_exp)));
    const double up = std::exp(mu[b]), down = std::exp(-mu[b]);
    double dev = 0;
    for (const double pe : {p_lo, p_hi}) dev = std::max({dev, std::fabs(pe * up - p), std::fabs(pe * down - p)});
    const double resc = std::exp(m[b] - M), r = rho[b];
    w[static_cast<size_t>(j)] = bf16_round(std::exp(s[static_cast<size_t>(j)] - m_spec[b])) * std::exp(m_spec[b] - M);
    w_dev[static_cast<size_t>(j)] = resc * (dev * (1 + r) + p * r) + std::fabs(p * resc - w[static_cast<size_t>(j)]);
    w_max[static_cast<size_t>(j)] = resc * (p + dev) * (1 + r);
    l += std::exp(s[static_cast<size_t>(j)] - M);
    const double eq = std::exp(sigma[static_cast<size_t>(j)] + u * (std::fabs(a) + spread)) * (1 + e_exp) - 1;
    eps_terms = std::max(eps_terms, (1 + eq) * (1 + r) - 1);
  }
  // (a split: per slice one multiply by its factor and one add more)
  const double eps_l = mma ? (1 + eps_terms) * (1 + gamma(2 * B + 16 + (split ? 2 * S : 0), u)) - 1
                           : (1 + eps_terms) * (1 + gamma(2 * B + 2, u)) * (1 + u + gamma(kBlock, kU64)) - 1;
  const double g_acc = gamma(K + 2 * B, u);
  const double out_round = mma ? (1 + u) * (1 + u) - 1 : u;
  for (int64_t d = 0; d < D; ++d) {
    double num = 0, e_num = 0;
    if (mma) {  // the kernel's steps of 16 indices, the accumulator the running O of the slice
      double e_mma = 0, devsum = 0, part = 0, part_mag = 0;
      for (int64_t j0 = 0; j0 < B * kBlock; j0 += kSparseAttnMmaStep) {
        if (j0 % (per * kBlock) == 0 && j0 > 0) {  // the next slice: a new accumulator
          e_num += devsum + e_mma;
          part_mag += std::fabs(part) + devsum + e_mma;
          num += part;
          part = devsum = e_mma = 0;
        }
        double prod = 0, step = 0, stepdev = 0;
        for (int64_t j = j0; j < std::min(K, j0 + kSparseAttnMmaStep); ++j) {
          const float* row = rows[static_cast<size_t>(j)];
          if (row == nullptr) continue;
          const double v = static_cast<double>(row[d]), av = std::fabs(v);
          step += w[static_cast<size_t>(j)] * v;
          prod += av * w_max[static_cast<size_t>(j)];
          stepdev += av * w_dev[static_cast<size_t>(j)];
        }
        const double mk = std::fabs(part) + devsum + e_mma + prod;
        if (mk > 0) e_mma += bf16_mma_step_error(std::fabs(part) + devsum + e_mma, prod) * (1 + rho[static_cast<size_t>(j0 / kBlock)]);
        part += step;
        devsum += stepdev;
      }
      e_num += devsum + e_mma;
      part_mag += std::fabs(part) + devsum + e_mma;
      num += part;
      if (split) e_num += gamma(S, u) * part_mag;  // the combine's S - 1 adds of the rescaled partials
    } else {
      for (int64_t j = 0; j < K; ++j) {
        const float* row = rows[static_cast<size_t>(j)];
        if (row == nullptr) continue;
        const double v = static_cast<double>(row[d]), av = std::fabs(v);
        num += w[static_cast<size_t>(j)] * v;
        e_num += av * (w_dev[static_cast<size_t>(j)] + g_acc * w_max[static_cast<size_t>(j)]);
      }
    }
    const double o = num / l, ao = std::fabs(o);
    const double e_div = e_num / (l * (1 - eps_l)) + ao * eps_l / (1 - eps_l);
    const double e_out = e_div + out_round * (ao + e_div);
    out.exact[static_cast<size_t>(d)] = o;
    out.bound[static_cast<size_t>(d)] = e_out + half_ulp_bf16(ao + e_out);
  }
  return out;
}

}  // namespace dsv41::scenarios::judge
