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

std::vector<int64_t> topk_lowest_index_scan(const float* scores, int64_t n, int64_t k) {
  DSV41_CHECK(n >= 0 && k >= 0 && k <= n, "top-k of ", k, " out of ", n, " values");
  const auto better = [scores](int64_t a, int64_t b) {  // as in topk_lowest_index
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  // heap: the k best of scores[0, i), the worst of them (by `better`) on top.
  std::vector<int64_t> heap;
  heap.reserve(static_cast<size_t>(k));
  const auto take = [&](int64_t i) {
    DSV41_CHECK(!std::isnan(scores[i]), "top-k input holds NaN at index ", i, " (of ", n, ")");
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (k > 0 && scores[i] > scores[heap.front()]) {
      // i is better than the worst kept one: a higher value (an equal value loses: i is a later index).
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  };
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(heap.size()) < k; ++i) take(i);
  // Once the heap is full, a run of 16 values none of which beats the worst kept one (and none NaN)
  // changes nothing: one vectorizable test skips it (most of a long row: -inf past the reach or
  // outside the pool, and values below the k-th best). Any other run goes value by value, as above.
  constexpr int64_t kRun = 16;
  for (; k > 0 && i + kRun <= n; i += kRun) {
    const float worst = scores[heap.front()];
    bool enters = false;
    for (int64_t j = 0; j < kRun; ++j) {
      const float x = scores[i + j];
      enters |= (x > worst) | (x != x);  // a NaN goes to take(), which names it
    }
    if (!enters) continue;
    for (int64_t j = 0; j < kRun; ++j) take(i + j);
  }
  for (; i < n; ++i) take(i);
  std::sort(heap.begin(), heap.end(), better);  // the selection order of topk_lowest_index
  return heap;
}

}  // namespace dsv41::reference
