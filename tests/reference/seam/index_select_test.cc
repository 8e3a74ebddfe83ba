// Ops::index_select, the fused indexer op of the seam (reference/seam/ops.h):
//   - its default (what the reference and cuda-exact run) is the composition index_scores ->
//     candidate_blocks / mask_scores -> index_topk bit for bit, for a plain index layer, the
//     candidate source and a layer inside the pool, on random scores and on scores full of ties;
//   - the model calls it exactly when no hook captures index_scores (no hooks, or hooks that skip
//     kIndexScores), and the unfused ops otherwise; on the oracle run both give the same records;
//   - a table whose index_select differs changes the model's selections (the fused op's outputs
//     are the ones used), and one that overrides index_scores changes the default fused op too.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/cache_format.h"
#include "reference/model/model.h"
#include "reference/ops/indexer.h"
#include "reference/ops/kv_quant.h"
#include "reference/seam/forwarding_ops.h"
#include "reference/seam/ops.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::reference::seam {
namespace {

using formats::CacheFormat;

struct Case {
  Tensor<float> q;                // [T, Hi, Di] FP4-QDQ
  Tensor<uint8_t> storage;        // the packed index-key cache
  CacheRows keys;                 // its first n entries
  Tensor<float> w;                // [T, Hi]
  std::vector<int64_t> reach;     // [T], reach.back() == n
};

// Random rows; `levels` > 0 draws every value from {-1, 0, 1} * levels-spaced grid so that many
// scores tie exactly.
Tensor<float> random_rows(std::vector<int64_t> shape, std::mt19937_64& rng, int levels, const char* name) {
  Tensor<float> t(std::move(shape), name);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> u(-levels, levels);
  for (float& v : t.data()) v = levels > 0 ? static_cast<float>(u(rng)) : d(rng);
  return t;
}

Case make_case(int64_t T, int64_t heads, int64_t dim, int64_t n, int levels, std::mt19937_64& rng) {
  Case c;
  c.q = qdq(CacheFormat::kIndexKeysFp4, random_rows({T, heads, dim}, rng, levels, "q"));
  const Tensor<float> rows = qdq(CacheFormat::kIndexKeysFp4, random_rows({n, dim}, rng, levels, "keys"));
  c.storage = Tensor<uint8_t>({n + 2, formats::entry_bytes(CacheFormat::kIndexKeysFp4, static_cast<int>(dim))}, "ik");
  std::vector<int64_t> entries(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
  write_entries(c.storage, CacheFormat::kIndexKeysFp4, entries, rows);
  c.keys = CacheRows{CacheFormat::kIndexKeysFp4, dim, n, &c.storage};
  c.w = index_weights(random_rows({T, heads}, rng, 0, "proj"), static_cast<int>(dim));
  c.reach.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) c.reach[static_cast<size_t>(t)] = n - (T - 1 - t) / 2;  // decode-like
  return c;
}

Tensor<uint8_t> random_pool(int64_t T, int64_t n, std::mt19937_64& rng) {
  Tensor<uint8_t> m({T, n}, "pool");
  std::bernoulli_distribution b(0.4);
  for (uint8_t& v : m.data()) v = b(rng) ? 1 : 0;
  return m;
}

void expect_same(const Tensor<int32_t>& a, const Tensor<int32_t>& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.data(), b.data()) << what;
}
void expect_same(const Tensor<uint8_t>& a, const Tensor<uint8_t>& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.data(), b.data()) << what;
}

