// The exact evaluation of `dsv41 exact` (scenarios/exact/exact_eval.h): the exact rounding and the
// Eigen-over-multiprecision products on cases with known answers, the reference's error within
// the derived bound on every case, the bounds not vacuous, and a backend moved a few ulps past
// the bound flagged. Inputs are seeded (tests/support/seed.h: DSV41_SEED overrides).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>

#include "formats/minifloat.h"
#include "reference/ops/config.h"
#include "reports/h5_reader.h"
#include "scenarios/cli/cli.h"
#include "scenarios/exact/exact_internal.h"
#include "reference/seam/forwarding_ops.h"
#include "tests/support/seed.h"

namespace dsv41::scenarios::exact {
namespace {

TEST(ExactRounding, TiesToEvenAndSubnormalSpacing) {
  const Exact one = 1;
  // 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7: the even one (1) wins.
  EXPECT_EQ(round_to(one + mp::ldexp(Exact(1), -8), kBf16), one);
  // 1 + 3 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(round_to(one + 3 * mp::ldexp(Exact(1), -8), kBf16), one + mp::ldexp(Exact(1), -6));
  // Below 2^-126 the bf16 spacing is 2^-133: 1.5 quanta round to 2 (even), 1.25 to 1.
  EXPECT_EQ(round_to(3 * mp::ldexp(Exact(1), -134), kBf16), mp::ldexp(Exact(1), -132));
  EXPECT_EQ(round_to(5 * mp::ldexp(Exact(1), -135), kBf16), mp::ldexp(Exact(1), -133));
  EXPECT_EQ(ulp_of(Exact(3), kF32), mp::ldexp(Exact(1), -22));
}

TEST(ExactRounding, AgreesWithTheFormatsBf16Encoder) {
  // An independent implementation: formats::round_to_bf16 (bit manipulation) on random floats.
  Draws d(test::data_seed(), "round_to vs round_to_bf16");
  int checked = 0;
  for (int i = 0; i < 20000; ++i) {
    const float f = dsv41::f32_from_bits(static_cast<uint32_t>(d.bits()));
    if (!std::isfinite(f) || std::fabs(f) > 3.0e38f) continue;
    ASSERT_EQ(round_to(exact_of(f), kBf16), exact_of(formats::round_to_bf16(f))) << std::hexfloat << f;
    ++checked;
  }
  EXPECT_GT(checked, 15000);
}

TEST(ExactEigen, CancellationThatDoubleGetsWrong) {
  // [2^60, 1, -2^60] . [1, 1, 1]: the exact value is 1; a double sum in order gives 0.
  const float a[3] = {std::ldexp(1.0f, 60), 1.0f, -std::ldexp(1.0f, 60)};
  const float ones[3] = {1.0f, 1.0f, 1.0f};
  double naive = 0.0;
  for (float v : a) naive += static_cast<double>(v);
  EXPECT_EQ(naive, 0.0);
  const ExactMatrix x = exact_matrix(a, 1, 3), y = exact_matrix(ones, 3, 1);
  const ExactMatrix p = x * y;
  EXPECT_EQ(p(0, 0), Exact(1));
  // A dot whose exact sum is representable: sum_{i<64} (i + 0.5) * 2^-10 = 2048 * 2^-10 = 2.
  std::vector<float> u(64), v(64, std::ldexp(1.0f, -10));
  for (int i = 0; i < 64; ++i) u[static_cast<size_t>(i)] = static_cast<float>(i) + 0.5f;
  EXPECT_EQ((exact_matrix(u.data(), 1, 64) * exact_matrix(v.data(), 64, 1))(0, 0), Exact(2));
  // exp in the multiprecision type: e to 40 digits.
  const Exact e("2.718281828459045235360287471352662497757247");
  EXPECT_LT(mp::abs(mp::exp(Exact(1)) - e), Exact("1e-40"));
}

TEST(ExactEigen, QuantizedLinearKnownAnswer) {
  // x = 64 ones: act_quant takes the scale 2^-8 (ceil of 1/448 to a power of two) and the code
  // 256, dequantizing to 1 exactly; w = 64 E4M3 ones with block scale 2^-6 and one 3:
  // y = (63 * 1 + 3) * 2^-6 = 66/64 exactly, for the exact evaluator and the reference alike.
  reference::LinearWeight w;
  w.name = "known";
  w.dtype = reference::DType::kF8E4M3;
  w.out = 1;
  w.in = 64;
  w.w.assign(64, 1.0f);
  w.w[17] = 3.0f;
  w.scale.assign(2, 0x1p-6f);
  const std::vector<float> x(64, 1.0f);
  std::vector<Exact> y, mag;
  exact_quantized_row(x.data(), w, y, mag);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0], Exact(66) / 64);
  EXPECT_EQ(mag[0], Exact(66) / 64);
  const reference::Tensor<float> xt({1, 64}, x, "x");
  EXPECT_EQ(reference::seam::reference_ops().linear(xt, w).data()[0], formats::round_to_bf16(66.0f / 64.0f));
}

