#include "scenarios/runner/verdict.h"

#include "scenarios/runner/backend.h"

namespace dsv41::scenarios::runner {

judge::Expectation default_expectation(const Side& a, const Side& b, const Scenario& s, std::string* why) {
  const bool resumes = [&] {
    for (const Event& e : s.events) {
      if (e.kind == Event::kResume) return true;
    }
    return false;
  }();
  const auto exact_backend = [](const Side& x) { return backend_claim(x.backend) == Claim::kBitExact; };
  const auto exact_path = [&](const Side& x) {
    return !resumes || x.path == CachePath::kCold || x.path == CachePath::kFull || x.path == CachePath::kAlone;
  };
  const bool same_path = a.path == b.path && a.decoder_rows == b.decoder_rows;
  if (exact_backend(a) && exact_backend(b) && same_path) {
    *why = "both backends claim the reference's bits and take the same cache path: the same computation";
    return judge::Expectation::kBitExact;
  }
  if (exact_backend(a) && exact_backend(b) && exact_path(a) && exact_path(b)) {
    *why = "both backends claim the reference's bits and no path replays (docs/sessions.md: chunking, full resume "
           "and separate sessions are exact)";
    return judge::Expectation::kBitExact;
  }
  const auto order_variant = [](const Side& x) { return backend_claim(x.backend) == Claim::kOrderVariant; };
  const auto approximate = [](const Side& x) { return backend_claim(x.backend) == Claim::kApproximate; };
  if ((order_variant(a) || order_variant(b)) && !approximate(a) && !approximate(b) && exact_path(a) && exact_path(b)) {
    *why = "a backend claims order-variant results (the reference's math in its own summation order): every component "
           "within its derived bound (scenarios/judge/derived_bounds.h, docs/scenarios.md \"Order-variant pairs\")";
    return judge::Expectation::kTolerance;
  }
  *why = approximate(a) || approximate(b)
             ? "a backend is approximate by design (ref-bf16kv: precision ablation)"
             : "bounded replay (global / decoder path) is approximate by design (docs/replay-divergence.md)";
  return judge::Expectation::kMeasured;
}

}  // namespace dsv41::scenarios::runner
