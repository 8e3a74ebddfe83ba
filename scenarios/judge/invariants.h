// scenarios/judge/invariants.h
//
// STRUCTURAL INVARIANTS: properties of a component's output that hold for every correct
// implementation whatever order it sums in, so they stay sharp where a worst-case bound on the
// values cannot (docs/conform.md "Invariants"). Each is checked against the reference's own output
// of the same step and given the tolerance its derivation writes out (origin "analytic").
//
// THE mHC COMB'S COLUMN SUMS (hc_attn_comb, hc_ffn_comb: [T, hc*hc] fp32, row-major [i][j]).
// hc_split_sinkhorn's last step is a column normalisation, comb[i][j] = x_ij / (S_j + eps) with
// S_j = sum_i x_ij (docs/mhc.md "Sinkhorn"), so every column of every token sums to
//   c_j = S_j / (S_j + eps) (1 + theta),   |theta| <= gamma_{hc+2}(u32)
// (hc - 1 additions in S_j, the add of eps, one division per entry; the check sums the fp32 values
// in double, one more rounding: gamma_{hc+3}). Both sides obey it; they differ only through S_j and
// rounding:  1 - c = eps / (S + eps) - theta S / (S + eps).
// A column is CHECKED where the reference's 1 - c_r <= 4 eps + gamma, so eps / (S_r + eps) <=
// 4 eps + 2 gamma; under the assumption that the port's column mass S_p is at least half the
// reference's (its inputs differ by rounding noise; the comb's own derived bound is far below 1/2),
// eps / (S_p + eps) <= 8 eps + 4 gamma, and
//   |c_p - c_r| <= 8 eps + 6 gamma_{hc+3}                          (the tolerance)
// (columns with a tiny mass, S_r below about 0.2, are skipped and counted). Order variance cannot
// move a column sum; a comb row scaled by 1 + d moves the columns by d comb[i][j], a comb kept in
// bf16 by up to 2^-9. (A converged comb is doubly stochastic: its transpose or one more row step
// keep the sums; the hypotheses of scenarios/conform/conform_hypotheses.h look further.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reports/report.h"

namespace dsv41::scenarios::judge {

inline constexpr const char* kCombColsumMetric = "comb_colsum";

struct CombColsum {
  double max_dev = 0.0;  // max over checked (token, column) of |c_port - c_ref|
  int64_t checked = 0;   // (token, column) pairs checked
  int64_t skipped = 0;   // pairs whose reference column mass is too small (see above)
  int64_t worst_token = -1, worst_column = -1;
  double worst_ref = 0.0, worst_port = 0.0;  // the column sums at the worst pair
};

// ref, port: [T, hc*hc] fp32 combs (same size, a multiple of hc*hc); pairs with a non-finite value
// are skipped (the mask rows judge them). A dsv41::Error naming `what` for a size mismatch.
CombColsum comb_colsum(const std::vector<float>& ref, const std::vector<float>& port, int hc, double hc_eps,
                       const std::string& what);
// The tolerance above: 8 eps + 6 gamma_{hc+3}(u32), origin "analytic".
reports::Tolerance comb_colsum_tolerance(int hc, double hc_eps);
// One line for a failure's detail: the worst (token, column), both sums, the counts.
std::string describe(const CombColsum& c);

// DIRECTIONAL FIT: how much of a port's error e = b - a lies along hypotheses' directions
// d_k = h_k - a, where h_k is the reference's own output with one named parameter moved by one step
// (the softmax scale x 1.01, the queries' RoPE one position on: docs/conform.md "Hypotheses").
// The directions are fitted JOINTLY (least squares of e on [a, d_1 .. d_m]), so a bug of one family
// is not reported as another whose direction overlaps it, and a gain error (the direction a itself,
// judged by row_gain with its own bound: a normaliser's legitimate fp32 gain) is not reported as a
// hypothesis either. Standard errors are CLUSTER-robust, one cluster per row (the last dimension:
// a token's values share the few internal roundings they come from, so they are not independent):
//   beta = (X^T X)^-1 X^T e,  r = e - X beta,  u_g = sum_{i in row g} r_i x_i
//   cov = G/(G-1) (X^T X)^-1 (sum_g u_g u_g^T) (X^T X)^-1,   lower_k = max(0, |beta_k| - 6 sqrt(cov_kk))
// over the finite elements where some d_k != 0, in at least kFitMinRows rows (G of them) with at
// least kRowGainMinLength elements in all (else every fit is n = 0, lower = 0: a decode step's one
// row is not fitted). An order difference's error is rounding noise, independent of any
// parameter's sensitivity, so its lower bounds are 0 up to a 6-sigma event; a port whose parameter
// is off by a fraction f of a step fits beta ~ f. A direction that is zero, or a combination of the
// others, gets n = 0.
inline constexpr int64_t kFitMinRows = 8;
struct DirectionalFit {
  double beta = 0.0, se = 0.0, lower = 0.0;
  int64_t n = 0;     // elements fitted
  int64_t rows = 0;  // clusters
};
// a, b, h[k]: [rows, row] values of one size.
std::vector<DirectionalFit> fit_directions(const std::vector<float>& a, const std::vector<float>& b,
                                           const std::vector<const std::vector<float>*>& h, int64_t row,
                                           const std::string& what);

}  // namespace dsv41::scenarios::judge
