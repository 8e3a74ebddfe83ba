// index_select_by_rows (reference/ops/indexer_select.cc, the reference backend's index_select)
// against the composition it replaces, bit for bit: index_scores (or index_scores_in_pool), then
// select_candidate_blocks for the candidate source, then select_index_topk. The three kinds of index
// layer (candidate source, inside the pool, neither), both score paths (the integer path and the
// double path, and Di 600, which the integer path does not take), tiles of 1, 3, 8 rows and the
// default, 1 and 3 threads, prefill reaches from 0 and decode reaches, and inputs with many equal
// scores (duplicated keys and zero weights), where the tie rule decides the selection.
//
// rapidcheck prints its seed when a property fails; replay with
//   RC_PARAMS="seed=<n>" ./index_select_rows_test --gtest_filter='IndexSelectRowsProperty.*'
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/indexer.h"
#include "reference/ops/numerics.h"
#include "tests/support/error_of.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

const float kE2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

enum class Kind { kPlain, kSource, kInPool };

struct Case {
  int64_t t = 0, heads = 0, d = 0, n = 0;
  int ratio = 1;  // reach = compressed_reach of the step ending at position N x ratio (rows of reach 0 at ratio > 1)
  Kind kind = Kind::kPlain;
  int topk = 0, blocks = 0, block_size = 0;
  bool ties = false;  // duplicated keys and zero weights: many equal scores
};

struct Inputs {
  Tensor<float> q, keys, w;  // [T, Hi, Di] FP4-QDQ, [N, Di] FP4-QDQ, [T, Hi] bf16
  std::vector<int64_t> reach;
  Tensor<uint8_t> pool;  // [T, N] for kInPool
};

void fp4_row(std::mt19937_64& rng, float* x, int64_t d) {
  const int base = static_cast<int>(rng() % 9) - 6;
  for (int64_t b = 0; b < d; b += 32) {
    const int e = base + static_cast<int>(rng() % 4);
    for (int64_t i = b; i < std::min<int64_t>(d, b + 32); ++i) {
      x[i] = std::ldexp(kE2m1[rng() % 8], e) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
    }
  }
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.q = Tensor<float>({c.t, c.heads, c.d}, "q");
  in.keys = Tensor<float>({c.n, c.d}, "keys");
  in.w = Tensor<float>({c.t, c.heads}, "w");
  for (int64_t t = 0; t < c.t; ++t) {
    for (int64_t h = 0; h < c.heads; ++h) {
      fp4_row(rng, in.q.row(t, h), c.d);
      const bool zero = c.ties && rng() % 3 == 0;
      in.w.at(t, h) = zero ? 0.0f
                           : formats::round_to_bf16(std::ldexp(static_cast<float>(1 + rng() % 255), -8) *
                                                    ((rng() % 4) == 0 ? -1.0f : 1.0f));
    }
  }
  for (int64_t j = 0; j < c.n; ++j) {
    if (c.ties && j > 0 && rng() % 2 == 0) {  // a copy of an earlier key: equal scores
      const int64_t from = static_cast<int64_t>(rng() % static_cast<uint64_t>(j));
      std::copy(in.keys.row(from), in.keys.row(from) + c.d, in.keys.row(j));
    } else {
      fp4_row(rng, in.keys.row(j), c.d);
    }
  }
  in.reach = compressed_reach(c.n * c.ratio - c.t, c.t, c.ratio);  // the last row reaches N
  if (c.kind == Kind::kInPool) {
    in.pool = Tensor<uint8_t>({c.t, c.n}, "pool");
    for (int64_t t = 0; t < c.t; ++t) {
      for (int64_t j = 0; j < c.n; ++j) in.pool.at(t, j) = (j / 8 + t) % 3 != 0 ? 1 : 0;
    }
  }
  return in;
}

IndexSelectSpec spec_of(const Case& c, const Inputs& in) {
  IndexSelectSpec spec;
  spec.index_topk = c.topk;
  if (c.kind == Kind::kSource) {
    spec.candidate_topk_blocks = c.blocks;
    spec.candidate_block_size = c.block_size;
  }
  if (c.kind == Kind::kInPool) spec.pool = &in.pool;
  return spec;
}

