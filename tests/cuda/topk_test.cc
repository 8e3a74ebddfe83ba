// tests/cuda/topk_test.cc: CudaOps::index_topk, candidate_blocks and mask_scores (cuda/topk.cu) vs
// the reference ops, bit for bit: one and several rows, no columns, one column, odd widths, k
// above and below the width, exact ties (scores on a coarse grid, -0 next to +0: the lower index
// wins), -inf beyond each row's reach, reach 0 (no pinned block), block sizes 1, 4 and 64; a NaN
// score makes index_topk raise the reference's error. The hard rows (cuda/topk.cu's radix select,
// chunk levels and tiles): bf16 values in a tiny range (ties everywhere), all-equal rows, +-0,
// rows mostly -inf, reach < n, widths not a multiple of 8, 524288 positions, k >= n, NaN; the
// launchers index_topk_async (chunk sizes forced, a candidate mask fused) and candidate_pool_topk.
#include <algorithm>
#include <limits>

#include "cuda/kernels.h"

#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Scores {
  reference::Tensor<float> s;
  std::vector<int64_t> reach;
};

// reach non-decreasing from 0 to n; -inf beyond it; `coarse`: values on a grid of 0.5 (ties).
Scores make_scores(int64_t rows, int64_t n, bool coarse) {
  Scores r{reference::Tensor<float>({rows, n}, "index_score"), std::vector<int64_t>(static_cast<size_t>(rows))};
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : r.s.data()) v = coarse ? std::round(d(rng()) * 2.0f) / 2.0f : formats::round_to_bf16(d(rng()));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t reach = rows == 1 ? n : (t * n) / (rows - 1);
    r.reach[static_cast<size_t>(t)] = reach;
    for (int64_t j = reach; j < n; ++j) r.s.at(t, j) = -kInf;
  }
  if (coarse && n > 3) {
    r.s.at(rows - 1, 2) = -0.0f;
    r.s.at(rows - 1, 3) = 0.0f;
  }
  return r;
}

TEST(IndexTopk, EqualsReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t n : {0, 1, 5, 33, 130}) {
    for (int64_t rows : {1, 4}) {
      for (bool coarse : {false, true}) {
        const Scores sc = make_scores(rows, n, coarse);
        for (int k : {1, 4, 64, 200}) {
          EXPECT_TRUE(same_bits(ref_ops().index_topk(sc.s, sc.reach, k),
                                cuda_ops().index_topk(cuda_ops().upload(sc.s), sc.reach, k)))
              << "n " << n << " rows " << rows << " k " << k << (coarse ? " ties" : "");
        }
      }
    }
  }
  Scores bad = make_scores(2, 9, false);
  bad.s.at(1, 4) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(cuda_ops().index_topk(bad.s, bad.reach, 3), Error);
  EXPECT_THROW(cuda_ops().index_topk(bad.s, {0, 8}, 3), Error);  // the last reach must be n
}

TEST(CandidateBlocks, EqualsReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t n : {0, 1, 5, 33, 130}) {
    for (int64_t rows : {1, 4}) {
      for (bool coarse : {false, true}) {
        const Scores sc = make_scores(rows, n, coarse);
        for (int bs : {1, 4, 64}) {
          for (int tb : {1, 2, 8}) {
            EXPECT_TRUE(same_bits(ref_ops().candidate_blocks(sc.s, sc.reach, tb, bs),
                                  cuda_ops().candidate_blocks(sc.s, sc.reach, tb, bs)))
                << "n " << n << " rows " << rows << " block " << bs << " top " << tb;
          }
        }
      }
    }
  }
}