std::vector<OpCase>& tiny_cases() {
  static std::vector<OpCase> cases = make_cases(Sizes::kTiny, test::data_seed());
  return cases;
}

TEST(ExactEval, EveryOpFamilyHasCases) {
  std::set<std::string> ops;
  for (const OpCase& c : tiny_cases()) ops.insert(c.op);
  for (const char* op : {"linear F8", "linear F4", "linear BF16", "linear F32", "linear_fp32 (gate)",
                         "linear_fp32 (head)", "grouped_linear", "rms_norm", "rope_rows", "rope_rows (inverse)",
                         "compress", "index_scores", "sparse_attn", "moe_gate", "moe_experts", "index_topk", "index_select", "hc_mixes (pre, post)", "hc_mixes (comb)"}) {
    EXPECT_TRUE(ops.count(op)) << op;
  }
}

TEST(ExactEval, ReferenceWithinTheDerivedBoundOnEveryCase) {
  for (const OpCase& c : tiny_cases()) {
    const SideError e = measure(c, reference::seam::reference_ops(), "ref");
    SCOPED_TRACE(c.op + " / " + c.inputs);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_EQ(e.exceeded, 0) << "max err " << e.max_ulps << " ulps, used " << e.used << " of the bound";
    bool any_nonzero = false;
    for (float v : e.output) any_nonzero = any_nonzero || (v != 0.0f && std::isfinite(v));
    EXPECT_TRUE(any_nonzero || c.flags) << "outputs all zero";
    std::printf("[exact] %-20s %-7s max err %.3g ulps, used %.3g of the bound\n", c.op.c_str(), c.inputs.c_str(),
                e.max_ulps, e.used);
  }
}

TEST(ExactEval, BoundsAreNotVacuous) {
  int random_cases = 0;
  for (const OpCase& c : tiny_cases()) {
    if (!c.bounded || c.flags) continue;  // hc_mixes' comb: measured only; top-k: flags
    const BoundStats b = bound_stats(c);
    SCOPED_TRACE(c.op + " / " + c.inputs);
    EXPECT_FALSE(b.vacuous) << "median " << b.median_ulps << " ulps, tight on " << b.tight_fraction;
    if (c.adversarial) continue;
    ++random_cases;
    // Half an ulp of a bf16 output's final rounding is the floor; the accumulation part is small
    // on random data. An fp32 output has no final rounding: its bound is the accumulation's.
    EXPECT_GT(b.max_ulps, 0.0);
    if (c.out.precision == kBf16.precision) {
      EXPECT_LT(b.median_ulps, 1.5);
    }
    EXPECT_GE(b.tight_fraction, 0.9);
  }
  EXPECT_GE(random_cases, 10);
}