// The composition Ops::index_select documents, on the full [T, N] score tensor.
IndexSelection composition(const Case& c, const Inputs& in, IndexScoresPath path) {
  IndexSelection out;
  Tensor<float> scores = c.kind == Kind::kInPool ? index_scores_in_pool(in.q, in.keys, in.w, in.reach, in.pool, path)
                                                 : index_scores(in.q, in.keys, in.w, in.reach, path);
  if (c.kind == Kind::kSource) {
    out.candidates = select_candidate_blocks(scores, in.reach, c.blocks, c.block_size, /*owner_layer=*/-1).mask;
  }
  out.topk = select_index_topk(scores, in.reach, c.topk, /*offset=*/0, /*owner_layer=*/-1, /*ratio=*/1).idxs;
  return out;
}

// Whether index_select_by_rows gives the composition's outputs for every tile and 1 and 3 threads;
// the selection is checked to be non-trivial first.
::testing::AssertionResult rows_match(const Case& c, uint64_t seed, IndexScoresPath path) {
  const Inputs in = make_inputs(c, seed);
  set_reference_threads(1);
  const IndexSelection want = composition(c, in, path);
  int64_t picked = 0;
  for (const int32_t v : want.topk.data()) picked += v >= 0;
  if (picked == 0) return ::testing::AssertionFailure() << "the composition picked nothing";
  if (c.kind == Kind::kSource) {
    const auto& m = want.candidates.data();
    if (std::count(m.begin(), m.end(), uint8_t{1}) == 0 || std::count(m.begin(), m.end(), uint8_t{0}) == 0) {
      return ::testing::AssertionFailure() << "the candidate mask is all one value";
    }
  }
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (const int threads : {1, 3}) {
    set_reference_threads(threads);
    for (const int64_t tile : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{8}}) {
      IndexScoresTally tally;
      const IndexSelection got = index_select_by_rows(in.q, in.keys, in.w, in.reach, spec_of(c, in), path, tile, &tally);
      const std::string where = "threads " + std::to_string(threads) + ", tile " + std::to_string(tile);
      if (got.topk.shape() != want.topk.shape() || got.topk.data() != want.topk.data()) {
        result = ::testing::AssertionFailure() << where << ": the top-k differs";
        break;
      }
      if (c.kind == Kind::kSource) {
        if (got.candidates.shape() != want.candidates.shape() || got.candidates.data() != want.candidates.data()) {
          result = ::testing::AssertionFailure() << where << ": the candidate mask differs";
          break;
        }
      } else if (got.candidates.rank() != 0) {
        result = ::testing::AssertionFailure() << where << ": a candidate mask from a layer that is not the source";
        break;
      }
      const bool integer = path == IndexScoresPath::kInteger && c.d <= 512;
      if (integer ? tally.integer_groups == 0 : tally.integer_groups != 0) {
        result = ::testing::AssertionFailure() << where << ": integer groups " << tally.integer_groups;
        break;
      }
    }
  }
  set_reference_threads(0);
  return result;
}

TEST(IndexSelectRows, EachKindOfLayerIsTheComposition) {
  for (const Kind kind : {Kind::kPlain, Kind::kSource, Kind::kInPool}) {
    for (const bool ties : {false, true}) {
      Case c;
      c.t = 13, c.heads = 4, c.d = 64, c.n = 150, c.ratio = 1;
      c.kind = kind, c.topk = 20, c.blocks = 4, c.block_size = 8, c.ties = ties;
      const uint64_t seed = test::seed_for("index_select_rows/kind=" + std::to_string(static_cast<int>(kind)) +
                                           "/ties=" + std::to_string(ties));
      EXPECT_TRUE(rows_match(c, seed, IndexScoresPath::kInteger)) << "kind " << static_cast<int>(kind) << " ties " << ties;
    }
  }
}

TEST(IndexSelectRows, TheDoublePathAndAWideHeadAreTheComposition) {
  Case c;
  c.t = 9, c.heads = 3, c.d = 40, c.n = 77, c.ratio = 4;
  c.kind = Kind::kSource, c.topk = 16, c.blocks = 3, c.block_size = 8, c.ties = true;
  EXPECT_TRUE(rows_match(c, test::seed_for("index_select_rows/double"), IndexScoresPath::kDouble));
  c.d = 600;  // past the integer path: the double path on both sides
  c.kind = Kind::kInPool;
  EXPECT_TRUE(rows_match(c, test::seed_for("index_select_rows/d600"), IndexScoresPath::kInteger));
}

