// scenarios/judge/invariants.cc: structural invariants (invariants.h).
#include "scenarios/judge/invariants.h"

#include <cmath>
#include <algorithm>
#include <sstream>

#include "base/error.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::judge {
namespace {

constexpr double kU32 = 0x1p-24;  // the unit roundoff of fp32

double gamma(int n) { return n * kU32 / (1.0 - n * kU32); }

// The column sums of one token's comb, in double (fp32 values, one rounding per add).
std::vector<double> column_sums(const float* comb, int hc, bool* finite) {
  std::vector<double> s(static_cast<size_t>(hc), 0.0);
  *finite = true;
  for (int i = 0; i < hc; ++i) {
    for (int j = 0; j < hc; ++j) {
      const float v = comb[i * hc + j];
      *finite = *finite && std::isfinite(v);
      s[static_cast<size_t>(j)] += v;
    }
  }
  return s;
}

}  // namespace

CombColsum comb_colsum(const std::vector<float>& ref, const std::vector<float>& port, int hc, double hc_eps,
                       const std::string& what) {
  DSV41_CHECK(hc >= 1, what, ": comb column sums need hc >= 1, got ", hc);
  const size_t n = static_cast<size_t>(hc) * static_cast<size_t>(hc);
  DSV41_CHECK(ref.size() == port.size() && ref.size() % n == 0, what, ": comb column sums need two [T, ", n,
              "] tensors, got ", ref.size(), " and ", port.size(), " values");
  const double g = gamma(hc + 3);
  const double checked_limit = 4.0 * hc_eps + g;  // 1 - c_r at most this: the column is checked
  CombColsum out;
  for (size_t t = 0; t * n < ref.size(); ++t) {
    bool fr = false, fp = false;
    const std::vector<double> cr = column_sums(ref.data() + t * n, hc, &fr);
    const std::vector<double> cp = column_sums(port.data() + t * n, hc, &fp);
    for (int j = 0; j < hc; ++j) {
      const double r = cr[static_cast<size_t>(j)], p = cp[static_cast<size_t>(j)];
      if (!fr || !fp || 1.0 - r > checked_limit) {
        ++out.skipped;
        continue;
      }
      ++out.checked;
      const double dev = std::fabs(p - r);
      if (dev > out.max_dev || out.worst_token < 0) {
        out.max_dev = std::max(out.max_dev, dev);
        out.worst_token = static_cast<int64_t>(t);
        out.worst_column = j;
        out.worst_ref = r;
        out.worst_port = p;
      }
    }
  }
  return out;
}

reports::Tolerance comb_colsum_tolerance(int hc, double hc_eps) {
  const double bound = 8.0 * hc_eps + 6.0 * gamma(hc + 3);
  std::ostringstream note;
  note << "analytic (scenarios/judge/invariants.h): the Sinkhorn's last step normalises the columns, so each column of "
          "comb sums to S/(S + eps) up to gamma_{hc+3}(u32) on any correct port; port and reference differ by at most "
          "8 eps + 6 gamma_{hc+3} = "
       << bound << " (eps = hc_eps = " << hc_eps << ", hc = " << hc
       << "; checked where the reference's column mass is not tiny; assumes the port's column mass is at least half the "
          "reference's)";
  return make_tolerance(bound, false, "analytic", note.str());
}

std::string describe(const CombColsum& c) {
  std::ostringstream o;
  o.precision(9);
  if (c.worst_token < 0) {
    o << "no column checked (" << c.skipped << " skipped: a tiny column mass or a non-finite value)";
    return o.str();
  }
  o << "worst column sum: token row " << c.worst_token << ", column " << c.worst_column << ": reference " << c.worst_ref
    << ", port " << c.worst_port << " (|d| = " << c.max_dev << "); " << c.checked << " columns checked, " << c.skipped
    << " skipped";
  return o.str();
}