// The fp8 tensor-core bounds (the production backend's linear F8 and moe_experts' F8 shared expert,
// scenarios/judge/fp8_mma_bound.h; sparse_attn's the larger of its exact bound and the bf16
// tensor-core kernel's, scenarios/judge/sparse_attn_mma_bound.h): present exactly where an F8
// linear or the attention is, each at least the exact
// bound it widens, the reference within it; linear F8's not vacuous. moe_experts' is, on these
// random weights (uniform E4M3 codes): its F8 linears' wider radii straddle bf16 boundaries of g
// and u, so h's act_quant codes may flip by a whole E4M3 step (6%) and the bound must admit it
// (tight on about 43% of the outputs: printed, and reported by `dsv41 exact`).
TEST(ExactEval, TensorCoreBoundsWidenTheF8CasesAndStayTight) {
  int widened = 0;
  for (const OpCase& c : tiny_cases()) {
    SCOPED_TRACE(c.op + " / " + c.inputs);
    const bool f8 = c.op == "linear F8" || c.op == "moe_experts", attn = c.op == "sparse_attn";
    ASSERT_EQ(!c.tensor_core_bound.empty(), f8 || attn);
    if (!f8 && !attn) continue;
    ASSERT_EQ(c.tensor_core_bound.size(), c.bound.size());
    int64_t wider = 0;
    for (size_t i = 0; i < c.bound.size(); ++i) {
      EXPECT_GE(c.tensor_core_bound[i], c.bound[i]) << "output " << i;
      wider += c.tensor_core_bound[i] > c.bound[i];
    }
    if (f8) {
      EXPECT_GT(wider, 0) << "the tensor-core terms widened nothing";
    }
    const OpCase t = with_tensor_core_bound(c);
    EXPECT_EQ(measure(t, reference::seam::reference_ops(), "ref").exceeded, 0);
    const BoundStats b = bound_stats(t);
    if (c.op == "linear F8" || (attn && !c.adversarial)) {
      EXPECT_FALSE(b.vacuous) << "median " << b.median_ulps << " ulps, tight on " << b.tight_fraction;
    }
    std::printf("[exact] tensor cores: %-12s %-7s bound median %.3g ulps (exact bound %.3g), tight on %.3g\n",
                c.op.c_str(), c.inputs.c_str(), b.median_ulps, bound_stats(c).median_ulps, b.tight_fraction);
    ++widened;
  }
  EXPECT_EQ(widened, 7);  // linear F8 random, long, cancel; moe_experts random; sparse_attn random, peaked, ties
}

// A backend whose rms_norm moves one output, and whose rope_rows moves one rotated channel, by 3
// bf16 ulps (past any bound of 1.5 ulps).
float off_by_three(float v) { return dsv41::f32_from_bits(dsv41::f32_bits(v) + (3u << 16)); }

class OffByUlps : public reference::seam::ForwardingOps {
 public:
  std::string name() const override { return "off-by-ulps"; }
  reference::Tensor<float> rms_norm(const reference::Tensor<float>& x, const reference::Tensor<float>& w,
                                    double eps) const override {
    reference::Tensor<float> y = ForwardingOps::rms_norm(x, w, eps);
    y.data()[5] = off_by_three(y.data()[5]);
    return y;
  }
  void rope_rows(reference::Tensor<float>& x, int64_t heads, const reference::RopeTable& rope, int64_t first,
                 int64_t stride, bool inverse) const override {
    ForwardingOps::rope_rows(x, heads, rope, first, stride, inverse);
    const int64_t tail = x.dim(1) / heads - rope.rope_dim();  // the first rotated channel of head 0
    x.data()[static_cast<size_t>(tail)] = off_by_three(x.data()[static_cast<size_t>(tail)]);
  }
};

TEST(ExactEval, ABackendMovedPastTheBoundIsFlagged) {
  const OffByUlps off;
  int flagged_norm = 0, flagged_rope = 0;
  for (const OpCase& c : tiny_cases()) {
    const bool norm = c.op == "rms_norm", rope = c.op.rfind("rope_rows", 0) == 0;
    if (!norm && !rope) continue;
    const SideError ref = measure(c, reference::seam::reference_ops(), "ref");
    const SideError bad = measure(c, off, "off");
    SCOPED_TRACE(c.op + " / " + c.inputs);
    EXPECT_EQ(ref.exceeded, 0);
    EXPECT_EQ(bad.exceeded, 1);
    (norm ? flagged_norm : flagged_rope) += bad.exceeded >= 1;
    const Closer cl = closer(c, ref, bad);
    EXPECT_EQ(cl.verdict, "ref");
    EXPECT_EQ(cl.a_closer, 1);
    EXPECT_EQ(cl.b_closer, 0);
  }
  EXPECT_EQ(flagged_norm, 3);
  EXPECT_EQ(flagged_rope, 2);
  // Every other op is forwarded unchanged: bit-identical, "equal".
  const OpCase& first = tiny_cases().front();
  ASSERT_EQ(first.op, "linear F8");
  EXPECT_EQ(closer(first, measure(first, reference::seam::reference_ops(), "ref"), measure(first, off, "off")).verdict,
            "equal");
}