TEST(IndexSelectRows, DecodeRowsAndShortCaches) {
  Case c;  // a decode step: 2 rows, top-k wider than the cache
  c.t = 2, c.heads = 8, c.d = 32, c.n = 37, c.ratio = 1;
  c.kind = Kind::kPlain, c.topk = 64;
  EXPECT_TRUE(rows_match(c, test::seed_for("index_select_rows/decode"), IndexScoresPath::kInteger));
  c.kind = Kind::kSource, c.blocks = 2, c.block_size = 16;  // more blocks wanted than reached
  EXPECT_TRUE(rows_match(c, test::seed_for("index_select_rows/decode_source"), IndexScoresPath::kInteger));
}

TEST(IndexSelectRows, BadInputIsNamed) {
  Case c;
  c.t = 4, c.heads = 2, c.d = 32, c.n = 20, c.kind = Kind::kInPool, c.topk = 4;
  const Inputs in = make_inputs(c, test::seed_for("index_select_rows/errors"));
  IndexSelectSpec spec = spec_of(c, in);
  spec.candidate_topk_blocks = 2, spec.candidate_block_size = 4;  // source and in the pool
  EXPECT_NE(test::error_of([&] { index_select_by_rows(in.q, in.keys, in.w, in.reach, spec); }).find("not both"),
            std::string::npos);
  const Tensor<uint8_t> short_pool({c.t, c.n - 1}, "pool");
  spec = spec_of(c, in);
  spec.pool = &short_pool;
  EXPECT_NE(test::error_of([&] { index_select_by_rows(in.q, in.keys, in.w, in.reach, spec); }).find("the pool [4, 19]"),
            std::string::npos);
  std::vector<int64_t> reach = in.reach;
  reach.back() = c.n - 1;
  EXPECT_NE(test::error_of([&] { index_select_by_rows(in.q, in.keys, in.w, reach, spec_of(c, in)); })
                .find("the last query reaches 19"),
            std::string::npos);
  reach.back() = c.n + 1;
  EXPECT_NE(test::error_of([&] { index_select_by_rows(in.q, in.keys, in.w, reach, spec_of(c, in)); })
                .find("reach 21 of query row 3 outside [0, 20]"),
            std::string::npos);
}

RC_GTEST_PROP(IndexSelectRowsProperty, AnyShapeIsTheComposition, ()) {
  Case c;
  c.t = *rc::gen::inRange<int64_t>(1, 20);
  c.heads = *rc::gen::inRange<int64_t>(1, 6);
  c.d = *rc::gen::element<int64_t>(16, 32, 33, 64);
  c.ratio = *rc::gen::element(1, 4);
  c.n = *rc::gen::inRange<int64_t>((c.t + c.ratio - 1) / c.ratio, 120);  // the step starts at position >= 0
  c.kind = *rc::gen::element(Kind::kPlain, Kind::kSource, Kind::kInPool);
  c.topk = *rc::gen::inRange(1, 40);
  c.block_size = *rc::gen::element(4, 8, 16);
  c.blocks = *rc::gen::inRange(1, 6);
  c.ties = *rc::gen::arbitrary<bool>();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const Inputs in = make_inputs(c, seed);
  set_reference_threads(*rc::gen::inRange(1, 4));
  const IndexSelection want = composition(c, in, IndexScoresPath::kInteger);
  const int64_t tile = *rc::gen::inRange<int64_t>(0, c.t + 2);
  const IndexSelection got = index_select_by_rows(in.q, in.keys, in.w, in.reach, spec_of(c, in),
                                                  IndexScoresPath::kInteger, tile);
  set_reference_threads(0);
  RC_ASSERT(got.topk.shape() == want.topk.shape());
  RC_ASSERT(got.topk.data() == want.topk.data());
  RC_ASSERT(got.candidates.shape() == want.candidates.shape());
  RC_ASSERT(got.candidates.data() == want.candidates.data());
}

}  // namespace
}  // namespace dsv41::reference
