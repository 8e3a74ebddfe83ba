// cuda/deferred_checks.cc
//
// The host side of the deferred checks (cuda/deferred_checks.h): the switch and the bookkeeping.
#include "cuda/deferred_checks.h"

#include <cstdlib>
#include <utility>

#include "base/env_switch.h"
#include "base/error.h"

namespace dsv41::gpu {

bool parse_defer_checks(const char* value) { return parse_switch("DSV41_CUDA_DEFER_CHECKS", value, false); }

bool defer_checks() {
  static const bool on = parse_defer_checks(std::getenv("DSV41_CUDA_DEFER_CHECKS"));
  return on;
}

PendingChecks::PendingChecks(int capacity) : capacity_(capacity) {
  DSV41_CHECK(capacity > 0, "PendingChecks: capacity ", capacity);
  what_.reserve(static_cast<size_t>(capacity));
}

int PendingChecks::add(std::string what) {
  DSV41_CHECK(!full(), "PendingChecks: all ", capacity_, " slots pending (resolve first); adding '", what, "'");
  what_.push_back(std::move(what));
  return pending() - 1;
}

void PendingChecks::resolve(const int* flags, int n) {
  std::vector<std::string> what = std::move(what_);
  what_.clear();
  DSV41_CHECK(n == static_cast<int>(what.size()), "PendingChecks: ", n, " flags for ", what.size(), " pending checks");
  int set = 0, first = -1;
  for (int i = 0; i < n; ++i) {
    if (flags[i] == 0) continue;
    if (first < 0) first = i;
    ++set;
  }
  if (first < 0) return;
  DSV41_FAIL(what[static_cast<size_t>(first)], " (found by a deferred check",
             set > 1 ? detail::concat("; ", set - 1, " later check", set > 2 ? "s" : "", " of the same span failed too")
                     : std::string(),
             "; DSV41_CUDA_DEFER_CHECKS=0 gives the reference's exact error)");
}

}  // namespace dsv41::gpu