// A backend that moves output `index` of one op family by 2 bf16 ulps: each bf16 op's bound must
// catch it wherever the bound is below one ulp (the bound has teeth on every op, not only the two
// above).
class PerturbOne : public reference::seam::ForwardingOps {
 public:
  size_t index = 0;
  std::string op;
  std::string name() const override { return "perturb-one"; }
  reference::Tensor<float> off(reference::Tensor<float> y, const char* which) const {
    if (op == which) y.data()[index] = dsv41::f32_from_bits(dsv41::f32_bits(y.data()[index]) + (2u << 16));
    return y;
  }
  reference::Tensor<float> linear(const reference::Tensor<float>& x, const reference::LinearWeight& w) const override {
    return off(ForwardingOps::linear(x, w), "linear");
  }
  reference::Tensor<float> grouped_linear(const reference::Tensor<float>& x, const reference::LinearWeight& w,
                                          int g) const override {
    return off(ForwardingOps::grouped_linear(x, w, g), "grouped_linear");
  }
  reference::CompressedLatents compress(const reference::Tensor<float>& kv, const reference::Tensor<float>& s,
                                        int64_t start, int ratio, reference::Tensor<float>& kvs,
                                        reference::Tensor<float>& ss) const override {
    reference::CompressedLatents l = ForwardingOps::compress(kv, s, start, ratio, kvs, ss);
    l.latent = off(std::move(l.latent), "compress");
    return l;
  }
  reference::Tensor<float> index_scores(const reference::Tensor<float>& q, const reference::CacheRows& k,
                                        const reference::Tensor<float>& w,
                                        const std::vector<int64_t>& reach) const override {
    return off(ForwardingOps::index_scores(q, k, w, reach), "index_scores");
  }
  reference::Tensor<float> sparse_attn(const reference::Tensor<float>& q, const reference::Tensor<float>& kv,
                                       const reference::CacheRows& c, const reference::Tensor<float>& sink,
                                       const reference::Tensor<int32_t>& idxs, float scale) const override {
    return off(ForwardingOps::sparse_attn(q, kv, c, sink, idxs, scale), "sparse_attn");
  }
  reference::Tensor<float> moe_experts(const reference::Tensor<float>& x, const reference::MoeWeights& w,
                                       const reference::MoeRouting& r, const reference::ModelConfig& c) const override {
    return off(ForwardingOps::moe_experts(x, w, r, c), "moe_experts");
  }
};

