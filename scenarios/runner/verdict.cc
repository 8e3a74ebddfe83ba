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
  // An order-variant backend (cuda) computes the reference's function in its own order: the pair is
  // held to the tolerance rules (scenarios/runner/compare.cc default_tolerance_rules; derived bounds
  // docs/conform.md), where the pair would be bit-exact had both sides claimed the reference's bits.
  const auto faithful = [](const Side& x) { return backend_claim(x.backend) != Claim::kApproximate; };
  if (faithful(a) && faithful(b) && (same_path || (exact_path(a) && exact_path(b)))) {
    *why = "a backend claims order-variant results (the reference's function in its own summation order: tensor "
           "cores, fused kernels) on an exact path: tolerance (docs/cuda.md \"Production ops\")";
    return judge::Expectation::kTolerance;
  }
  *why = !faithful(a) || !faithful(b)
             ? "a backend is approximate by design (ref-bf16kv: precision ablation)"
             : "bounded replay (global / decoder path) is approximate by design (docs/replay-divergence.md)";
  return judge::Expectation::kMeasured;
}

}  // namespace dsv41::scenarios::runner
