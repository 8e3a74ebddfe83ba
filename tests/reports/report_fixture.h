// tests/reports/report_fixture.h
//
// A hand-built RunReport for the report tests (every field set, every verdict present) and a
// field-by-field comparison of two reports. Values come from the printed data seed
// (tests/support/seed.h; DSV41_SEED overrides).
//
//   sample_report()   two scenarios: "cold_prefill" (pass: one bit-exact comparison with checked
//                     and unchecked rows) and "resume <&>\"ü" (fail: a failing tolerance
//                     comparison with a first divergence and five stored tensors, one per
//                     logical dtype; a measured one; an inconclusive one with no rows). Its
//                     verdicts are consistent (scenario = worst comparison, run = roll-up).
//   expect_same_report(a, b, tensors)   EXPECTs every field equal, acceptance rows included
//                     (doubles bit for bit, so NaN equals NaN); tensors only when asked
//                     (read_report skips them by default).
//   temp_dir()        a scratch directory of the running test, created empty.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reports/report.h"
#include "tests/support/seed.h"

namespace dsv41::reports::test {

inline std::string temp_dir() {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "/dsv41_report_" + std::to_string(::getpid()) + "_" +
                          t->test_suite_name() + "_" + t->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The name of the failing scenario: XML specials and a non-ASCII letter (UTF-8).
inline const std::string kFailScenario = "resume <&>\"\xC3\xBC";

inline MetricRow row(int64_t step, int layer, const std::string& component, const std::string& metric, double value,
                     std::optional<Tolerance> tol) {
  MetricRow r;
  r.step = step;
  r.session = step >= 2 ? 1 : 0;
  r.position = 16 * step;
  r.layer = layer;
  r.component = component;
  r.metric = metric;
  r.value = value;
  r.tolerance = tol;
  if (tol) {
    const bool within = tol->higher_is_better ? value >= tol->bound : value <= tol->bound;
    r.verdict = within ? Verdict::kPass : Verdict::kFail;
  } else {
    r.verdict = Verdict::kMeasured;
  }
  return r;
}

inline RunReport sample_report() {
  std::mt19937_64 rng(dsv41::test::seed_for("reports/sample_report"));
  std::uniform_real_distribution<double> small(1e-9, 9e-7);  // within an nmse bound of 1e-6
  std::uniform_real_distribution<double> unit(-2.0, 2.0);
  const Tolerance exact{0, false, "stated", "same backend, exact cache path: bit-exact (docs/sessions.md)"};
  const Tolerance nmse{1e-6, false, "measured", "docs/agreement.md: 2.2e-7 measured, 4x margin"};
  const Tolerance jaccard{0.99, true, "analytic", ""};

  RunReport r;
  r.meta.config_name = "tiny";
  r.meta.config_hash = "5f1c0ffee0ddba11";
  r.meta.config_json = "{\"dim\": 256, \"n_layers\": 8}";
  r.meta.weights = "generated:seed=7";
  r.meta.weights_sha256 = "";
  r.meta.seeds = {{"weights", 7}, {"tokens", 0xFFFFFFFFFFFFFFF0ull}};
  r.meta.sides = {"ref@cold", "ref@global", "ref-bf16kv@global"};
  r.meta.tool_version = "dsv41 0.1.0";
  r.meta.git_commit = "1b2e6122fc24";
  r.meta.command_line = "dsv41 run --scenario 'cold_prefill' -o \"r.h5\"";
  r.meta.created_utc = "2026-11-29T12:00:00Z";
  r.meta.host = "test-host";
  r.meta.threads = 2;
  r.meta.seconds = 1.25;

  ScenarioResult pass;
  pass.name = "cold_prefill";
  pass.kind = "cold_prefill";
  pass.description = "one prefill vs the same prompt in chunks";
  pass.source = "builtin:cold_prefill";
  pass.scenario_json = "{\"prompt_len\": 37, \"chunk\": 16}";
  pass.seed = 11;
  pass.steps = {{0, 0, "prefill", 0, 16, {"chunk_edge"}}, {1, 0, "prefill", 16, 21, {"chunk_edge", "window_edge"}},
                {2, 0, "decode", 37, 1, {}}};
  {
    Comparison c;
    c.side_a = "ref@cold";
    c.side_b = "ref@global";
    c.mode = "free-running";
    c.expectation = "bitexact";
    c.expectation_origin = "stated: docs/sessions.md (chunked prefill is bit-identical)";
    c.verdict = Verdict::kPass;
    c.steps_compared = 3;
    c.items_compared = 6;
    c.notes = {"caches compared as packed bytes"};
    for (int64_t s = 0; s < 3; ++s) {
      for (int layer : {0, 1}) c.rows.push_back(row(s, layer, "attn_out", "mismatch_frac", 0.0, exact));
      c.rows.push_back(row(s, -1, "logits", "max_abs", std::fabs(unit(rng)), std::nullopt));
    }
    c.rows.push_back(row(2, -1, "logits", "kl", std::numeric_limits<double>::quiet_NaN(), std::nullopt));
    c.seconds = 0.5;
    pass.comparisons.push_back(c);
  }
  pass.verdict = Verdict::kPass;

  ScenarioResult fail;
  fail.name = kFailScenario;
  fail.kind = "resume";
  fail.description = "save at 41, resume global-only";
  fail.source = "scenarios/resume.json";
  fail.scenario_json = "{\"save_at\": 41}";
  fail.seed = 0xFFFFFFFFFFFFFFFFull;
  fail.steps = {{0, 0, "prefill", 0, 41, {}}, {1, 1, "resume", 41, 3, {"resume"}}, {2, 1, "decode", 44, 1, {}}};
  {
    Comparison c;  // fails at step 1 layer 3: the nmse beyond 1e-6
    c.side_a = "ref@cold";
    c.side_b = "ref-bf16kv@global";
    c.mode = "teacher-forced";
    c.expectation = "tolerance";
    c.expectation_origin = "measured: docs/replay-divergence.md";
    c.steps_compared = 3;
    c.items_compared = 12;
    c.notes = {"window rows differ by design <after replay>"};
    for (int64_t s = 0; s < 3; ++s) {
      for (int layer = 0; layer < 4; ++layer) {
        const double v = (s == 1 && layer == 3) ? 3.5e-5 : (s == 2 && layer == 3 ? 2.0e-6 : small(rng));
        c.rows.push_back(row(s, layer, "attn_out", "nmse", v, nmse));
      }
      c.rows.push_back(row(s, 2, "topk", "jaccard_min", s == 1 ? 0.995 : 1.0, jaccard));
    }
    Divergence d;
    d.step = 1;
    d.session = 1;
    d.position = 16;
    d.layer = 3;
    d.component = "attn_out";
    d.metric = "nmse";
    d.value = 3.5e-5;
    d.tolerance = nmse;
    d.detail = "first mismatch at [3, 1, 17] byte 0: a=0.125 b=0.1259";
    d.rerun = "dsv41 run --scenario 'resume' --sides ref@cold,ref-bf16kv@global --steps 1 --layers 3";
    c.first_divergence = d;
    c.verdict = Verdict::kFail;
    StoredTensor bf16{1, 3, "attn_out", "a", "bf16", {2, 3}, {}};
    for (int i = 0; i < 6; ++i) bf16.values.push_back(std::ldexp(static_cast<double>(static_cast<int>(rng() % 255) - 127), -7));
    bf16.values[5] = -std::numeric_limits<double>::infinity();
    StoredTensor fp32{1, 3, "attn_out", "b", "fp32", {3, 2}, {}};
    for (int i = 0; i < 6; ++i) fp32.values.push_back(static_cast<double>(static_cast<float>(unit(rng))));
    StoredTensor i32{1, 2, "topk", "a", "int32", {4}, {-1, 0, 7, 2147483647}};
    StoredTensor u8{1, 2, "cache.compressed_kv", "b", "uint8", {1, 3}, {0, 128, 255}};
    StoredTensor i64{1, -1, "positions", "a", "int64", {2}, {-5, 4096}};
    // 20000 fp32 values: above the default compression threshold as well.
    StoredTensor big{1, -1, "logits", "a", "fp32", {20000}, {}};
    for (int i = 0; i < 20000; ++i) big.values.push_back(static_cast<double>(static_cast<float>(unit(rng))));
    c.tensors = {bf16, fp32, i32, u8, i64, big};
    c.seconds = 2.0;
    fail.comparisons.push_back(c);
  }
  {
    Comparison c;  // approximate by design: recorded only
    c.side_a = "ref@cold";
    c.side_b = "ref@global";
    c.mode = "free-running";
    c.expectation = "measured";
    c.expectation_origin = "stated: global-only resume is approximate by design";
    c.verdict = Verdict::kMeasured;
    c.steps_compared = 2;
    c.items_compared = 2;
    for (int64_t s = 1; s < 3; ++s) c.rows.push_back(row(s, -1, "logits", "max_abs", std::fabs(unit(rng)), std::nullopt));
    c.seconds = 0.25;
    fail.comparisons.push_back(c);
  }
  {
    Comparison c;  // nothing comparable: missing evidence
    c.side_a = "ref@global";
    c.side_b = "ref-bf16kv@global";
    c.mode = "free-running";
    c.expectation = "bitexact";
    c.expectation_origin = "stated";
    c.verdict = Verdict::kInconclusive;
    c.notes = {"caches not compared: the formats differ", "no component in common"};
    c.seconds = 0.125;
    fail.comparisons.push_back(c);
  }
  fail.verdict = Verdict::kFail;
  r.scenarios = {pass, fail};
  r.verdict = roll_up(r.scenarios);
  return r;
}

inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

inline void expect_same_tolerance(const Tolerance& a, const Tolerance& b) {
  EXPECT_TRUE(same_bits(a.bound, b.bound)) << a.bound << " vs " << b.bound;
  EXPECT_EQ(a.higher_is_better, b.higher_is_better);
  EXPECT_EQ(a.origin, b.origin);
  EXPECT_EQ(a.note, b.note);
}

inline void expect_same_report(const RunReport& a, const RunReport& b, bool tensors) {
  EXPECT_EQ(a.verdict, b.verdict);
  const RunMeta &ma = a.meta, &mb = b.meta;
  EXPECT_EQ(ma.config_name, mb.config_name);
  EXPECT_EQ(ma.config_hash, mb.config_hash);
  EXPECT_EQ(ma.config_json, mb.config_json);
  EXPECT_EQ(ma.weights, mb.weights);
  EXPECT_EQ(ma.weights_sha256, mb.weights_sha256);
  EXPECT_EQ(ma.seeds, mb.seeds);
  EXPECT_EQ(ma.sides, mb.sides);
  EXPECT_EQ(ma.tool_version, mb.tool_version);
  EXPECT_EQ(ma.git_commit, mb.git_commit);
  EXPECT_EQ(ma.command_line, mb.command_line);
  EXPECT_EQ(ma.created_utc, mb.created_utc);
  EXPECT_EQ(ma.host, mb.host);
  EXPECT_EQ(ma.threads, mb.threads);
  EXPECT_TRUE(same_bits(ma.seconds, mb.seconds));
  ASSERT_EQ(a.scenarios.size(), b.scenarios.size());
  for (size_t i = 0; i < a.scenarios.size(); ++i) {
    const ScenarioResult &sa = a.scenarios[i], &sb = b.scenarios[i];
    SCOPED_TRACE("scenario " + sa.name);
    EXPECT_EQ(sa.name, sb.name);
    EXPECT_EQ(sa.kind, sb.kind);
    EXPECT_EQ(sa.description, sb.description);
    EXPECT_EQ(sa.source, sb.source);
    EXPECT_EQ(sa.scenario_json, sb.scenario_json);
    EXPECT_EQ(sa.seed, sb.seed);
    EXPECT_EQ(sa.verdict, sb.verdict);
    EXPECT_EQ(sa.error, sb.error);
    ASSERT_EQ(sa.steps.size(), sb.steps.size());
    for (size_t k = 0; k < sa.steps.size(); ++k) {
      EXPECT_EQ(sa.steps[k].step, sb.steps[k].step);
      EXPECT_EQ(sa.steps[k].session, sb.steps[k].session);
      EXPECT_EQ(sa.steps[k].phase, sb.steps[k].phase);
      EXPECT_EQ(sa.steps[k].start_pos, sb.steps[k].start_pos);
      EXPECT_EQ(sa.steps[k].tokens, sb.steps[k].tokens);
      EXPECT_EQ(sa.steps[k].boundaries, sb.steps[k].boundaries);
    }
    ASSERT_EQ(sa.comparisons.size(), sb.comparisons.size());
    for (size_t c = 0; c < sa.comparisons.size(); ++c) {
      const Comparison &ca = sa.comparisons[c], &cb = sb.comparisons[c];
      SCOPED_TRACE("comparison " + std::to_string(c));
      EXPECT_EQ(ca.side_a, cb.side_a);
      EXPECT_EQ(ca.side_b, cb.side_b);
      EXPECT_EQ(ca.mode, cb.mode);
      EXPECT_EQ(ca.expectation, cb.expectation);
      EXPECT_EQ(ca.expectation_origin, cb.expectation_origin);
      EXPECT_EQ(ca.verdict, cb.verdict);
      EXPECT_EQ(ca.steps_compared, cb.steps_compared);
      EXPECT_EQ(ca.items_compared, cb.items_compared);
      EXPECT_EQ(ca.notes, cb.notes);
      EXPECT_TRUE(same_bits(ca.seconds, cb.seconds)) << ca.seconds << " vs " << cb.seconds;
      ASSERT_EQ(ca.first_divergence.has_value(), cb.first_divergence.has_value());
      if (ca.first_divergence) {
        const Divergence &da = *ca.first_divergence, &db = *cb.first_divergence;
        EXPECT_EQ(da.step, db.step);
        EXPECT_EQ(da.session, db.session);
        EXPECT_EQ(da.position, db.position);
        EXPECT_EQ(da.layer, db.layer);
        EXPECT_EQ(da.component, db.component);
        EXPECT_EQ(da.metric, db.metric);
        EXPECT_TRUE(same_bits(da.value, db.value));
        expect_same_tolerance(da.tolerance, db.tolerance);
        EXPECT_EQ(da.detail, db.detail);
        EXPECT_EQ(da.rerun, db.rerun);
      }
      ASSERT_EQ(ca.rows.size(), cb.rows.size());
      for (size_t k = 0; k < ca.rows.size(); ++k) {
        const MetricRow &ra = ca.rows[k], &rb = cb.rows[k];
        SCOPED_TRACE("row " + std::to_string(k));
        EXPECT_EQ(ra.step, rb.step);
        EXPECT_EQ(ra.session, rb.session);
        EXPECT_EQ(ra.position, rb.position);
        EXPECT_EQ(ra.layer, rb.layer);
        EXPECT_EQ(ra.component, rb.component);
        EXPECT_EQ(ra.metric, rb.metric);
        EXPECT_TRUE(same_bits(ra.value, rb.value)) << ra.value << " vs " << rb.value;
        ASSERT_EQ(ra.tolerance.has_value(), rb.tolerance.has_value());
        if (ra.tolerance) expect_same_tolerance(*ra.tolerance, *rb.tolerance);
        EXPECT_EQ(ra.verdict, rb.verdict);
      }
      ASSERT_EQ(ca.acceptance.size(), cb.acceptance.size());
      for (size_t k = 0; k < ca.acceptance.size(); ++k) {
        const AcceptanceRow &ra = ca.acceptance[k], &rb = cb.acceptance[k];
        SCOPED_TRACE("acceptance row " + std::to_string(k));
        EXPECT_EQ(ra.step, rb.step);
        EXPECT_EQ(ra.session, rb.session);
        EXPECT_EQ(ra.side, rb.side);
        EXPECT_EQ(ra.start_pos, rb.start_pos);
        EXPECT_EQ(ra.proposed, rb.proposed);
        EXPECT_EQ(ra.verified, rb.verified);
        EXPECT_EQ(ra.accepted, rb.accepted);
        EXPECT_EQ(ra.kept, rb.kept);
        EXPECT_EQ(ra.next_token, rb.next_token);
        EXPECT_EQ(ra.draft_index, rb.draft_index);
        EXPECT_EQ(ra.draft_token, rb.draft_token);
        EXPECT_TRUE(same_bits(ra.confidence, rb.confidence)) << ra.confidence << " vs " << rb.confidence;
        EXPECT_TRUE(same_bits(ra.predicted_survival, rb.predicted_survival))
            << ra.predicted_survival << " vs " << rb.predicted_survival;
        EXPECT_EQ(ra.realised, rb.realised);
        EXPECT_TRUE(same_bits(ra.accept_prob, rb.accept_prob)) << ra.accept_prob << " vs " << rb.accept_prob;
      }
      if (!tensors) continue;
      ASSERT_EQ(ca.tensors.size(), cb.tensors.size());
      for (size_t k = 0; k < ca.tensors.size(); ++k) {
        const StoredTensor &ta = ca.tensors[k], &tb = cb.tensors[k];
        SCOPED_TRACE("tensor " + std::to_string(k));
        EXPECT_EQ(ta.step, tb.step);
        EXPECT_EQ(ta.layer, tb.layer);
        EXPECT_EQ(ta.component, tb.component);
        EXPECT_EQ(ta.side, tb.side);
        EXPECT_EQ(ta.logical_dtype, tb.logical_dtype);
        EXPECT_EQ(ta.shape, tb.shape);
        ASSERT_EQ(ta.values.size(), tb.values.size());
        for (size_t v = 0; v < ta.values.size(); ++v) {
          EXPECT_TRUE(same_bits(ta.values[v], tb.values[v])) << "value " << v << ": " << ta.values[v] << " vs " << tb.values[v];
        }
      }
    }
  }
}

}  // namespace dsv41::reports::test
