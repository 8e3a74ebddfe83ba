// The exact-rounding helpers and the measurement of scenarios/exact/exact_eval.h (the op cases are in
// scenarios/exact/exact_ops_*.cc).
#include "scenarios/exact/exact_eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace dsv41::scenarios::exact {

double gamma(int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  DSV41_CHECK(nu < 1.0, "gamma_", n, ": n u = ", nu, " >= 1 (no bound)");
  return nu / (1.0 - nu);
}

Exact exact_of(float v) { return Exact(static_cast<double>(v)); }

namespace {

// floor(log2 |v|) for v != 0 (frexp: |v| = m 2^e, m in [1/2, 1)).
int exponent_of(const Exact& v) {
  int e = 0;
  (void)mp::frexp(v, &e);
  return e - 1;
}

// The quantum (ulp) of format f at |v|.
int quantum_exp(const Exact& v, Format f) {
  const int e = v == 0 ? f.emin : std::max(exponent_of(v), f.emin);
  return e - (f.precision - 1);
}

}  // namespace

Exact round_to(const Exact& v, Format f) {
  if (v == 0 || mp::isinf(v) || mp::isnan(v)) return v;
  const int q = quantum_exp(v, f);
  const Exact scaled = mp::ldexp(v, -q);  // exact: a power-of-two scaling
  Exact r = mp::floor(scaled);
  const Exact frac = scaled - r;
  if (frac > Exact(0.5) || (frac == Exact(0.5) && mp::fmod(r, Exact(2)) != 0)) r += 1;
  return mp::ldexp(r, q);
}

Exact ulp_of(const Exact& v, Format f) { return mp::ldexp(Exact(1), quantum_exp(mp::abs(v), f)); }

Exact round_chain(Exact x, const std::vector<Format>& rounds) {
  for (const Format& f : rounds) x = round_to(x, f);
  return x;
}

double finish_bound(const Exact& exact, double acc, Format out) {
  const Exact mag = mp::abs(exact) + Exact(acc);
  return acc + ulp_of(mag, out).convert_to<double>() / 2;
}

double derived_bound(Accumulation acc, int64_t n, double sum_abs, const Exact& exact, Format out) {
  double b = 0.0;
  switch (acc) {
    case Accumulation::kF32Fma: b = gamma(n, kU32) * sum_abs; break;
    case Accumulation::kF64ToF32: {
      const double g = gamma(n, kU64) * sum_abs;
      b = g + kU32 * (std::fabs(exact.convert_to<double>()) + g);
      break;
    }
    case Accumulation::kQuantizedBlocks: b = gamma((n + 31) / 32, kU32) * sum_abs; break;
  }
  return out.precision == kF32.precision ? b : finish_bound(exact, b, out);
}

std::vector<int8_t> topk_membership(const std::vector<double>& lo, const std::vector<double>& hi, int64_t k) {
  const size_t n = lo.size();
  std::vector<int8_t> m(n, 0);
  for (size_t e = 0; e < n; ++e) {
    if (std::isinf(hi[e]) && hi[e] < 0) {
      m[e] = -1;
      continue;
    }
    int64_t above = 0, maybe_above = 0;
    for (size_t o = 0; o < n; ++o) {
      if (o == e) continue;
      if (lo[o] > hi[e]) ++above;
      if (hi[o] >= lo[e]) ++maybe_above;
    }
    m[e] = maybe_above < k ? 1 : above >= k ? -1 : 0;
  }
  return m;
}

Sizes parse_sizes(const std::string& s) {
  if (s == "tiny") return Sizes::kTiny;
  if (s == "small") return Sizes::kSmall;
  DSV41_FAIL("exact: unknown --sizes '", s, "' (known: tiny, small)");
}

std::vector<OpCase> make_cases(Sizes sizes, uint64_t seed) {
  std::vector<OpCase> out;
  add_linear_cases(sizes, seed, out);
  add_norm_rope_cases(sizes, seed, out);
  add_attention_cases(sizes, seed, out);
  add_mhc_cases(sizes, seed, out);
  add_moe_cases(sizes, seed, out);
  add_moe_experts_cases(sizes, seed, out);
  for (const OpCase& c : out) {
    DSV41_CHECK(c.exact.size() == c.bound.size() && !c.exact.empty(), "exact: case ", c.op, " / ", c.inputs,
                ": ", c.exact.size(), " exact values, ", c.bound.size(), " bounds");
  }
  return out;
}

