// fuzz/fuzz_scenario.cc: scenarios::runner::parse_scenario on arbitrary bytes (a scenario file's text),
// then the token plan a runner derives from it (vocabulary 1024) when the plan is small.
#include "fuzz/fuzz_util.h"
#include "scenarios/runner/scenario.h"

namespace {

using dsv41::scenarios::runner::Scenario;
using dsv41::scenarios::runner::TokenSegment;

// An upper bound on the tokens plan_tokens would generate: every span expanded at every segment.
// Limits on scenario sizes are issue 14 deliverable 1 (another branch): until they exist, plans
// over 2^16 tokens are not built here, so the fuzzer does not spend its time allocating.
double plan_bound(const Scenario& s) {
  double spans = 0, segments = 0, direct = 0;
  const auto add = [&](const std::vector<TokenSegment>& segs, double& into) {
    for (const TokenSegment& g : segs) {
      into += static_cast<double>(g.ids.size()) + static_cast<double>(g.count);
      segments += 1;
    }
  };
  for (const auto& [name, segs] : s.spans) add(segs, spans);
  for (const auto& e : s.events) {
    add(e.segments, direct);
    direct += static_cast<double>(e.decode);
  }
  return direct + spans * (segments + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(dsv41::fuzz::view(data, size));
  dsv41::fuzz::accept([&] {
    const Scenario s = dsv41::scenarios::runner::parse_scenario(text, "fuzz.json");
    if (plan_bound(s) <= 65536) (void)dsv41::scenarios::runner::plan_tokens(s, 1024);
  });
  return 0;
}