std::vector<DirectionalFit> fit_directions(const std::vector<float>& a, const std::vector<float>& b,
                                           const std::vector<const std::vector<float>*>& h, int64_t row,
                                           const std::string& what) {
  for (const std::vector<float>* x : h) {
    DSV41_CHECK(x != nullptr && a.size() == b.size() && a.size() == x->size(), what,
                ": a directional fit needs tensors of one size, got ", a.size(), ", ", b.size(), " and ",
                x ? x->size() : 0, " values");
  }
  DSV41_CHECK(row >= 1 && a.size() % static_cast<size_t>(row) == 0, what, ": ", a.size(), " values in rows of ", row);
  std::vector<DirectionalFit> out(h.size());
  if (h.empty()) return out;
  // Regressors d_1 .. d_m, each row's gain direction (a restricted to the row) projected out of
  // them and of e first (Frisch-Waugh: the same betas and residuals as a fit with one gain
  // regressor per row). Rows with a non-finite value or no d != 0 are left out.
  const size_t m = h.size();
  std::vector<double> xs, es;
  std::vector<int64_t> cluster;
  const size_t rows_total = a.size() / static_cast<size_t>(row);
  for (size_t g0 = 0; g0 < rows_total; ++g0) {
    const size_t lo = g0 * static_cast<size_t>(row), hi = lo + static_cast<size_t>(row);
    bool finite = true, any = false;
    double aa = 0.0, ae = 0.0;
    std::vector<double> ad(m, 0.0);
    for (size_t i = lo; i < hi; ++i) {
      finite = finite && std::isfinite(a[i]) && std::isfinite(b[i]);
      for (const std::vector<float>* x : h) finite = finite && std::isfinite((*x)[i]);
      if (!finite) break;
      for (const std::vector<float>* x : h) any = any || (*x)[i] != a[i];
      aa += double(a[i]) * a[i];
      ae += double(a[i]) * (double(b[i]) - a[i]);
      for (size_t k = 0; k < m; ++k) ad[k] += double(a[i]) * (double((*h[k])[i]) - a[i]);
    }
    if (!finite || !any) continue;
    const double ge = aa > 0 ? ae / aa : 0.0;
    for (size_t i = lo; i < hi; ++i) {
      for (size_t k = 0; k < m; ++k) xs.push_back(double((*h[k])[i]) - a[i] - (aa > 0 ? ad[k] / aa : 0.0) * a[i]);
      es.push_back(double(b[i]) - a[i] - ge * a[i]);
      cluster.push_back(static_cast<int64_t>(g0));
    }
  }
  const size_t n = es.size();
  const int64_t groups = static_cast<int64_t>(n / static_cast<size_t>(row));
  if (n < static_cast<size_t>(kRowGainMinLength) || groups < kFitMinRows) return out;
  std::vector<double> xtx(m * m, 0.0), xte(m, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < m; ++k) {
      xte[k] += xs[i * m + k] * es[i];
      for (size_t l = 0; l < m; ++l) xtx[k * m + l] += xs[i * m + k] * xs[i * m + l];
    }
  }
  // Keep the regressors that are not zero nor a combination of the kept ones (the pivots of an
  // incremental Cholesky factorisation of X^T X).
  std::vector<size_t> keep;
  for (size_t k = 0; k < m; ++k) {
    if (!(xtx[k * m + k] > 0.0)) continue;
    std::vector<size_t> trial = keep;
    trial.push_back(k);
    const size_t q = trial.size();
    std::vector<double> g(q * q);
    for (size_t r = 0; r < q; ++r) {
      for (size_t c = 0; c < q; ++c) g[r * q + c] = xtx[trial[r] * m + trial[c]];
    }
    bool ok = true;
    for (size_t c = 0; c < q && ok; ++c) {
      double piv = g[c * q + c];
      for (size_t t = 0; t < c; ++t) piv -= g[c * q + t] * g[c * q + t];
      ok = piv > 1e-12 * xtx[trial[c] * m + trial[c]];
      if (!ok) break;
      g[c * q + c] = std::sqrt(piv);
      for (size_t r = c + 1; r < q; ++r) {
        double v = g[r * q + c];
        for (size_t t = 0; t < c; ++t) v -= g[r * q + t] * g[c * q + t];
        g[r * q + c] = v / g[c * q + c];
      }
    }
    if (ok) keep.push_back(k);
  }
  const size_t q = keep.size();
  if (q == 0) return out;
  // (X^T X)^-1 of the kept regressors by Gauss-Jordan with partial pivoting (q <= a few).
  std::vector<double> g(q * q), inv(q * q, 0.0);
  for (size_t r = 0; r < q; ++r) {
    inv[r * q + r] = 1.0;
    for (size_t c = 0; c < q; ++c) g[r * q + c] = xtx[keep[r] * m + keep[c]];
  }
  for (size_t c = 0; c < q; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < q; ++r) {
      if (std::fabs(g[r * q + c]) > std::fabs(g[p * q + c])) p = r;
    }
    for (size_t t = 0; t < q; ++t) {
      std::swap(g[c * q + t], g[p * q + t]);
      std::swap(inv[c * q + t], inv[p * q + t]);
    }
    const double piv = g[c * q + c];
    for (size_t t = 0; t < q; ++t) {
      g[c * q + t] /= piv;
      inv[c * q + t] /= piv;
    }
    for (size_t r = 0; r < q; ++r) {
      if (r == c) continue;
      const double f = g[r * q + c];
      for (size_t t = 0; t < q; ++t) {
        g[r * q + t] -= f * g[c * q + t];
        inv[r * q + t] -= f * inv[c * q + t];
      }
    }
  }
  std::vector<double> beta(q, 0.0);
  for (size_t r = 0; r < q; ++r) {
    for (size_t c = 0; c < q; ++c) beta[r] += inv[r * q + c] * xte[keep[c]];
  }
  // Cluster-robust meat: sum over rows of u_g u_g^T, u_g = sum_{i in g} r_i x_i.
  std::vector<double> meat(q * q, 0.0), u(q, 0.0);
  const auto flush = [&] {
    for (size_t k = 0; k < q; ++k) {
      for (size_t l = 0; l < q; ++l) meat[k * q + l] += u[k] * u[l];
    }
    std::fill(u.begin(), u.end(), 0.0);
  };
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && cluster[i] != cluster[i - 1]) flush();
    double r = es[i];
    for (size_t k = 0; k < q; ++k) r -= beta[k] * xs[i * m + keep[k]];
    for (size_t k = 0; k < q; ++k) u[k] += r * xs[i * m + keep[k]];
  }
  flush();
  // Small-sample correction, the per-row gains counted as parameters: G/(G-1) (n-1)/(n-G-q).
  const double correction = static_cast<double>(groups) / static_cast<double>(groups - 1) *
                            static_cast<double>(n - 1) / std::max(1.0, static_cast<double>(n) - groups - q);
  for (size_t k = 0; k < q; ++k) {
    double var = 0.0;  // (inv meat inv)_kk
    for (size_t s1 = 0; s1 < q; ++s1) {
      for (size_t s2 = 0; s2 < q; ++s2) var += inv[k * q + s1] * meat[s1 * q + s2] * inv[s2 * q + k];
    }
    DirectionalFit& f = out[keep[k]];
    f.n = static_cast<int64_t>(n);
    f.rows = groups;
    f.beta = beta[k];
    f.se = std::sqrt(std::max(0.0, var * correction));
    f.lower = std::max(0.0, std::fabs(f.beta) - kRowGainSigmas * f.se);
  }
  return out;
}

}  // namespace dsv41::scenarios::judge