TEST(MaskScores, EqualsReference) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t n : {0, 1, 33}) {
    const Scores sc = make_scores(3, n, false);
    reference::Tensor<uint8_t> mask({3, n}, "candidates");
    std::bernoulli_distribution keep(0.5);
    for (uint8_t& m : mask.data()) m = keep(rng()) ? 1 : 0;
    reference::Tensor<float> want = sc.s;
    ref_ops().mask_scores(want, mask);
    reference::Tensor<float> got = cuda_ops().upload(sc.s);
    cuda_ops().mask_scores(got, mask);
    EXPECT_TRUE(same_bits(want, std::move(got))) << "n " << n;
  }
  reference::Tensor<float> got = cuda_ops().upload(make_scores(2, 4, false).s);
  EXPECT_THROW(cuda_ops().mask_scores(got, reference::Tensor<uint8_t>({2, 3}, "m")), Error);
}

// kSampleTrap: tiny-range values, 2.0 at the positions the sampling filter of cuda/topk.cu reads
// (j = i * n / 512): its threshold then lets fewer than k through, and the kernel must fall back.
enum class Pattern { kTinyRange, kAllEqual, kZeros, kMostlyNegInf, kSampleTrap };

// rows x n hard scores: reach rises to n on the last row (rows > 1: earlier rows reach less),
// -inf beyond the reach; the pattern fills the reachable part.
Scores hard_scores(int64_t rows, int64_t n, Pattern p) {
  Scores r{reference::Tensor<float>({rows, n}, "index_score"), std::vector<int64_t>(static_cast<size_t>(rows))};
  std::uniform_real_distribution<float> u(1.0f, 1.03f);  // about 8 bf16 values
  std::uniform_int_distribution<int> pick(0, 9);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t reach = t == rows - 1 ? n : (n * (t + 1)) / (rows + 1);
    r.reach[static_cast<size_t>(t)] = reach;
    for (int64_t j = 0; j < n; ++j) {
      float v = -kInf;
      if (j < reach) {
        switch (p) {
          case Pattern::kTinyRange:
          case Pattern::kSampleTrap: v = formats::round_to_bf16(u(rng())) * (pick(rng()) == 0 ? -1.0f : 1.0f); break;
          case Pattern::kAllEqual: v = 0.5f; break;
          case Pattern::kZeros:  // -0 and +0 mostly, a few small values
            v = pick(rng()) < 3 ? -0.0f : (pick(rng()) < 8 ? 0.0f : formats::round_to_bf16(u(rng()) - 1.0f));
            break;
          case Pattern::kMostlyNegInf: v = pick(rng()) == 0 ? formats::round_to_bf16(u(rng())) : -kInf; break;
        }
      }
      r.s.at(t, j) = v;
    }
    for (int64_t i = 0; p == Pattern::kSampleTrap && i < 512; ++i) {
      if (i * n / 512 < reach) r.s.at(t, i * n / 512) = 2.0f;
    }
  }
  return r;
}

// Not empty and not all -1 (a row that reaches something picks something).
::testing::AssertionResult picks_something(const reference::Tensor<int32_t>& got) {
  if (got.numel() == 0) return ::testing::AssertionFailure() << "empty output";
  if (std::all_of(got.data().begin(), got.data().end(), [](int32_t v) { return v == -1; })) {
    return ::testing::AssertionFailure() << "every pick is -1";
  }
  return ::testing::AssertionSuccess();
}

// gpu::index_topk_async on uploaded scores (mask: nullptr = none); *nan = the flag.
reference::Tensor<int32_t> gpu_topk(const Scores& sc, int64_t k, const reference::Tensor<uint8_t>* mask,
                                    int64_t chunk, bool* nan) {
  const int64_t rows = sc.s.dim(0), n = sc.s.dim(1);
  gpu::DeviceBuffer<float> s(static_cast<size_t>(rows * n));
  gpu::DeviceBuffer<int64_t> reach(static_cast<size_t>(rows));
  gpu::DeviceBuffer<uint8_t> m(mask ? static_cast<size_t>(rows * n) : 1);
  gpu::DeviceBuffer<int32_t> out(static_cast<size_t>(rows * k));
  gpu::DeviceBuffer<int> flag(1);
  s.upload(sc.s.data());
  reach.upload(sc.reach);
  if (mask) m.upload(mask->data());
  out.poison(0x7F);
  flag.poison(0);
  gpu::index_topk_async(s.get(), mask ? m.get() : nullptr, reach.get(), rows, n, k, out.get(), flag.get(), chunk);
  *nan = flag.download()[0] != 0;
  return reference::Tensor<int32_t>({rows, k}, out.download(), "indexer_topk");
}

