// tests/scenarios/judge/sparse_attn_mma_bound_test.cc: the derived bound of the production sparse
// attention (scenarios/judge/sparse_attn_mma_bound.h) on the CPU, no device needed:
//   1. the reference's own output (reference::sparse_attn) is within the kReference bound of the
//      exact value (random, sharp, masked rows, a partial last block, a row of only -1);
//   2. an emulation of the kernels' arithmetic (cuda/attention_wgmma.cu's order on half the rows,
//      cuda/attention_mma.cu's on the others; each tensor-core step one instance of the model: the
//      exact sum truncated toward zero below 2^(E - 23), then fp32) is within the kMma bound;
//   2b. the same for the split kernel (slices of 1, 2, 3 blocks, combined in order; the bound's
//      slice_blocks), and one slice gives the unsplit bound and emulation;
//   3. the kMma bound is not vacuous on random data (>= 90% of the outputs within 1.5 bf16 ulps of
//      their row's largest value), and 2 bf16 ulps (of the output's own binade) added to the
//      emulated output exceed it on most outputs (on every output whose bound is below one ulp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "formats/minifloat.h"
#include "reference/ops/attention.h"
#include "reference/ops/tensor.h"
#include "scenarios/judge/sparse_attn_mma_bound.h"

namespace dsv41::scenarios::judge {
namespace {

using reference::Tensor;

float bf16(float x) { return formats::round_to_bf16(x); }

// One tensor-core step: c + sum p_i, exact, truncated toward zero to the quantum 2^(E - 23) of the
// largest term, then rounded to fp32.
float step(float c, const std::vector<double>& p) {
  double sum = c, big = std::fabs(static_cast<double>(c));
  for (const double v : p) {
    sum += v;
    big = std::max(big, std::fabs(v));
  }
  if (big == 0) return static_cast<float>(sum);
  const double q = std::ldexp(1.0, std::ilogb(big) - 23);
  return static_cast<float>(std::trunc(sum / q) * q);
}

// One slice's partial: the running max m (base 2), l (no sink), the unnormalised O.
struct Partial {
  float m = -1e30f, l = 0.0f;
  std::vector<float> o;
};

// The kernels' arithmetic for one (query, head) row (cuda/attention_wgmma.cu's header) over blocks
// b_lo .. b_hi - 1: the score as one chain of D/16 steps (wgmma, single) or two channel halves then
// one add (mma.sync).
Partial emulate_blocks(const float* q, const std::vector<const float*>& rows, int64_t D, float scale, bool single,
                       int64_t b_lo, int64_t b_hi) {
  const int64_t K = static_cast<int64_t>(rows.size());
  const float c2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634074);
  Partial part;
  part.o.assign(static_cast<size_t>(D), 0.0f);
  std::vector<float>& o = part.o;
  float& m = part.m;
  float& l = part.l;
  for (int64_t b = b_lo; b < b_hi; ++b) {
    float x[64], p[64];
    float bmax = -INFINITY;
    for (int j = 0; j < 64; ++j) {
      const int64_t jj = b * 64 + j;
      const float* k = jj < K ? rows[static_cast<size_t>(jj)] : nullptr;
      if (k == nullptr) {
        x[j] = -INFINITY;
        continue;
      }
      float half[2] = {0, 0};
      for (int h = 0; h < 2; ++h) {
        const int64_t lo = single ? (h == 0 ? 0 : D) : h * D / 2, hi = single ? (h == 0 ? D : D) : (h + 1) * D / 2;
        for (int64_t d0 = lo; d0 < hi; d0 += 16) {
          std::vector<double> prod;
          for (int64_t d = d0; d < d0 + 16; ++d) prod.push_back(static_cast<double>(q[d]) * k[d]);
          half[h] = step(half[h], prod);
        }
      }
      x[j] = (single ? half[0] : half[0] + half[1]) * c2;
      bmax = std::max(bmax, x[j]);
    }
    const float m_new = std::max(m, bmax);
    const float r = std::exp2(m - m_new);
    m = m_new;
    float psum = 0.0f;
    for (int j = 0; j < 64; ++j) {
      const float e = std::exp2(x[j] - m);
      psum += e;
      p[j] = bf16(e);
    }
    l = l * r + psum;
    for (int64_t d = 0; d < D; ++d) {
      float acc = o[static_cast<size_t>(d)] * r;
      for (int s = 0; s < 4; ++s) {
        std::vector<double> prod;
        for (int j = 16 * s; j < 16 * s + 16; ++j) {
          const int64_t jj = b * 64 + j;
          const float* v = jj < K ? rows[static_cast<size_t>(jj)] : nullptr;
          prod.push_back(v == nullptr ? 0.0 : static_cast<double>(p[j]) * v[d]);
        }
        acc = step(acc, prod);
      }
      o[static_cast<size_t>(d)] = acc;
    }
  }
  return part;
}

// The whole row: slices of `per` blocks (0: one slice, the unsplit kernel), combined in slice order
// as the split's combine kernel does (the sums start at slice 0's term), then the sink and 1 / l.
std::vector<float> emulate(const float* q, const std::vector<const float*>& rows, int64_t D, float sink, float scale,
                           bool single, int64_t per = 0) {
  const int64_t B = (static_cast<int64_t>(rows.size()) + 63) / 64, step = per > 0 ? per : std::max<int64_t>(B, 1);
  std::vector<Partial> parts;
  for (int64_t b = 0; b < std::max<int64_t>(B, 1); b += step)
    parts.push_back(emulate_blocks(q, rows, D, scale, single, b, std::min(B, b + step)));
  float m = parts[0].m;
  for (const Partial& p : parts) m = std::max(m, p.m);
  float l = 0.0f;
  std::vector<float> o(static_cast<size_t>(D), 0.0f);
  for (size_t s = 0; s < parts.size(); ++s) {
    const float f = std::exp2(parts[s].m - m);
    l = s == 0 ? parts[s].l * f : l + parts[s].l * f;
    for (size_t d = 0; d < o.size(); ++d) o[d] = s == 0 ? parts[s].o[d] * f : o[d] + parts[s].o[d] * f;
  }
  l += std::exp2(sink * 1.44269504f - m);
  const float inv = 1.0f / l;
  for (float& v : o) v = bf16(v * inv);
  return o;
}

struct Case {
  int64_t T, H, D, N, K;
  float q_scale;
  double minus_one;
};

struct Stats {
  double worst_ref = 0, worst_mma = 0;
  int64_t n = 0, tight = 0, flagged = 0, sub_ulp = 0;
};

// per: the split's slice_blocks for the kMma bound and the emulation (0: unsplit).
void run(const Case& c, uint64_t seed, Stats& st, int64_t per = 0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor<float> q({c.T, c.H, c.D}, "q"), kv({c.N, c.D}, "kv");
  for (float& v : q.data()) v = bf16(c.q_scale * nd(g));
  for (float& v : kv.data()) v = bf16(nd(g));
  std::vector<float> sink(static_cast<size_t>(c.H));
  for (float& v : sink) v = 2.0f * nd(g);
  Tensor<int32_t> idx({c.T, c.K}, "idx");
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.N) - 1);
  std::bernoulli_distribution none(c.minus_one);
  for (int32_t& v : idx.data()) v = none(g) ? -1 : pick(g);
  if (c.T > 1) std::fill(idx.row(c.T - 1), idx.row(c.T - 1) + c.K, -1);  // a row of only -1
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const Tensor<float> ref = reference::sparse_attn(q, kv, sink, idx, scale);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<const float*> rows(static_cast<size_t>(c.K));
    for (int64_t j = 0; j < c.K; ++j) rows[static_cast<size_t>(j)] = idx.at(t, j) < 0 ? nullptr : kv.row(idx.at(t, j));
    for (int64_t h = 0; h < c.H; ++h) {
      const float sk = sink[static_cast<size_t>(h)];
      const SparseAttnRowBound br = sparse_attn_row_bound(q.row(t, h), rows, c.D, sk, scale, AttnArith::kReference);
      const SparseAttnRowBound bm = sparse_attn_row_bound(q.row(t, h), rows, c.D, sk, scale, AttnArith::kMma, per);
      const std::vector<float> em = emulate(q.row(t, h), rows, c.D, sk, scale, per > 0 || (t + h) % 2 == 0, per);
      double row_max = 0;
      for (const double e : bm.exact) row_max = std::max(row_max, std::fabs(e));
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(row_max, 0x1p-100)) - 7);
      for (int64_t d = 0; d < c.D; ++d) {
        const size_t i = static_cast<size_t>(d);
        const double slack = 0x1p-40 * std::fabs(bm.exact[i]);
        const double e_ref = std::fabs(ref.at(t, h, d) - br.exact[i]), e_mma = std::fabs(em[i] - bm.exact[i]);
        ASSERT_LE(e_ref, br.bound[i] + slack) << "reference, t " << t << " h " << h << " d " << d;
        ASSERT_LE(e_mma, bm.bound[i] + slack) << "emulated kernel, t " << t << " h " << h << " d " << d;
        if (br.bound[i] > 0) st.worst_ref = std::max(st.worst_ref, e_ref / br.bound[i]);
        if (bm.bound[i] > 0) st.worst_mma = std::max(st.worst_mma, e_mma / bm.bound[i]);
        if (row_max == 0) {
          EXPECT_EQ(em[i], 0.0f);
          continue;
        }
        ++st.n;
        st.tight += bm.bound[i] <= 1.5 * ulp;
        // 2 bf16 ulps (of the output's own binade) added to the emulated output
        const double own_ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(bm.exact[i]), 0x1p-126)) - 7);
        const double moved = em[i] + 2 * own_ulp;
        st.sub_ulp += bm.bound[i] < own_ulp;
        st.flagged += std::fabs(moved - bm.exact[i]) > bm.bound[i] + slack;
      }
    }
  }
}