TEST(IndexSelect, DefaultIsTheCompositionBitForBit) {
  std::mt19937_64 rng(test::seed_for("index_select/default"));
  const Ops& ops = reference_ops();
  int64_t tied_rows = 0;
  for (int levels : {0, 1}) {  // random scores, then scores full of exact ties
    for (const auto& [T, heads, dim, n] : std::vector<std::array<int64_t, 4>>{{1, 8, 64, 37}, {5, 8, 64, 300},
                                                                             {3, 32, 128, 1000}}) {
      const Case c = make_case(T, heads, dim, n, levels, rng);
      const std::string what = "levels " + std::to_string(levels) + " T " + std::to_string(T) + " n " + std::to_string(n);
      for (int k : {4, 32, 2000}) {
        const Tensor<float> scores = ops.index_scores(c.q, c.keys, c.w, c.reach);
        for (int64_t t = 0; t < T; ++t) {
          std::map<float, int> seen;
          for (int64_t j = 0; j < c.reach[static_cast<size_t>(t)]; ++j) ++seen[scores.at(t, j)];
          if (static_cast<int64_t>(seen.size()) < c.reach[static_cast<size_t>(t)] / 2) ++tied_rows;
        }
        // A plain index layer.
        IndexSelectSpec plain;
        plain.index_topk = k;
        const IndexSelection p = ops.index_select(c.q, c.keys, c.w, c.reach, plain);
        expect_same(p.topk, ops.index_topk(scores, c.reach, k), what + " plain");
        EXPECT_EQ(p.candidates.rank(), 0) << what << ": a plain layer publishes no mask";
        // The candidate source (blocks of 8, 3 or all blocks kept).
        for (int blocks : {3, 1000}) {
          IndexSelectSpec source = plain;
          source.candidate_topk_blocks = blocks;
          source.candidate_block_size = 8;
          const IndexSelection s = ops.index_select(c.q, c.keys, c.w, c.reach, source);
          expect_same(s.candidates, ops.candidate_blocks(scores, c.reach, blocks, 8), what + " source mask");
          expect_same(s.topk, ops.index_topk(scores, c.reach, k), what + " source topk");
        }
        // A layer inside the pool.
        const Tensor<uint8_t> pool = random_pool(T, n, rng);
        IndexSelectSpec inside = plain;
        inside.pool = &pool;
        Tensor<float> masked = scores;
        ops.mask_scores(masked, pool);
        expect_same(ops.index_select(c.q, c.keys, c.w, c.reach, inside).topk, ops.index_topk(masked, c.reach, k),
                    what + " pool");
      }
    }
  }
  EXPECT_GT(tied_rows, 0) << "the tie cases hold no ties";
  IndexSelectSpec both;
  both.index_topk = 4;
  both.candidate_topk_blocks = 2;
  both.candidate_block_size = 8;
  const Case c = make_case(1, 8, 64, 16, 0, rng);
  const Tensor<uint8_t> pool = random_pool(1, 16, rng);
  both.pool = &pool;
  EXPECT_THROW(ops.index_select(c.q, c.keys, c.w, c.reach, both), Error);
}

// Counts the indexer's calls; optionally breaks the fused op (its top-k reversed in each row).
class CountingOps : public ForwardingOps {
 public:
  explicit CountingOps(bool break_fused = false) : break_fused_(break_fused) {}
  mutable int64_t fused = 0, scores = 0;
  Tensor<float> index_scores(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& w,
                             const std::vector<int64_t>& reach) const override {
    ++scores;
    return ForwardingOps::index_scores(q, keys, w, reach);
  }
  IndexSelection index_select(const Tensor<float>& q, const CacheRows& keys, const Tensor<float>& w,
                              const std::vector<int64_t>& reach, const IndexSelectSpec& spec) const override {
    ++fused;
    IndexSelection s = Ops::index_select(q, keys, w, reach, spec);
    if (break_fused_) {
      for (int64_t t = 0; t < s.topk.dim(0); ++t) {
        for (int64_t i = 0; i < s.topk.dim(1) / 2; ++i) std::swap(s.topk.at(t, i), s.topk.at(t, s.topk.dim(1) - 1 - i));
      }
    }
    return s;
  }

 private:
  bool break_fused_;
};

model::Model oracle_on(const Ops& ops) {
  const test::OracleModel& o = test::oracle_model();
  return model::Model(o.config, checkpoint::ModelWeights::load(test::kOracleDir + "weights.safetensors", o.config),
                      o.token_map, ops);
}

// A candidate pool as the source publishes it: whole blocks of 8, few of them, so that most groups
// of 16 keys hold no pool byte (the groups index_scores_in_pool does not score); one row empty.
Tensor<uint8_t> block_pool(int64_t T, int64_t n, std::mt19937_64& rng) {
  Tensor<uint8_t> m({T, n}, "pool");
  std::bernoulli_distribution keep(0.08);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b * 8 < n; ++b) {
      if (t == 1 || !keep(rng)) continue;  // row 1: nothing in the pool
      for (int64_t j = b * 8; j < std::min<int64_t>(n, b * 8 + 8); ++j) m.at(t, j) = 1;
    }
  }
  return m;
}