TEST(IndexTopk, HardRows) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (Pattern p : {Pattern::kTinyRange, Pattern::kAllEqual, Pattern::kZeros, Pattern::kMostlyNegInf,
                    Pattern::kSampleTrap}) {
    for (int64_t n : {7, 130, 1001, 8193, 16384, 40000}) {
      const Scores sc = hard_scores(3, n, p);
      for (int k : {1, 37, 512, 5000, static_cast<int>(n), static_cast<int>(n) + 5}) {
        const auto want = ref_ops().index_topk(sc.s, sc.reach, k);
        const auto got = cuda_ops().download(cuda_ops().index_topk(cuda_ops().upload(sc.s), sc.reach, k));
        ASSERT_TRUE(picks_something(got)) << "pattern " << static_cast<int>(p) << " n " << n << " k " << k;
        EXPECT_TRUE(same_bits(want, got)) << "pattern " << static_cast<int>(p) << " n " << n << " k " << k;
      }
    }
  }
}

TEST(IndexTopk, ForcedChunksAndTiles) {  // every level / tile path, whatever the automatic choice
  DSV41_SKIP_WITHOUT_DEVICE();
  for (Pattern p : {Pattern::kTinyRange, Pattern::kZeros, Pattern::kSampleTrap}) {
    const Scores sc = hard_scores(2, 40000, p);
    for (int64_t k : {int64_t{3}, int64_t{300}, int64_t{5000}}) {
      const auto want = ref_ops().index_topk(sc.s, sc.reach, static_cast<int>(k));
      for (int64_t chunk : {int64_t{0}, int64_t{1024}, int64_t{2048}, int64_t{8192}, int64_t{40000}}) {
        bool nan = true;
        const auto got = gpu_topk(sc, k, nullptr, chunk, &nan);
        ASSERT_TRUE(picks_something(got));
        EXPECT_FALSE(nan);
        EXPECT_TRUE(same_bits(want, got)) << "k " << k << " chunk " << chunk;
      }
    }
  }
}

TEST(IndexTopk, LongRows) {  // 524288 positions: a million-token context at ratio 2
  DSV41_SKIP_WITHOUT_DEVICE();
  const int64_t n = 524288;
  for (Pattern p : {Pattern::kTinyRange, Pattern::kMostlyNegInf}) {
    const Scores sc = hard_scores(2, n, p);
    const auto want = ref_ops().index_topk(sc.s, sc.reach, 512);
    const auto got = cuda_ops().download(cuda_ops().index_topk(cuda_ops().upload(sc.s), sc.reach, 512));
    ASSERT_TRUE(picks_something(got));
    EXPECT_TRUE(same_bits(want, got)) << "pattern " << static_cast<int>(p);
  }
  Scores bad = hard_scores(2, n, Pattern::kTinyRange);
  bad.s.at(1, n - 1) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(cuda_ops().index_topk(bad.s, bad.reach, 512), Error);
}

TEST(IndexTopk, MaskFused) {  // apply_candidate_mask + index_topk in one launcher
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t n : {130, 16384, 20000}) {
    Scores sc = hard_scores(3, n, Pattern::kTinyRange);
    const Scores src = make_scores(3, n, false);
    const auto mask = ref_ops().candidate_blocks(src.s, sc.reach, 64, 8);
    // A NaN outside the candidates is masked to -inf (no error); one inside is flagged.
    int64_t off = 0;
    while (off < sc.reach[0] && mask.at(0, off) != 0) ++off;
    if (off < sc.reach[0]) sc.s.at(0, off) = std::numeric_limits<float>::quiet_NaN();
    reference::Tensor<float> masked = sc.s;
    ref_ops().mask_scores(masked, mask);
    for (int64_t k : {int64_t{1}, std::min<int64_t>(512, n), n}) {
      const auto want = ref_ops().index_topk(masked, sc.reach, static_cast<int>(k));
      bool nan = true;
      const auto got = gpu_topk(sc, k, &mask, 0, &nan);
      ASSERT_TRUE(picks_something(got));
      EXPECT_FALSE(nan) << "n " << n;
      EXPECT_TRUE(same_bits(want, got)) << "n " << n << " k " << k;
    }
    int64_t in = 0;
    while (mask.at(2, in) == 0) ++in;
    sc.s.at(2, in) = std::numeric_limits<float>::quiet_NaN();
    bool nan = false;
    gpu_topk(sc, 512 < n ? 512 : n, &mask, 0, &nan);
    EXPECT_TRUE(nan) << "n " << n;
  }
}

