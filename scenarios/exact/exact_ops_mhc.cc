// hc_mixes of the exact evaluation (scenarios/exact/exact_eval.h): the mHC mixes, their sigmoid split
// and the Sinkhorn normalisation of comb (reference/ops/mhc.h), evaluated exactly.
//
// Semantics per token: R = 1 / sqrt(sum x^2 / W + eps32), m_k = (x . fn_k) R (W = hc dim);
// pre_i = sigmoid(m_i s0 + b_i) + e, post_i = 2 sigmoid(m_{hc+i} s1 + b_{hc+i}); comb = the
// Sinkhorn iterations of exp(c - rowmax c), c_ij = m_{2hc+i hc+j} s2 + b_{2hc+i hc+j}, with the
// same eps and iteration count, all exact (e = (float)hc_eps, eps32 = (float)norm_eps).
//
// Bound of pre and post (fp32 outputs, no final rounding): the mix error
// dm = R [|e_d| (1 + b_r)(1 + u) + |d| ((1 + b_r)(1 + u) - 1)], e_d = gamma_W(u64) S + u (|d| + gamma_W(u64) S)
// (the double dot rounded to fp32, b_r the rsqrt bound of rms_norm with n = W); the sigmoid's
// argument z = fl(fl(m s) + b): dz = (|s| dm + u |m s|)(1 + u) + u (|z| + |s| dm + u |m s|);
// sigmoid is 1/4-Lipschitz and its evaluation (exp within 1 ulp, 1 +, 1 /) adds 4u sigma:
// pre: dz / 4 + 4u sigma + u (sigma + e); post: 2 (dz / 4 + 4u sigma).
// comb: no a-priori bound is derived here (a first-order bound through 2 x iters normalisations
// doubles per step, 2^40 at 20 iterations: vacuous); its error is measured and compared only.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/mhc.h"
#include "scenarios/exact/exact_internal.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::Tensor;

Exact sigmoid(const Exact& z) { return 1 / (1 + mp::exp(-z)); }