// The reference scores a layer inside the pool only where the pool is set (reference_ops'
// index_select): the same scores as index_scores then mask_scores, bit for bit, and so the same top-k.
TEST(IndexSelect, InsideThePoolOnlyThePoolsKeysAreScoredWithTheSameBits) {
  std::mt19937_64 rng(test::seed_for("index_select/pool"));
  const Ops& ops = reference_ops();
  int64_t skipped_groups = 0, scored = 0;
  for (int levels : {0, 1}) {
    for (const auto& [T, heads, dim, n] : std::vector<std::array<int64_t, 4>>{{4, 8, 64, 301}, {3, 32, 128, 2000}}) {
      const Case c = make_case(T, heads, dim, n, levels, rng);
      const Tensor<float> keys = read_all_entries(c.keys);
      for (const Tensor<uint8_t>& pool : {block_pool(T, n, rng), random_pool(T, n, rng)}) {
        Tensor<float> masked = index_scores(c.q, keys, c.w, c.reach);
        apply_score_mask(masked, pool);
        const Tensor<float> sparse = index_scores_in_pool(c.q, keys, c.w, c.reach, pool);
        ASSERT_EQ(sparse.shape(), masked.shape());
        for (int64_t i = 0; i < masked.numel(); ++i) {
          ASSERT_EQ(std::memcmp(&sparse.data()[static_cast<size_t>(i)], &masked.data()[static_cast<size_t>(i)], 4), 0)
              << "levels " << levels << " n " << n << " element " << i;
          scored += std::isfinite(masked.data()[static_cast<size_t>(i)]) ? 1 : 0;
        }
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t g = 0; g * 16 < c.reach[static_cast<size_t>(t)]; ++g) {
            bool any = false;
            for (int64_t j = g * 16; j < std::min<int64_t>(n, g * 16 + 16); ++j) any = any || pool.at(t, j) != 0;
            skipped_groups += any ? 0 : 1;
          }
        }
        for (int k : {4, 64}) {
          IndexSelectSpec inside;
          inside.index_topk = k;
          inside.pool = &pool;
          expect_same(ops.index_select(c.q, c.keys, c.w, c.reach, inside).topk, ops.index_topk(masked, c.reach, k),
                      "pool top-k, n " + std::to_string(n));
        }
      }
    }
  }
  EXPECT_GT(scored, 0) << "no finite score: the cases test nothing";
  EXPECT_GT(skipped_groups, 100) << "the block pools must leave whole groups of 16 keys unscored";
  const Case c = make_case(2, 8, 64, 40, 0, rng);
  EXPECT_THROW(index_scores_in_pool(c.q, read_all_entries(c.keys), c.w, c.reach, Tensor<uint8_t>({2, 39}, "pool")),
               Error);
}

TEST(IndexSelect, TheModelFusesExactlyWhenIndexScoresAreNotCaptured) {
  const std::vector<int64_t> tokens = test::oracle_tokens(0, 60);
  CountingOps none_ops, hooked_ops, skipping_ops, broken_ops(/*break_fused=*/true);
  const model::Model none = oracle_on(none_ops), broken = oracle_on(broken_ops);
  model::Model hooked = oracle_on(hooked_ops), skipping = oracle_on(skipping_ops);
  int64_t shown_scores = 0;
  model::ForwardHooks all;
  all.tensor = [&shown_scores](model::Component what, int, Tensor<float>&) {
    if (what == model::Component::kIndexScores) ++shown_scores;
  };
  hooked.set_hooks(all);
  model::ForwardHooks skip = all;
  skip.skipped = {model::Component::kIndexScores};
  skipping.set_hooks(skip);

  model::ModelState sn = none.new_state(), sh = hooked.new_state(), ss = skipping.new_state(), sb = broken.new_state();
  std::vector<model::StepRecord> rn, rh, rs, rb;
  rn.push_back(none.prefill(sn, tokens));
  rh.push_back(hooked.prefill(sh, tokens));
  rs.push_back(skipping.prefill(ss, tokens));
  rb.push_back(broken.prefill(sb, tokens));
  for (int64_t tok : {5, 17}) {
    rn.push_back(none.decode(sn, tok));
    rh.push_back(hooked.decode(sh, tok));
    rs.push_back(skipping.decode(ss, tok));
    rb.push_back(broken.decode(sb, tok));
  }
  ASSERT_GT(none_ops.fused, 0) << "the oracle steps ran no indexer";
  EXPECT_EQ(none_ops.fused, none_ops.scores) << "each fused call runs index_scores once (its default)";
  EXPECT_EQ(hooked_ops.fused, 0);
  EXPECT_EQ(hooked_ops.scores, none_ops.scores);
  EXPECT_EQ(shown_scores, hooked_ops.scores);
  EXPECT_EQ(skipping_ops.fused, none_ops.fused);
  bool broken_differs = false;
  for (size_t i = 0; i < rn.size(); ++i) {
    EXPECT_EQ(rn[i].logits, rh[i].logits) << "step " << i;
    EXPECT_EQ(rn[i].logits, rs[i].logits) << "step " << i;
    ASSERT_EQ(rn[i].topk.size(), rh[i].topk.size());
    ASSERT_FALSE(rn[i].topk.empty());
    for (const auto& [layer, t] : rn[i].topk) {
      EXPECT_EQ(t.data(), rh[i].topk.at(layer).data()) << "step " << i << " layer " << layer;
      EXPECT_EQ(t.data(), rs[i].topk.at(layer).data()) << "step " << i << " layer " << layer;
      broken_differs = broken_differs || t.data() != rb[i].topk.at(layer).data();
    }
    ASSERT_EQ(rn[i].candidates.size(), rh[i].candidates.size());
    for (const auto& [layer, m] : rn[i].candidates) {
      EXPECT_EQ(m.data(), rh[i].candidates.at(layer).data()) << "step " << i << " layer " << layer;
      EXPECT_EQ(m.data(), rs[i].candidates.at(layer).data()) << "step " << i << " layer " << layer;
    }
  }
  EXPECT_TRUE(broken_differs) << "the fused op's top-k is not the one the model uses";
}

}  // namespace
}  // namespace dsv41::reference::seam