TEST(CandidateBlocks, HardRows) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (Pattern p : {Pattern::kTinyRange, Pattern::kAllEqual, Pattern::kZeros, Pattern::kMostlyNegInf}) {
    for (int64_t n : {13, 16383, 262144}) {
      Scores sc = hard_scores(2, n, p);
      sc.s.at(0, 0) = std::numeric_limits<float>::quiet_NaN();  // skipped by the block max, as std::max does
      for (int tb : {1, 100, 2048}) {
        const auto want = ref_ops().candidate_blocks(sc.s, sc.reach, tb, 8);
        const auto got = cuda_ops().download(cuda_ops().candidate_blocks(sc.s, sc.reach, tb, 8));
        ASSERT_TRUE(std::any_of(got.data().begin(), got.data().end(), [](uint8_t v) { return v != 0; }));
        EXPECT_TRUE(same_bits(want, got)) << "pattern " << static_cast<int>(p) << " n " << n << " top " << tb;
      }
    }
  }
}

TEST(CandidatePoolTopk, EqualsReference) {  // the candidate source's mask and its own top-k at once
  DSV41_SKIP_WITHOUT_DEVICE();
  for (Pattern p : {Pattern::kTinyRange, Pattern::kAllEqual, Pattern::kZeros, Pattern::kMostlyNegInf,
                    Pattern::kSampleTrap}) {
    for (int64_t n : {5, 130, 16000, 16384, 20000}) {
      const Scores sc = hard_scores(3, n, p);
      for (int64_t tb : {int64_t{1}, int64_t{100}, int64_t{2048}}) {
        const int64_t k = std::min<int64_t>(512, n), rows = 3;
        gpu::DeviceBuffer<float> s(static_cast<size_t>(rows * n));
        gpu::DeviceBuffer<int64_t> reach(static_cast<size_t>(rows));
        gpu::DeviceBuffer<uint8_t> mask(static_cast<size_t>(rows * n));
        gpu::DeviceBuffer<int32_t> out(static_cast<size_t>(rows * k));
        gpu::DeviceBuffer<int> flag(1);
        s.upload(sc.s.data());
        reach.upload(sc.reach);
        mask.poison(0x55);
        flag.poison(0);
        gpu::candidate_pool_topk(s.get(), reach.get(), rows, n, k, tb, 8, mask.get(), out.get(), flag.get());
        const reference::Tensor<int32_t> got({rows, k}, out.download(), "indexer_topk");
        const reference::Tensor<uint8_t> got_mask({rows, n}, mask.download(), "candidates");
        ASSERT_TRUE(picks_something(got));
        EXPECT_EQ(flag.download()[0], 0);
        const std::string what = "pattern " + std::to_string(static_cast<int>(p)) + " n " + std::to_string(n) +
                                 " top " + std::to_string(tb);
        EXPECT_TRUE(same_bits(ref_ops().index_topk(sc.s, sc.reach, static_cast<int>(k)), got)) << what;
        EXPECT_TRUE(same_bits(ref_ops().candidate_blocks(sc.s, sc.reach, static_cast<int>(tb), 8), got_mask)) << what;
      }
    }
  }
}

}  // namespace
}  // namespace dsv41::test
