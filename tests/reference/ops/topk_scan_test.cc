// The indexer's selections over [T, N] rows (reference/ops/indexer.cc: candidate_block_scores,
// select_candidate_blocks, select_index_topk, which take topk_lowest_index_scan since session 20)
// against their previous form, written out here as the specification: topk_lowest_index (the
// partial sort over an [n] index array) and the block max taken element by element. Random rows
// with many ties (a few values, -0 and +0, +-inf), whole -inf rows, reaches cutting rows, block
// sizes that do not divide N, and 1 and 3 threads: the same indices, the same masks, the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "reference/ops/indexer.h"
#include "reference/ops/numerics.h"
#include "reference/ops/topk.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A value from a small set, so rows hold many ties: -0 and +0 are a tie too.
float tied_value(std::mt19937_64& rng) {
  static const float kValues[] = {-kInf, -2.5f, -0.0f, 0.0f, 0.5f, 0.5f, 1.0f, 3.0f, kInf};
  return kValues[std::uniform_int_distribution<int>(0, 8)(rng)];
}

// [rows, n] scores as index_scores leaves them: -inf past each row's reach; some rows all -inf.
Tensor<float> random_scores(std::mt19937_64& rng, int64_t rows, int64_t n, std::vector<int64_t>& reach) {
  Tensor<float> s({rows, n}, "scores", -kInf);
  reach.assign(static_cast<size_t>(rows), 0);
  for (int64_t t = 0; t < rows; ++t) {
    // Reaches ascend as compressed_reach's do; the last row reaches every key.
    reach[static_cast<size_t>(t)] = t + 1 == rows ? n : std::uniform_int_distribution<int64_t>(0, n)(rng);
    if (t > 0) reach[static_cast<size_t>(t)] = std::max(reach[static_cast<size_t>(t)], reach[static_cast<size_t>(t - 1)]);
    const bool all_inf = std::uniform_int_distribution<int>(0, 5)(rng) == 0;
    for (int64_t j = 0; j < reach[static_cast<size_t>(t)]; ++j) s.at(t, j) = all_inf ? -kInf : tied_value(rng);
  }
  return s;
}

// The previous candidate_block_scores: the block max element by element over the whole row.
Tensor<float> block_scores_spec(const Tensor<float>& scores, const std::vector<int64_t>& reach, int block_size) {
  const int64_t rows = scores.dim(0), n = scores.dim(1), blocks = (n + block_size - 1) / block_size;
  Tensor<float> out({rows, blocks}, "spec", -kInf);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < n; ++j) out.at(t, j / block_size) = std::max(out.at(t, j / block_size), scores.at(t, j));
    const int64_t r = reach[static_cast<size_t>(t)];
    if (r > 0) out.at(t, (r - 1) / block_size) = kInf;
  }
  return out;
}

// The previous select_candidate_blocks mask.
Tensor<uint8_t> candidates_spec(const Tensor<float>& scores, const std::vector<int64_t>& reach, int topk_blocks,
                                int block_size) {
  const Tensor<float> block = block_scores_spec(scores, reach, block_size);
  const int64_t rows = scores.dim(0), n = scores.dim(1), blocks = block.dim(1);
  Tensor<uint8_t> mask({rows, n}, "spec", 0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b : topk_lowest_index(block.row(t), blocks, std::min<int64_t>(topk_blocks, blocks))) {
      if (!(block.at(t, b) > -kInf)) continue;
      for (int64_t j = b * block_size; j < std::min<int64_t>(n, (b + 1) * block_size); ++j) mask.at(t, j) = 1;
    }
  }
  return mask;
}

// The previous select_index_topk idxs.
Tensor<int32_t> topk_spec(const Tensor<float>& scores, const std::vector<int64_t>& reach, int index_topk,
                          int64_t offset) {
  const int64_t rows = scores.dim(0), n = scores.dim(1), k = std::min<int64_t>(index_topk, n);
  Tensor<int32_t> idxs({rows, k}, "spec");
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<int64_t> pick = topk_lowest_index(scores.row(t), n, k);
    std::sort(pick.begin(), pick.end());
    for (int64_t i = 0; i < k; ++i) {
      const int64_t pos = pick[static_cast<size_t>(i)];
      idxs.at(t, i) = pos < reach[static_cast<size_t>(t)] ? static_cast<int32_t>(pos + offset) : -1;
    }
  }
  return idxs;
}

