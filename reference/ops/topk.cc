#include "reference/ops/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace dsv41::reference {

std::vector<int64_t> topk_lowest_index(const float* scores, int64_t n, int64_t k) {
  DSV41_CHECK(n >= 0 && k >= 0 && k <= n, "top-k of ", k, " out of ", n, " values");
  for (int64_t i = 0; i < n; ++i) {
    DSV41_CHECK(!std::isnan(scores[i]), "top-k input holds NaN at index ", i, " (of ", n, ")");
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // A strict weak order without NaN: higher value first, lower index first among equal values.
  const auto better = [scores](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(static_cast<size_t>(k));
  return order;
}

}  // namespace dsv41::reference
