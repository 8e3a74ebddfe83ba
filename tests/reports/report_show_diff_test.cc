// `dsv41 report show` options (filters, --by, -q, 120 columns, measured pairs, errors counted
// once), report diffs (reports/report_diff.h) and the HTML page's text (reports/report_html.h),
// on reports built in memory (tests/reports/report_fixture.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "reports/report.h"
#include "reports/report_diff.h"
#include "reports/report_html.h"
#include "tests/reports/report_fixture.h"
#include "tests/support/error_of.h"

namespace dsv41::reports {
namespace {

using ::testing::HasSubstr;
using dsv41::test::error_of;
using test::kFailScenario;
using test::sample_report;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Lines are counted in characters (the fixture's scenario name holds a two-byte letter).
size_t columns(const std::string& line) {
  size_t n = 0;
  for (unsigned char ch : line) n += (ch & 0xC0) != 0x80;
  return n;
}

SummaryOptions with_filter(SummaryFilter f) {
  SummaryOptions o;
  o.filter = std::move(f);
  return o;
}

// The sample with long side names, so entries must wrap.
RunReport long_sides() {
  RunReport r = sample_report();
  for (ScenarioResult& s : r.scenarios) {
    for (Comparison& c : s.comparisons) c.side_b = "mutant:attn_out:L3:S1+an-extra-long-backend-name@global-only-resume";
  }
  return r;
}

TEST(ReportShowOptions, NoLineIsLongerThan120Columns) {
  for (const RunReport& r : {sample_report(), long_sides()}) {
    SummaryOptions o;
    o.by = "layer";
    const std::string text = format_summary(r, o);
    std::printf("%s", text.c_str());
    ASSERT_GT(lines_of(text).size(), 10u);
    for (const std::string& l : lines_of(text)) EXPECT_LE(columns(l), 120u) << l;
    // Details still there, on indented lines.
    EXPECT_TRUE(has(text, "\n               first mismatch at [3, 1, 17] byte 0: a=0.125 b=0.1259\n")) << text;
  }
}

TEST(ReportShowOptions, FiltersSelectComparisons) {
  const RunReport r = sample_report();
  const auto entries = [](const std::string& text) {  // the entries' first lines, in order
    std::vector<std::string> out;
    for (const std::string& l : lines_of(text)) {
      for (const std::string v : {"pass", "fail", "measured", "inconclusive", "error"}) {
        const std::string head = "  " + v + std::string(13 - v.size(), ' ');  // the verdict in 13 columns
        if (l.rfind(head, 0) == 0 && l.size() > head.size() && l[head.size()] != ' ') out.push_back(l);
      }
    }
    return out;
  };
  EXPECT_EQ(entries(format_summary(r)).size(), 4u);
  SummaryFilter f;
  f.scenario = "cold_prefill";
  std::string text = format_summary(r, with_filter(f));
  ASSERT_EQ(entries(text).size(), 1u) << text;
  EXPECT_THAT(entries(text)[0], HasSubstr("cold_prefill: ref@cold vs ref@global [free-running]"));
  EXPECT_TRUE(has(text, "filter: --scenario cold_prefill")) << text;
  EXPECT_TRUE(has(text, "\n1 scenarios: 0 error, 0 fail, 0 inconclusive, 0 measured, 1 pass\n1 results: ")) << text;

  f = {};
  f.verdicts = {Verdict::kFail};
  text = format_summary(r, with_filter(f));
  ASSERT_EQ(entries(text).size(), 1u) << text;
  EXPECT_THAT(entries(text)[0], HasSubstr("ref@cold vs ref-bf16kv@global [teacher-forced]"));
  f.verdicts = {Verdict::kInconclusive, Verdict::kMeasured};
  EXPECT_EQ(entries(format_summary(r, with_filter(f))).size(), 2u);

  f = {};
  f.mode = "teacher-forced";
  EXPECT_EQ(entries(format_summary(r, with_filter(f))).size(), 1u);
  f = {};
  f.pair = "ref@global,ref-bf16kv@global";  // both sides, in order
  text = format_summary(r, with_filter(f));
  ASSERT_EQ(entries(text).size(), 1u) << text;
  EXPECT_THAT(entries(text)[0], HasSubstr("inconclusive"));
  f.pair = "ref-bf16kv@global,ref@global";  // the other order is another pair
  EXPECT_THAT(error_of([&] { format_summary(r, with_filter(f)); }), HasSubstr("no comparison of the sides"));
  f.pair = "ref-bf16kv";  // one side, without its cache path: either side
  EXPECT_EQ(entries(format_summary(r, with_filter(f))).size(), 2u);
  f.pair = "ref,ref";  // backends without cache paths
  EXPECT_EQ(entries(format_summary(r, with_filter(f))).size(), 2u);

  // What the report lacks is named, with what it has.
  f = {};
  f.scenario = "no_such";
  EXPECT_THAT(error_of([&] { format_summary(r, with_filter(f)); }),
              AllOf(HasSubstr("no scenario 'no_such'"), HasSubstr("cold_prefill")));
}

TEST(ReportShowOptions, QuietPrintsOneLine) {
  SummaryOptions o;
  o.quiet = true;
  const std::string text = format_summary(sample_report(), o);
  EXPECT_EQ(lines_of(text).size(), 1u) << text;
  EXPECT_EQ(text, "dsv41 report: verdict fail (exit 1); 2 scenarios, 4 results: 0 error, 1 fail, 1 inconclusive, "
                  "1 measured, 1 pass\n");
}

TEST(ReportShowOptions, ProfileByLayerAndByStep) {
  const RunReport r = sample_report();
  const Comparison& c = r.scenarios[1].comparisons[0];
  const std::vector<std::string> by_layer = profile_lines(c, "layer", 120);
  ASSERT_EQ(by_layer.size(), 5u);  // the header, layers 0..3
  EXPECT_THAT(by_layer[0], HasSubstr("layer"));
  // Layer 3: 3 nmse rows, one failing (step 1, 3.5e-05 > 1e-06; step 2's 2e-06 fails too).
  EXPECT_THAT(by_layer[4], HasSubstr("3      3     2  3.5e-05 attn_out s1")) << by_layer[4];
  EXPECT_THAT(by_layer[4], HasSubstr("nmse 3.5e-05 / 1e-06 attn_out s1"));
  const std::vector<std::string> by_step = profile_lines(c, "step", 120);
  ASSERT_EQ(by_step.size(), 4u);  // steps 0..2
  EXPECT_THAT(by_step[2], HasSubstr("1      5     1  3.5e-05 attn_out L3")) << by_step[2];
  EXPECT_THAT(error_of([&] { profile_lines(c, "component", 120); }), HasSubstr("'component'"));
  SummaryOptions o;
  o.by = "step";
  const std::string text = format_summary(sample_report(), o);
  EXPECT_TRUE(has(text, "by step: " + kFailScenario + ": ref@cold vs ref-bf16kv@global [teacher-forced]")) << text;
}

TEST(ReportShowOptions, MeasuredPairsShowTheirWorstMeasuredMetrics) {
  RunReport r = sample_report();
  r.scenarios.resize(1);
  Comparison& c = r.scenarios[0].comparisons[0];
  c.rows.clear();
  c.expectation = "measured";
  for (int layer = 0; layer < 3; ++layer) {
    c.rows.push_back(test::row(1, layer, "attn_out", "nmse", 1e-4 * (layer + 1), std::nullopt));
    c.rows.push_back(test::row(1, layer, "attn_out", "bit_equal_frac", 0.5, std::nullopt));
  }
  c.rows.push_back(test::row(1, -1, "logits", "max_abs", 0.25, std::nullopt));  // not a relative metric
  c.verdict = Verdict::kMeasured;
  r.scenarios[0].verdict = Verdict::kMeasured;
  r.verdict = roll_up(r.scenarios);
  const std::string text = format_summary(r);
  std::printf("%s", text.c_str());
  EXPECT_TRUE(has(text, "worst checked metrics (0 shown; 0 checked, 0 exact passes not shown):\n  (none)\n")) << text;
  EXPECT_TRUE(has(text, "worst measured metrics, not asserted (2 shown of 2 that differ")) << text;
  // 1 - 0.5 before the largest nmse 3e-4; each at its worst place.
  const size_t frac = text.find("attn_out bit_equal_frac=0.5"), nmse = text.find("step 1 layer 2 component attn_out nmse=0.0003");
  ASSERT_NE(frac, std::string::npos) << text;
  ASSERT_NE(nmse, std::string::npos) << text;
  EXPECT_LT(frac, nmse);
  EXPECT_FALSE(has(text, "max_abs=0.25 (worst")) << text;
}

TEST(ReportShowOptions, AnErroredScenarioIsCountedOnce) {
  RunReport r = sample_report();
  // A scenario that failed before any comparison, and one whose only comparison erred.
  ScenarioResult before = r.scenarios[0];
  before.name = "broken_before";
  before.comparisons.clear();
  before.verdict = Verdict::kError;
  before.error = "scenario file: bad event";
  ScenarioResult during = r.scenarios[0];
  during.name = "broken_during";
  during.comparisons[0].verdict = Verdict::kError;
  during.comparisons[0].notes = {"error: the side failed"};
  during.comparisons[0].rows.clear();
  during.verdict = Verdict::kError;
  during.error = "a comparison errored";
  r.scenarios.push_back(before);
  r.scenarios.push_back(during);
  r.verdict = roll_up(r.scenarios);
  const std::string text = format_summary(r);
  std::printf("%s", text.c_str());
  EXPECT_TRUE(has(text, "\n4 scenarios: 2 error, 1 fail, 0 inconclusive, 0 measured, 1 pass\n6 results: 2 error,"))
      << text;
  EXPECT_TRUE(has(text, "broken_before: scenario scenario file: bad event")) << text;
  EXPECT_FALSE(has(text, "broken_during: scenario")) << text;  // its comparison's entry says it
  EXPECT_TRUE(has(text, "broken_during: ref@cold vs ref@global [free-running]")) << text;
}

// ---- report diff ----

ReportDiff diff(const RunReport& a, const RunReport& b) {
  DiffOptions o;
  o.name_a = "a.h5";
  o.name_b = "b.h5";
  const ReportDiff d = diff_reports(a, b, o);
  std::printf("%s", d.text.c_str());
  for (const std::string& l : lines_of(d.text)) EXPECT_LE(columns(l), 120u) << l;
  return d;
}

Comparison& failing_pair(RunReport& r) { return r.scenarios[1].comparisons[0]; }

TEST(ReportDiff, TheSameReportHasNoChange) {
  const ReportDiff d = diff(sample_report(), sample_report());
  EXPECT_FALSE(d.regressed);
  EXPECT_EQ(d.unchanged, 4u);
  EXPECT_EQ(d.new_failures + d.worse + d.missing + d.better + d.measured_changes, 0u);
  EXPECT_TRUE(has(d.text, "report diff: no checked item regressed (exit 0)")) << d.text;
}

TEST(ReportDiff, ANewFailureComesFirstAndRegresses) {
  const RunReport a = sample_report();
  RunReport b = sample_report();
  // cold_prefill's bit-exact pair now differs at step 1 layer 0; the failing pair fails further.
  Comparison& c = b.scenarios[0].comparisons[0];
  c.rows[3] = test::row(1, 0, "attn_out", "mismatch_frac", 0.25, c.rows[3].tolerance);
  c.verdict = Verdict::kFail;
  b.scenarios[0].verdict = Verdict::kFail;
  for (MetricRow& m : failing_pair(b).rows) {
    if (m.step == 1 && m.layer == 3) m.value = 7e-5;
  }
  b.verdict = roll_up(b.scenarios);
  const ReportDiff d = diff(a, b);
  EXPECT_TRUE(d.regressed);
  EXPECT_EQ(d.new_failures, 2u);  // the comparison and its item
  EXPECT_EQ(d.worse, 1u);
  const size_t nf = d.text.find("new failures (2):"), worse = d.text.find("worse (failing further");
  ASSERT_NE(nf, std::string::npos) << d.text;
  ASSERT_NE(worse, std::string::npos) << d.text;
  EXPECT_LT(nf, worse);
  // Grouped under their comparison: its verdict first, then its items.
  EXPECT_TRUE(has(d.text, "new failures (2):\n  cold_prefill #0: ref@cold vs ref@global [free-running]\n    pass -> fail"))
      << d.text;
  EXPECT_TRUE(has(d.text, "attn_out mismatch_frac (step 1 layer 0): 0 -> 0.25")) << d.text;
  EXPECT_TRUE(has(d.text, "attn_out nmse (step 1 layer 3): 3.5e-05 -> 7e-05")) << d.text;
  EXPECT_TRUE(has(d.text, "further beyond")) << d.text;
  EXPECT_TRUE(has(d.text, "report diff: regressed (exit 1)")) << d.text;
}

TEST(ReportDiff, AFixIsBetterAndMeasuredMovesDoNotRegress) {
  const RunReport a = sample_report();
  RunReport b = sample_report();
  for (MetricRow& m : failing_pair(b).rows) {
    if (m.metric == "nmse" && m.value > 1e-6) m = test::row(m.step, m.layer, m.component, m.metric, 5e-7, m.tolerance);
  }
  failing_pair(b).verdict = Verdict::kPass;
  failing_pair(b).first_divergence.reset();
  b.scenarios[1].comparisons[1].rows[0].value += 1.0;  // a measured max_abs moved
  b.scenarios[1].verdict = Verdict::kInconclusive;
  b.verdict = roll_up(b.scenarios);
  const ReportDiff d = diff(a, b);
  EXPECT_FALSE(d.regressed) << d.text;
  EXPECT_EQ(d.new_failures + d.worse + d.missing, 0u);
  EXPECT_GE(d.better, 2u);  // the comparison and its item
  EXPECT_EQ(d.measured_changes, 1u);
  EXPECT_TRUE(has(d.text, "fail -> pass")) << d.text;
  EXPECT_TRUE(has(d.text, "(worse, measured)")) << d.text;
}

TEST(ReportDiff, MissingEvidenceRegresses) {
  const RunReport a = sample_report();
  RunReport b = sample_report();
  b.scenarios.resize(1);
  b.verdict = roll_up(b.scenarios);
  ReportDiff d = diff(a, b);
  EXPECT_TRUE(d.regressed);
  EXPECT_EQ(d.missing, 1u);
  EXPECT_TRUE(has(d.text, "missing in b.h5 (1):\n  scenario " + kFailScenario + " (fail in a.h5)")) << d.text;
  // The other way: B has a scenario more, not passing: a new failure.
  d = diff(b, a);
  EXPECT_TRUE(d.regressed);
  EXPECT_TRUE(has(d.text, "new in a.h5") || has(d.text, "new in b.h5")) << d.text;
  // The same scenarios on other sides still match, with a note.
  RunReport c = sample_report();
  for (ScenarioResult& s : c.scenarios) {
    for (Comparison& x : s.comparisons) x.side_a = "cuda@" + x.side_a.substr(x.side_a.find('@') + 1);
  }
  d = diff(a, c);
  EXPECT_FALSE(d.regressed) << d.text;
  EXPECT_TRUE(has(d.text, "is cuda@cold vs ref@global [free-running] in b.h5")) << d.text;
}

// ---- the HTML page ----

TEST(ReportHtmlPage, IsOneSelfContainedPageWithTheDataEscaped) {
  if (!html_available()) GTEST_SKIP() << "built without Debian node-d3";
  const RunReport r = sample_report();
  const std::string page = html_page(r, {"sample.h5"});
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_TRUE(has(page, "\"format\":\"dsv41-report-html\"")) << page.substr(0, 2000);
  EXPECT_TRUE(has(page, html_library())) << html_library();
  EXPECT_THAT(html_library(), ::testing::StartsWith("d3 "));
  // No network: no src=, href= or url( pointing anywhere.
  for (const char* ref : {"src=\"http", "href=\"http", "<link ", "<script src", "url(http", "import("}) {
    EXPECT_FALSE(has(page, ref)) << ref;
  }
  // The data cannot end its <script> early: '<' in a string is \u003c, the name's other
  // specials are JSON-escaped, and non-finite values are words.
  const size_t data = page.find("<script type=\"application/json\" id=\"dsv41-data\">");
  ASSERT_NE(data, std::string::npos);
  const size_t end = page.find("</script>", data);
  const std::string json = page.substr(data, end - data);
  EXPECT_FALSE(has(json.substr(10), "<")) << "a raw '<' inside the data";
  EXPECT_TRUE(has(json, "resume \\u003c&>\\\"\xC3\xBC")) << "the scenario name, escaped";
  EXPECT_TRUE(has(json, "\"NaN\"")) << "the NaN KL of cold_prefill";
  EXPECT_TRUE(has(json, "\"detail\":\"first mismatch at [3, 1, 17] byte 0: a=0.125 b=0.1259\""));
  // Every float round-trips: the failing nmse as written.
  EXPECT_TRUE(has(json, "3.5e-05")) << "3.5e-05";
}

TEST(ReportHtmlPage, TheRerunCommandOfACell) {
  RunReport r = sample_report();
  const ScenarioResult& s = r.scenarios[1];
  // From the first divergence's command (as the runner writes it), with the cell's step, layer
  // and component.
  r.scenarios[1].comparisons[0].first_divergence->rerun =
      "dsv41 run --config tiny --weights w.safetensors --token-map m.txt resume.json --sides ref@cold,ref-bf16kv@global "
      "--mode teacher-forced --stop-after-step 1 --save-tensors step=1,layer=3,component=attn_out -o rerun.h5";
  EXPECT_EQ(rerun_command(r.meta, s, s.comparisons[0], 2, 1, "topk"),
            "dsv41 run --config tiny --weights w.safetensors --token-map m.txt resume.json --sides "
            "ref@cold,ref-bf16kv@global --mode teacher-forced --stop-after-step 2 --save-tensors "
            "step=2,layer=1,component=topk -o rerun.h5");
  // A rerun command of another form: built from the run's metadata, as below.
  r.scenarios[1].comparisons[0].first_divergence->rerun = "dsv41 run --scenario 'resume' --steps 1";
  EXPECT_EQ(rerun_command(r.meta, s, s.comparisons[0], 2, 1, "topk"),
            "dsv41 run --config tiny --weight-seed 7 scenarios/resume.json --sides ref@cold,ref-bf16kv@global --mode "
            "teacher-forced --stop-after-step 2 --save-tensors step=2,layer=1,component=topk -o rerun.h5");
  // Without one: built from the run's config, weights and the scenario's source.
  EXPECT_EQ(rerun_command(r.meta, s, s.comparisons[1], 1, -1, "logits"),
            "dsv41 run --config tiny --weight-seed 7 scenarios/resume.json --sides ref@cold,ref@global --mode "
            "free-running --stop-after-step 1 --save-tensors step=1,layer=-1,component=logits -o rerun.h5");
  RunMeta m = r.meta;
  m.weights = "file:golden/oracle/weights.safetensors";
  EXPECT_THAT(rerun_command(m, r.scenarios[0], r.scenarios[0].comparisons[0], 0, 0, "attn_out"),
              ::testing::StartsWith("dsv41 run --config tiny cold_prefill --sides ref@cold,ref@global"));
  m.weights = "file:my weights.safetensors";
  EXPECT_THAT(rerun_command(m, r.scenarios[0], r.scenarios[0].comparisons[0], 0, 0, "attn_out"),
              ::testing::StartsWith("dsv41 run --config tiny --weights 'my weights.safetensors' cold_prefill"));
}

}  // namespace
}  // namespace dsv41::reports