SideError measure(const OpCase& c, const reference::seam::Ops& ops, const std::string& backend) {
  SideError s;
  s.backend = backend;
  s.output = c.run(ops);
  DSV41_CHECK(s.output.size() == c.exact.size(), "exact: ", backend, " ", c.op, " / ", c.inputs, ": ",
              s.output.size(), " outputs, expected ", c.exact.size());
  double sum_ulps = 0.0;
  int64_t counted = 0;
  for (size_t i = 0; i < s.output.size(); ++i) {
    const float o = s.output[i];
    const Exact& e = c.exact[i];
    if (std::isnan(o)) {
      ++s.nonfinite;
      ++s.exceeded;
      continue;
    }
    if (mp::isinf(e) || std::isinf(o)) {  // masked outputs: must be the same infinity
      if (!(mp::isinf(e) && std::isinf(o) && (e < 0) == (o < 0))) ++s.exceeded;
      continue;
    }
    const Exact err = mp::abs(exact_of(o) - e);
    const double abs_err = err.convert_to<double>();
    const double ulps = (err / ulp_of(e, c.out)).convert_to<double>();
    s.max_abs = std::max(s.max_abs, abs_err);
    s.max_ulps = std::max(s.max_ulps, ulps);
    if (e != 0) s.max_rel = std::max(s.max_rel, (err / mp::abs(e)).convert_to<double>());
    if (c.bound[i] > 0) s.used = std::max(s.used, abs_err / c.bound[i]);
    if (err > Exact(c.bound[i])) ++s.exceeded;
    sum_ulps += ulps;
    ++counted;
  }
  s.mean_ulps = counted ? sum_ulps / static_cast<double>(counted) : 0.0;
  return s;
}

BoundStats bound_stats(const OpCase& c) {
  std::vector<double> ratio;
  int64_t tight = 0;
  const size_t row = static_cast<size_t>(std::max<int64_t>(c.row, 1));
  for (size_t first = 0; first < c.exact.size(); first += row) {
    const size_t end = std::min(first + row, c.exact.size());
    Exact row_max = 0;
    for (size_t i = first; i < end; ++i) {
      if (!mp::isinf(c.exact[i])) row_max = std::max<Exact>(row_max, mp::abs(c.exact[i]));
    }
    for (size_t i = first; i < end; ++i) {
      if (mp::isinf(c.exact[i])) continue;
      ratio.push_back((Exact(c.bound[i]) / ulp_of(c.exact[i], c.out)).convert_to<double>());
      if (Exact(c.bound[i]) <= Exact(1.5) * ulp_of(row_max, kBf16)) ++tight;
    }
  }
  BoundStats b;
  if (ratio.empty() || !c.bounded || c.flags) return b;
  std::sort(ratio.begin(), ratio.end());
  b.median_ulps = ratio[ratio.size() / 2];
  b.max_ulps = ratio.back();
  b.tight_fraction = static_cast<double>(tight) / static_cast<double>(ratio.size());
  b.vacuous = !c.adversarial && b.tight_fraction < 0.9;
  return b;
}

OpCase with_tensor_core_bound(const OpCase& c) {
  OpCase t = c;
  if (c.tensor_core_bound.empty()) return t;
  t.bound = c.tensor_core_bound;
  t.formula = c.op.rfind("linear", 0) == 0
                  ? "fp8 tensor cores: sum_b s_b delta_b + gamma_{in/32}(u32) sum_b s_b(|p_b| + delta_b) + ulp_bf16/2 "
                    "(delta_b: scenarios/judge/fp8_mma_bound.h)"
              : c.op == "sparse_attn"
                  ? "max(" + c.formula + ", the bf16 tensor-core kernel's: scenarios/judge/sparse_attn_mma_bound.h)"
                  : c.formula + "; the F8 linears' radii + their fp8 tensor-core terms (scenarios/judge/fp8_mma_bound.h)";
  return t;
}

Closer closer(const OpCase& c, const SideError& a, const SideError& b) {
  Closer r;
  bool identical = a.output.size() == b.output.size();
  for (size_t i = 0; identical && i < a.output.size(); ++i) {
    identical = std::memcmp(&a.output[i], &b.output[i], sizeof(float)) == 0;
  }
  if (identical) {
    r.verdict = "equal";
    return r;
  }
  for (size_t i = 0; i < c.exact.size(); ++i) {
    if (mp::isinf(c.exact[i]) || std::isnan(a.output[i]) || std::isnan(b.output[i])) continue;
    const Exact ea = mp::abs(exact_of(a.output[i]) - c.exact[i]);
    const Exact eb = mp::abs(exact_of(b.output[i]) - c.exact[i]);
    if (ea < eb) ++r.a_closer;
    if (eb < ea) ++r.b_closer;
  }
  r.verdict = a.mean_ulps < b.mean_ulps ? a.backend : b.mean_ulps < a.mean_ulps ? b.backend : "tie";
  return r;
}

}  // namespace dsv41::scenarios::exact
