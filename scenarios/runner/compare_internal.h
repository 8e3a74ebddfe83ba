// scenarios/runner/compare_internal.h
//
// Internal to the step comparison (scenarios/runner/compare.h): the rows of one step with the
// tolerance each gets (Rows; the choice is compare_tolerance.cc's), and the pieces the item
// comparisons (compare.cc) and the caches' (compare_caches.cc) share.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reference/ops/config.h"
#include "reports/report.h"
#include "scenarios/judge/order_variant.h"
#include "scenarios/runner/compare.h"

namespace dsv41::scenarios::runner::compare_detail {

// Rows of one step, with the tolerance each gets under the pair's expectation.
class Rows {
 public:
  Rows(const CompareContext& ctx, StepComparison& out, int64_t position)
      : ctx_(ctx), out_(out), position_(position) {}

  // Adds a row. `exact` is the bitexact tolerance of this metric (none: not asserted under
  // bitexact); under tolerance the rules decide, then an order-variant pair's derived judgment;
  // `always` holds for every checked pair.
  void add(int layer, const std::string& component, const std::string& metric, double value,
           std::optional<reports::Tolerance> exact, std::optional<reports::Tolerance> always = std::nullopt,
           const std::string& detail = "");

  // Under "tolerance", an output that no rule covers is an error (never a silent pass); an
  // order-variant pair's derived judgment covers every output (bounded, exact, or measured
  // where no bound is derivable).
  void begin_item() { covered_ = false; }
  void end_item(int layer, const std::string& component, bool needs_rule) const;

  reports::Tolerance stated_exact(bool higher, double bound) const;
  const CompareContext& ctx() const { return ctx_; }

 private:
  std::optional<reports::Tolerance> tolerance_of(int layer, const std::string& component, const std::string& metric,
                                                 const std::optional<reports::Tolerance>& exact,
                                                 const std::optional<reports::Tolerance>& always);
  std::optional<reports::Tolerance> derived_of(int layer, const std::string& component, const std::string& metric,
                                               const std::optional<reports::Tolerance>& exact);

  const CompareContext& ctx_;
  StepComparison& out_;
  int64_t position_;
  bool covered_ = false;
  std::vector<reference::LayerInfo> schedule_;                     // free-running chains: the config's
  std::map<std::pair<std::string, int>, judge::Forcing> chains_;  // free-running: (component, layer) -> its chain
};

// The last `rows` rows of x (decoder replay runs the layers after the candidate source on a tail).
template <typename T>
reference::Tensor<T> tail_rows(const reference::Tensor<T>& x, int64_t rows) {
  const int64_t width = x.numel() / std::max<int64_t>(1, x.dim(0));
  std::vector<int64_t> shape = x.shape();
  shape[0] = rows;
  std::vector<T> data(x.data().end() - rows * width, x.data().end());
  return reference::Tensor<T>(shape, std::move(data), x.name());
}

template <typename T>
bool align(reference::Tensor<T>& a, const reference::Tensor<T>& b) {
  if (a.shape() == b.shape() || a.rank() == 0 || b.rank() != a.rank() || b.dim(0) >= a.dim(0)) return false;
  for (int d = 1; d < a.rank(); ++d) {
    if (a.dim(d) != b.dim(d)) return false;
  }
  a = tail_rows(a, b.dim(0));
  return true;
}

// The caches after the step: presence, format, valid entries, bytes, decoded values (compare_caches.cc).
void compare_caches(const StepCapture& a, const StepCapture& b, Rows& rows, StepComparison& out);

}  // namespace dsv41::scenarios::runner::compare_detail
