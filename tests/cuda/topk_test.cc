// tests/cuda/topk_test.cc: CudaOps::index_topk, candidate_blocks and mask_scores (cuda/topk.cu) vs
// the reference ops, bit for bit: one and several rows, no columns, one column, odd widths, k
// above and below the width, exact ties (scores on a coarse grid, -0 next to +0: the lower index
// wins), -inf beyond each row's reach, reach 0 (no pinned block), block sizes 1, 4 and 64; a NaN
// score makes index_topk raise the reference's error.
#include <limits>

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

}  // namespace
}  // namespace dsv41::test