TEST(ExactEval, TwoUlpsOffIsFlaggedOnEveryBf16Op) {
  int checked = 0;
  for (const OpCase& c : tiny_cases()) {
    if (c.out.precision != kBf16.precision || c.adversarial) continue;
    const std::string family = c.op.rfind("linear ", 0) == 0 ? "linear" : c.op;
    if (family != "linear" && family != "grouped_linear" && family != "compress" && family != "index_scores" &&
        family != "sparse_attn" && family != "moe_experts") {
      continue;
    }
    PerturbOne off;
    off.op = family;
    off.index = c.exact.size();
    for (size_t i = 0; i < c.exact.size(); ++i) {  // the first finite, nonzero output with a sub-ulp bound
      if (!mp::isinf(c.exact[i]) && c.exact[i] != 0 && Exact(c.bound[i]) < Exact(0.75) * ulp_of(c.exact[i], kBf16)) {
        off.index = i;
        break;
      }
    }
    SCOPED_TRACE(c.op + " / " + c.inputs);
    ASSERT_LT(off.index, c.exact.size()) << "no output with a bound below 0.75 ulp";
    EXPECT_EQ(measure(c, off, "off").exceeded, 1);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// moe_gate's expert choice is compared tie-aware: replacing a token's last choice by its lowest
// scoring expert (certainly out on random gates) is flagged, by the token's flag and its weights.
class WrongExpert : public reference::seam::ForwardingOps {
 public:
  std::string name() const override { return "wrong-expert"; }
  reference::MoeRouting moe_gate(const reference::Tensor<float>& x, const reference::MoeWeights& w,
                                 const reference::ModelConfig& c, int layer) const override {
    reference::MoeRouting r = ForwardingOps::moe_gate(x, w, c, layer);
    const int64_t E = r.scores.dim(1), k = r.experts.dim(1);
    int32_t worst = 0;
    for (int32_t e = 1; e < E; ++e) {
      if (r.scores.at(0, e) + w.gate_bias.data()[static_cast<size_t>(e)] <
          r.scores.at(0, worst) + w.gate_bias.data()[static_cast<size_t>(worst)]) {
        worst = e;
      }
    }
    r.experts.at(0, k - 1) = worst;
    ForwardingOps::moe_routing_weights(r, c);
    return r;
  }
};

TEST(ExactEval, AWrongExpertChoiceIsFlaggedTieAware) {
  const WrongExpert wrong;
  for (const OpCase& c : tiny_cases()) {
    if (c.op != "moe_gate" || c.inputs != "random") continue;
    EXPECT_EQ(measure(c, reference::seam::reference_ops(), "ref").exceeded, 0);
    const SideError e = measure(c, wrong, "wrong");
    // Outputs: T x E scores, T x k weights, T flags.
    const reference::ModelConfig cfg = reference::load_config("tiny");
    const size_t T = c.exact.size() / static_cast<size_t>(cfg.n_routed_experts + cfg.n_activated_experts + 1);
    EXPECT_EQ(e.output[e.output.size() - T], 1.0f);      // token 0's flag
    EXPECT_EQ(e.output[e.output.size() - T + 1], 0.0f);  // token 1 untouched
    EXPECT_EQ(e.nonfinite, 1);                           // the emptied weight slot
    // The flag, the emptied slot, and the other k - 1 weights of token 0 (renormalised over
    // another set): 1 + k outputs.
    EXPECT_EQ(e.exceeded, 1 + cfg.n_activated_experts);
    return;
  }
  FAIL() << "no moe_gate random case";
}

// index_topk is compared tie-aware: a backend that breaks ties the other way (the HIGHER position
// wins) picks other positions among tied scores, and is never wrong for it.
class HighTieRule : public reference::seam::ForwardingOps {
 public:
  std::string name() const override { return "high-tie-rule"; }
  reference::Tensor<int32_t> index_topk(const reference::Tensor<float>& scores, const std::vector<int64_t>& reach,
                                        int k) const override {
    // The reference's top-k of the row reversed (position n -> N-1-n), mapped back: among equal
    // scores the higher position now wins.
    const int64_t T = scores.dim(0), N = scores.dim(1);
    reference::Tensor<float> rev({T, N}, "reversed");
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < N; ++n) rev.at(t, n) = scores.at(t, N - 1 - n);
    }
    // Unreachable tails become unreachable heads: give every row full reach, -inf keeps them out.
    reference::Tensor<int32_t> top = ForwardingOps::index_topk(rev, std::vector<int64_t>(static_cast<size_t>(T), N), k);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < top.dim(1); ++j) {
        int32_t& v = top.at(t, j);
        if (v >= 0) v = static_cast<int32_t>(N - 1 - v);
        if (v >= reach[static_cast<size_t>(t)]) v = -1;
      }
    }
    return top;
  }
};

