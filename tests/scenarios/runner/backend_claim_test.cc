// tests/scenarios/runner/backend_claim_test.cc: the backend names and their claims (no device needed):
// cuda-exact claims the reference's bits, cuda (the production path) order-variant results, and a
// pair's default expectation follows (ref vs cuda-exact bitexact, ref vs cuda tolerance, ref vs
// ref-bf16kv measured). In a build without CUDA both CUDA names are refused with the reason (then
// the claim checks skip).
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/verdict.h"

namespace dsv41::test {
namespace {

using scenarios::runner::backend_claim;
using scenarios::runner::Claim;
using scenarios::runner::parse_side;

// True when this build has the CUDA path (the runner validates the CUDA names); else each CUDA
// name must be refused with the reason, naming itself.
bool cuda_built() {
  bool built = true;
  for (const char* name : {"cuda", "cuda-exact"}) {
    try {
      scenarios::runner::validate_backend_name(name);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA path"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      built = false;
    }
  }
  return built;
}

TEST(BackendClaim, CudaExactIsBitExactAndCudaOrderVariant) {
  EXPECT_EQ(backend_claim("ref"), Claim::kBitExact);
  EXPECT_EQ(backend_claim("ref-bf16kv"), Claim::kApproximate);
  if (!cuda_built()) GTEST_SKIP() << "no CUDA path in this build (both names refused, checked)";
  EXPECT_EQ(backend_claim("cuda-exact"), Claim::kBitExact);
  EXPECT_EQ(backend_claim("cuda"), Claim::kOrderVariant);
}

TEST(BackendClaim, DefaultExpectationFollowsTheClaim) {
  scenarios::runner::Scenario s;  // no events: no resume, every path exact
  std::string why;
  EXPECT_EQ(default_expectation(parse_side("ref"), parse_side("ref-bf16kv"), s, &why),
            scenarios::judge::Expectation::kMeasured) << why;
  if (!cuda_built()) GTEST_SKIP() << "no CUDA path in this build";
  EXPECT_EQ(default_expectation(parse_side("ref"), parse_side("cuda-exact"), s, &why),
            scenarios::judge::Expectation::kBitExact) << why;
  EXPECT_EQ(default_expectation(parse_side("ref"), parse_side("cuda"), s, &why),
            scenarios::judge::Expectation::kTolerance) << why;
  EXPECT_NE(why.find("order-variant"), std::string::npos) << why;
  EXPECT_EQ(default_expectation(parse_side("cuda-exact"), parse_side("cuda"), s, &why),
            scenarios::judge::Expectation::kTolerance) << why;
}

TEST(BackendClaim, UnknownNamesListTheKnownOnes) {
  try {
    scenarios::runner::validate_backend_name("cuda-fast");
    ADD_FAILURE() << "cuda-fast accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda-exact"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41::test