std::vector<OpCase> hc_cases(const std::string& inputs, const Tensor<float>& stream,
                             const std::shared_ptr<const reference::HcWeights>& wp, const reference::ModelConfig& cfg) {
  const reference::HcWeights& w = *wp;
  const int64_t T = stream.dim(0), hc = stream.dim(1), W = hc * stream.dim(2), n_mix = reference::hc_mix_count(hc);
  const double u = kU32;
  const double g = gamma(W + 1, u);
  const double b_r = (1.0 + u) / ((1.0 - u) * std::sqrt(1.0 - g)) - 1.0;
  const Exact e = exact_of(static_cast<float>(cfg.hc_eps));
  const Exact eps32 = exact_of(static_cast<float>(cfg.norm_eps));
  const float* s = w.scale.data().data();
  const float* base = w.base.data().data();
  OpCase split, comb;
  split.op = "hc_mixes (pre, post)";
  comb.op = "hc_mixes (comb)";
  for (OpCase* c : {&split, &comb}) {
    c->inputs = inputs;
    c->reduction = W;
    c->out = kF32;
    c->precisions = "stream bf16, fn/base/scale fp32; rsqrt fp32 (torch sum), double dot -> fp32, torch sigmoid, expf, fp32 Sinkhorn";
  }
  split.row = hc;
  comb.row = hc;
  comb.bounded = false;
  split.formula = "pre: dz/4 + 4u32 sig + u32(sig + e); post: 2(dz/4 + 4u32 sig); dz from dm (docs/cuda.md)";
  comb.formula = "none derived (measured only)";
  std::vector<Exact> pre_post;  // [T][pre hc | post hc]
  for (int64_t t = 0; t < T; ++t) {
    const float* x = stream.row(t, 0);
    Exact ss = 0;
    for (int64_t k = 0; k < W; ++k) ss += exact_of(x[k]) * exact_of(x[k]);
    const Exact R = 1 / mp::sqrt(ss / W + eps32);
    std::vector<Exact> m(static_cast<size_t>(n_mix));
    std::vector<double> dm(static_cast<size_t>(n_mix));
    for (int64_t k = 0; k < n_mix; ++k) {
      Exact d = 0, S = 0;
      const float* f = w.fn.data().data() + k * W;
      for (int64_t i = 0; i < W; ++i) {
        const Exact p = exact_of(x[i]) * exact_of(f[i]);
        d += p;
        S += mp::abs(p);
      }
      m[static_cast<size_t>(k)] = d * R;
      const double gS = gamma(W, kU64) * to_double(S), ad = std::fabs(to_double(d));
      const double e_d = gS + u * (ad + gS);
      dm[static_cast<size_t>(k)] = to_double(R) * (e_d * (1 + b_r) * (1 + u) + ad * ((1 + b_r) * (1 + u) - 1));
    }
    for (int part = 0; part < 2; ++part) {
      for (int64_t i = 0; i < hc; ++i) {
        const size_t k = static_cast<size_t>(part * hc + i);
        const double sc = std::fabs(static_cast<double>(s[part])), ms = std::fabs(to_double(m[k])) * sc;
        const Exact z = m[k] * exact_of(s[part]) + exact_of(base[k]);
        const double dz = (sc * dm[k] + u * ms) * (1 + u) + u * (std::fabs(to_double(z)) + sc * dm[k] + u * ms);
        const Exact sg = sigmoid(z);
        const double sgd = to_double(sg);
        if (part == 0) {
          split.exact.push_back(sg + e);
          split.bound.push_back(dz / 4 + 4 * u * sgd + u * (sgd + to_double(e)));
        } else {
          split.exact.push_back(2 * sg);
          split.bound.push_back(2 * (dz / 4 + 4 * u * sgd));
        }
      }
    }
    // comb: the exact Sinkhorn of the same iteration count.
    std::vector<Exact> c(static_cast<size_t>(hc * hc));
    for (int64_t i = 0; i < hc; ++i) {
      Exact mx;
      for (int64_t j = 0; j < hc; ++j) {
        const size_t k = static_cast<size_t>(2 * hc + i * hc + j);
        c[static_cast<size_t>(i * hc + j)] = m[k] * exact_of(s[2]) + exact_of(base[k]);
        if (j == 0 || c[static_cast<size_t>(i * hc + j)] > mx) mx = c[static_cast<size_t>(i * hc + j)];
      }
      for (int64_t j = 0; j < hc; ++j) c[static_cast<size_t>(i * hc + j)] = mp::exp(c[static_cast<size_t>(i * hc + j)] - mx);
    }
    auto rows = [&](bool plus_e_after) {
      for (int64_t i = 0; i < hc; ++i) {
        Exact sum = 0;
        for (int64_t j = 0; j < hc; ++j) sum += c[static_cast<size_t>(i * hc + j)];
        for (int64_t j = 0; j < hc; ++j) {
          Exact& v = c[static_cast<size_t>(i * hc + j)];
          v = plus_e_after ? v / sum + e : v / (sum + e);
        }
      }
    };
    auto cols = [&] {
      for (int64_t j = 0; j < hc; ++j) {
        Exact sum = 0;
        for (int64_t i = 0; i < hc; ++i) sum += c[static_cast<size_t>(i * hc + j)];
        for (int64_t i = 0; i < hc; ++i) c[static_cast<size_t>(i * hc + j)] /= (sum + e);
      }
    };
    rows(true);
    cols();
    for (int it = 1; it < cfg.hc_sinkhorn_iters; ++it) {
      rows(false);
      cols();
    }
    for (const Exact& v : c) {
      comb.exact.push_back(v);
      comb.bound.push_back(std::numeric_limits<double>::infinity());
    }
  }
  auto run = [stream, wp, cfg](const reference::seam::Ops& ops) {
    return ops.hc_mixes(ops.upload(stream), *wp, cfg.norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps);
  };
  const int64_t H = hc;
  split.run = [run, T, H](const reference::seam::Ops& ops) {
    const reference::HcMixes mx = run(ops);
    const Tensor<float> pre = ops.download(mx.pre), post = ops.download(mx.post);
    std::vector<float> o;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < H; ++i) o.push_back(pre.at(t, i));
      for (int64_t i = 0; i < H; ++i) o.push_back(post.at(t, i));
    }
    return o;
  };
  comb.run = [run](const reference::seam::Ops& ops) { return ops.download(run(ops).comb).data(); };
  return {split, comb};
}

}  // namespace

void add_mhc_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const reference::ModelConfig cfg = reference::load_config("tiny");
  Draws d(seed, "hc_mixes");
  const int64_t hc = cfg.hc_mult, dim = sizes == Sizes::kSmall ? 1024 : cfg.dim, T = sizes == Sizes::kSmall ? 16 : 4;
  const int64_t W = hc * dim, n_mix = reference::hc_mix_count(hc);
  auto w = std::make_shared<reference::HcWeights>();
  w->fn = Tensor<float>({n_mix, W}, "hc_fn");
  for (float& v : w->fn.data()) v = d.f32(1.0 / std::sqrt(static_cast<double>(W)));
  w->base = Tensor<float>({n_mix}, "hc_base");
  for (float& v : w->base.data()) v = d.f32(0.5);
  w->scale = Tensor<float>({3}, "hc_scale");
  for (float& v : w->scale.data()) v = static_cast<float>(0.5 + d.uniform());
  for (OpCase& c : hc_cases("random", bf16_tensor(d, {T, hc, dim}, 1.0, "stream"), w, cfg)) out.push_back(std::move(c));
}

}  // namespace dsv41::scenarios::exact