// A backend that takes the k LOWEST reachable scores: wrong wherever scores are distinct, and
// still correct where every reachable score ties.
class LowestK : public reference::seam::ForwardingOps {
 public:
  std::string name() const override { return "lowest-k"; }
  reference::Tensor<int32_t> index_topk(const reference::Tensor<float>& scores, const std::vector<int64_t>& reach,
                                        int k) const override {
    reference::Tensor<float> neg = scores;
    for (float& v : neg.data()) v = std::isinf(v) ? v : -v;  // -inf (unreachable) stays out
    return ForwardingOps::index_topk(neg, reach, k);
  }
};

TEST(ExactEval, TopKIsComparedTieAware) {
  const HighTieRule high;
  const LowestK low;
  int seen = 0;
  for (const OpCase& c : tiny_cases()) {
    // index_select (the fused op): its default composes the table's own index_topk, so these
    // tables' tie rules and wrong picks reach it too (a pooled case: positions outside the pool
    // are never right).
    if (c.op != "index_topk" && c.op != "index_select") continue;
    SCOPED_TRACE(c.op + " / " + c.inputs);
    EXPECT_EQ(measure(c, reference::seam::reference_ops(), "ref").exceeded, 0);
    // The other tie rule picks other positions among ties, never a wrong one.
    EXPECT_EQ(measure(c, high, "high").exceeded, 0);
    if (c.inputs == "ties") {
      EXPECT_EQ(measure(c, low, "low").exceeded, 0);  // every reachable score ties: any k are right
    } else {
      EXPECT_GE(measure(c, low, "low").exceeded, 3);  // distinct scores: wrong picks on every full row
    }
    ++seen;
  }
  EXPECT_EQ(seen, 5);  // index_topk: random, ties; index_select: random, random with a pool, ties
}

TEST(ExactEval, TheOtherTieRuleReallyPicksOtherPositions) {
  // Guards the test above: on tied scores the two rules' selections differ (so "not flagged" there
  // is the tie-awareness, not an identical answer).
  reference::Tensor<float> tied({1, 16}, "scores", 1.0f);
  const std::vector<int64_t> reach{16};
  const auto a = reference::seam::reference_ops().index_topk(tied, reach, 4);
  const auto b = HighTieRule().index_topk(tied, reach, 4);
  EXPECT_NE(a.data(), b.data());
}

TEST(ExactCli, RefPassesAndPrintsTheSeed) {
  std::ostringstream out;
  const int rc = cli::run_exact(out, {"ref"}, "tiny", 5, "");
  EXPECT_EQ(rc, runner::kExitOk) << out.str();
  EXPECT_NE(out.str().find("seed 5"), std::string::npos);
  EXPECT_NE(out.str().find("sparse_attn"), std::string::npos);
  EXPECT_NE(out.str().find("bounds exceeded on 0 outputs; 0 vacuous bounds; 0 cases failed"), std::string::npos) << out.str();
}

TEST(ExactCli, WritesThePerCaseNumbersToHdf5) {
  const std::string path = testing::TempDir() + "exact_eval_test.h5";
  std::ostringstream out;
  ASSERT_EQ(cli::run_exact(out, {"ref", "ref"}, "tiny", 3, path), runner::kExitOk) << out.str();
  const reports::H5Reader r(path);
  EXPECT_EQ(r.attr_uint("/", "seed"), 3u);
  const std::vector<std::string> ops = r.read_strings("/op");
  const std::vector<double> ulps = r.read_doubles("/ref/max_ulps"), exceeded = r.read_doubles("/exceeded");
  EXPECT_EQ(r.read_doubles("/ref_b/max_ulps"), ulps);  // the same backend twice: the same errors
  ASSERT_EQ(ops.size(), make_cases(Sizes::kTiny, 3).size());
  ASSERT_EQ(ulps.size(), ops.size());
  ASSERT_EQ(exceeded.size(), ops.size());
  double most = 0.0;
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(exceeded[i], 0.0) << ops[i];
    most = std::max(most, ulps[i]);
  }
  EXPECT_GT(most, 0.0);  // errors recorded, not all zero
  for (const std::string& v : r.read_strings("/closer")) EXPECT_EQ(v, "equal");  // ref against itself
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dsv41::scenarios::exact