// Bit equality of two float tensors (-0 differs from +0).
bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data().data(), b.data().data(), sizeof(float) * static_cast<size_t>(a.numel())) == 0;
}

class ThreadCount {  // sets the reference's threads for a scope
 public:
  explicit ThreadCount(int n) { set_reference_threads(n); }
  ~ThreadCount() { set_reference_threads(0); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
};

TEST(TopkScan, AgreesWithTopkLowestIndexOnTiedRows) {
  std::mt19937_64 rng(test::seed_for("TopkScan/tied rows"));
  int64_t nonempty = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 200)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(0, n)(rng);
    std::vector<float> row(static_cast<size_t>(n));
    const bool all_inf = trial % 7 == 0;
    for (float& v : row) v = all_inf ? -kInf : tied_value(rng);
    const std::vector<int64_t> scan = topk_lowest_index_scan(row.data(), n, k);
    ASSERT_EQ(scan, topk_lowest_index(row.data(), n, k)) << "trial " << trial << " n " << n << " k " << k;
    nonempty += scan.empty() ? 0 : 1;
  }
  EXPECT_GT(nonempty, 1000);  // the property was tested on real selections
}

TEST(TopkScan, RefusesNanAndBadK) {
  const float row[] = {1.0f, std::nanf(""), 2.0f};
  EXPECT_THROW(topk_lowest_index_scan(row, 3, 1), Error);
  EXPECT_THROW(topk_lowest_index_scan(row, 1, 2), Error);
  EXPECT_THROW(topk_lowest_index_scan(row, 1, -1), Error);
  EXPECT_TRUE(topk_lowest_index_scan(row, 0, 0).empty());
  // A NaN far into a long row, where runs of 16 values that cannot enter are skipped: still found and
  // named (index 70: inside a run of -inf that would otherwise be skipped; k 0 checks every value too).
  std::vector<float> long_row(100, -kInf);
  long_row[3] = 1.0f;
  long_row[70] = std::nanf("");
  for (const int64_t k : {0, 1, 2}) {
    try {
      topk_lowest_index_scan(long_row.data(), 100, k);
      ADD_FAILURE() << "k " << k << ": NaN accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NaN at index 70 (of 100)"), std::string::npos) << e.what();
    }
  }
}

TEST(CandidateBlocksScan, SelectionsMatchThePreviousPathForOneAndThreeThreads) {
  std::mt19937_64 rng(test::seed_for("CandidateBlocksScan/selections"));
  int64_t picked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t rows = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int block_size = std::uniform_int_distribution<int>(1, 40)(rng);
    const int topk_blocks = std::uniform_int_distribution<int>(1, 12)(rng);
    const int index_topk = std::uniform_int_distribution<int>(1, 80)(rng);
    std::vector<int64_t> reach;
    const Tensor<float> s = random_scores(rng, rows, n, reach);
    const Tensor<float> block_want = block_scores_spec(s, reach, block_size);
    const Tensor<uint8_t> mask_want = candidates_spec(s, reach, topk_blocks, block_size);
    const Tensor<int32_t> topk_want = topk_spec(s, reach, index_topk, /*offset=*/5);
    for (int threads : {1, 3}) {
      const ThreadCount scope(threads);
      const std::string what = "trial " + std::to_string(trial) + " threads " + std::to_string(threads);
      EXPECT_TRUE(same_bits(candidate_block_scores(s, reach, block_size), block_want)) << what;
      const CandidateMask got = select_candidate_blocks(s, reach, topk_blocks, block_size, /*owner_layer=*/3);
      EXPECT_EQ(got.mask.data(), mask_want.data()) << what;
      const PublishedTopk top = select_index_topk(s, reach, index_topk, /*offset=*/5, /*owner_layer=*/3, /*ratio=*/1);
      EXPECT_EQ(top.idxs.shape(), topk_want.shape()) << what;
      EXPECT_EQ(top.idxs.data(), topk_want.data()) << what;
    }
    picked += std::count(mask_want.data().begin(), mask_want.data().end(), uint8_t{1});
  }
  EXPECT_GT(picked, 0);  // some blocks were selected: the masks are not all zero
}

}  // namespace
}  // namespace dsv41::reference