TEST(SparseAttnMmaBound, ReferenceAndEmulatedKernelWithinTheirBounds) {
  Stats st;
  const Case cases[] = {
      {3, 4, 128, 300, 200, 1.0f, 0.1},   // partial last block (200 = 3 x 64 + 8)
      {2, 3, 256, 200, 130, 6.0f, 0.3},   // sharp softmax
      {2, 2, 512, 700, 640, 1.0f, 0.02},  // the released width and k
  };
  uint64_t seed = 7;
  for (const Case& c : cases) run(c, seed++, st);
  std::printf("reference: max err/bound %.3f; emulated kernel: max err/bound %.3f; kMma bound within 1.5 bf16 ulps "
              "of the row max on %.1f%% of %lld outputs; +2 own ulps flagged on %lld, the bound below one own ulp on %lld\n",
              st.worst_ref, st.worst_mma, 100.0 * static_cast<double>(st.tight) / static_cast<double>(st.n),
              static_cast<long long>(st.n), static_cast<long long>(st.flagged), static_cast<long long>(st.sub_ulp));
  EXPECT_GE(static_cast<double>(st.tight), 0.9 * static_cast<double>(st.n)) << "vacuous";
  EXPECT_GE(st.flagged, st.sub_ulp) << "a 2-ulp move of an output with a sub-ulp bound not flagged";
  EXPECT_GE(static_cast<double>(st.flagged), 0.5 * static_cast<double>(st.n)) << "2-ulp moves mostly unseen";
}

