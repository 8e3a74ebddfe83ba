// tests/support/runner_fixture.h
//
// What the scenario-runner tests share: the backends' resources on the tiny oracle model (its
// config, weights and Engram map), and the check that a comparison rests on real evidence (items
// compared, no NaN metric, logits compared on values with a top-2 margin).
//
// Example:
//   const Comparison c = run_scenario(s, test::oracle_resources(), options).comparisons.at(0);
//   test::expect_real_evidence(c);
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "reports/report.h"
#include "scenarios/runner/backend.h"
#include "tests/support/oracle_model.h"

namespace dsv41::test {

inline const scenarios::runner::BackendResources& oracle_resources() {
  static const scenarios::runner::BackendResources r = [] {
    const OracleModel& m = oracle_model();
    return scenarios::runner::BackendResources{
        m.config, reference::checkpoint::ModelWeights::load(kOracleDir + "weights.safetensors", m.config), m.token_map};
  }();
  return r;
}

inline void expect_real_evidence(const reports::Comparison& c) {
  ASSERT_GT(c.items_compared, 0);
  ASSERT_FALSE(c.rows.empty());
  bool nonzero_logit = false;
  for (const reports::MetricRow& r : c.rows) {
    ASSERT_FALSE(std::isnan(r.value)) << r.component << " " << r.metric << " at step " << r.step;
    nonzero_logit = nonzero_logit || (r.component == "logits" && r.metric == "margin_a" && r.value > 0);
  }
  EXPECT_TRUE(nonzero_logit) << "the logits were never compared on real values";
}

}  // namespace dsv41::test