// The split (flash-decoding) kernel: slices of 1, 2 and 3 blocks (the decode shape k 640: 10, 5, 4
// slices), the emulation within the split bound, the bound as tight as the unsplit one's test asks;
// and a slice count of one is the unsplit bound itself.
TEST(SparseAttnMmaBound, SplitEmulationWithinItsBound) {
  for (const int64_t per : {1, 2, 3}) {
    Stats st;
    const Case cases[] = {
        {3, 4, 128, 300, 200, 1.0f, 0.1},   // partial last block, a partial last slice
        {2, 3, 256, 200, 130, 6.0f, 0.3},   // sharp softmax: slices whose max is far below M
        {2, 2, 512, 700, 640, 1.0f, 0.02},  // the released width and k
        {2, 2, 128, 100, 256, 1.0f, 0.9},   // mostly -1: slices of only -1
    };
    uint64_t seed = 17;
    for (const Case& c : cases) run(c, seed++, st, per);
    std::printf("split, %lld block(s) a slice: emulated max err/bound %.3f; bound within 1.5 bf16 ulps of the row max "
                "on %.1f%% of %lld outputs; +2 own ulps flagged on %lld (sub-ulp bounds %lld)\n",
                static_cast<long long>(per), st.worst_mma, 100.0 * static_cast<double>(st.tight) / static_cast<double>(st.n),
                static_cast<long long>(st.n), static_cast<long long>(st.flagged), static_cast<long long>(st.sub_ulp));
    EXPECT_GE(static_cast<double>(st.tight), 0.9 * static_cast<double>(st.n)) << "vacuous, slices of " << per;
    EXPECT_GE(st.flagged, st.sub_ulp) << "slices of " << per;
    EXPECT_GE(static_cast<double>(st.flagged), 0.5 * static_cast<double>(st.n)) << "slices of " << per;
  }
  // one slice (slice_blocks >= the row's blocks) is the unsplit bound, bit for bit
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(128), kv(200 * 128);
  for (float& v : q) v = bf16(nd(g));
  for (float& v : kv) v = bf16(nd(g));
  std::vector<const float*> rows(150);
  for (size_t j = 0; j < rows.size(); ++j) rows[j] = j % 7 == 3 ? nullptr : kv.data() + (j * 37 % 200) * 128;
  const SparseAttnRowBound a = sparse_attn_row_bound(q.data(), rows, 128, 0.5f, 0.088f, AttnArith::kMma);
  const SparseAttnRowBound b = sparse_attn_row_bound(q.data(), rows, 128, 0.5f, 0.088f, AttnArith::kMma, 3);
  const SparseAttnRowBound s = sparse_attn_row_bound(q.data(), rows, 128, 0.5f, 0.088f, AttnArith::kMma, 1);
  EXPECT_EQ(a.bound, b.bound);
  EXPECT_EQ(a.exact, s.exact);
  int64_t wider = 0;
  for (size_t d = 0; d < a.bound.size(); ++d) wider += s.bound[d] > a.bound[d];
  EXPECT_GT(wider, 0) << "the split's extra roundings not in its bound";
  const std::vector<float> one = emulate(q.data(), rows, 128, 0.5f, 0.088f, true, 3);
  EXPECT_EQ(one, emulate(q.data(), rows, 128, 0.5f, 0.088f, true)) << "one slice is the unsplit arithmetic";
}

TEST(SparseAttnMmaBound, StepModel) {
  // delta covers one step's truncation of 17 terms and two fp32 roundings
  EXPECT_DOUBLE_EQ(bf16_mma_step_error(2.0, 6.0), 8.0 * 0x1p-18);
  const std::vector<double> p(16, std::ldexp(1.0, -30));
  EXPECT_LE(std::fabs(static_cast<double>(step(1.0f, p)) - (1.0 + 16 * std::ldexp(1.0, -30))),
            bf16_mma_step_error(1.0, 16 * std::ldexp(1.0, -30)));
}

}  // namespace
}  // namespace dsv41::scenarios::judge
