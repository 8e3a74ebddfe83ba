// reports/: the speculative rounds of a comparison, <comparison>/acceptance
// (docs/report-schema.md, "acceptance/ columns"). A hand-crafted pair of sides whose accept
// decisions differ at a known step is written, read back field by field (NaN confidences and
// rounds without drafts included) and checked against the schema; the table's columns and types
// are read with the HDF5 C API against the list in the docs; a file written before the table
// existed (the table deleted) still reads and checks; a broken table is caught; the summary shows
// each side's mean accepted length, its calibration and where the accept decisions first differ,
// with numbers worked out by hand from the crafted rows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "reports/report.h"
#include "tests/reports/report_fixture.h"
#include "tests/support/error_of.h"

namespace dsv41::reports {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using dsv41::test::error_of;
using test::sample_report;
using test::temp_dir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// One draft of a crafted round: its confidence (NaN: none), whether this side accepted it, and its
// acceptance probability (NaN: not decided).
struct Draft {
  double confidence;
  int realised;
  double accept_prob;
};

// Appends one round of `side`: a row per draft (predicted survival = the product of the
// confidences so far), or one row with draft_index -1 when there is none.
void add_round(Comparison& c, const std::string& side, int64_t step, int session, int64_t start_pos, int64_t verified,
               int64_t accepted, int64_t kept, int64_t next_token, const std::vector<Draft>& drafts) {
  AcceptanceRow r;
  r.step = step;
  r.session = session;
  r.side = side;
  r.start_pos = start_pos;
  r.proposed = static_cast<int64_t>(drafts.size());
  r.verified = verified;
  r.accepted = accepted;
  r.kept = kept;
  r.next_token = next_token;
  if (drafts.empty()) {
    r.draft_index = -1;
    r.draft_token = -1;
    r.confidence = r.predicted_survival = r.accept_prob = kNaN;
    r.realised = -1;
    c.acceptance.push_back(r);
    return;
  }
  double survival = 1;
  for (size_t i = 0; i < drafts.size(); ++i) {
    survival *= drafts[i].confidence;
    r.draft_index = static_cast<int64_t>(i);
    r.draft_token = 100 * step + static_cast<int64_t>(i);
    r.confidence = drafts[i].confidence;
    r.predicted_survival = survival;
    r.realised = drafts[i].realised;
    r.accept_prob = drafts[i].accept_prob;
    c.acceptance.push_back(r);
  }
}

// Greedy rounds, side a the reference with confidences, side b a port that accepts one draft
// too many at step 4 (and reports no confidence):
//   step session  P   n  k | a: m next   | b: m next
//   1    0        10  3  3 |    2  501   |    2  501   a confidences .75 .5 .5 -> S .75 .375 .1875
//   2    0        13  2  2 |    2  502   |    2  502   .5 .5 -> S .5 .25
//   3    0        16  0  0 |    0  503   |    0  503   no drafts: one row, draft_index -1
//   4    0        17  4  2 |    1  504   |    2  505   .5 .5 .25 .25 -> S .5 .25 (.0625 .015625 not verified)
//   5    1        40  1  1 |    1  506   |    1  506   .6875 -> S .6875
Comparison speculative_pair() {
  Comparison c;
  c.side_a = "ref@spec";
  c.side_b = "mutant:accept_one_more:S4@spec";
  c.mode = "free-running";
  c.expectation = "measured";
  c.expectation_origin = "stated: a planted speculative defect, recorded";
  c.verdict = Verdict::kMeasured;
  c.steps_compared = 5;
  for (const char* side : {"a", "b"}) {
    const bool a = side[0] == 'a';
    const double none = kNaN;
    add_round(c, side, 1, 0, 10, 3, 2, 2, 501, {{a ? .75 : none, 1, 1}, {a ? .5 : none, 1, 1}, {a ? .5 : none, 0, 0}});
    add_round(c, side, 2, 0, 13, 2, 2, 2, 502, {{a ? .5 : none, 1, 1}, {a ? .5 : none, 1, 1}});
    add_round(c, side, 3, 0, 16, 0, 0, 0, 503, {});
    add_round(c, side, 4, 0, 17, 2, a ? 1 : 2, 1, a ? 504 : 505,
              {{a ? .5 : none, 1, 1}, {a ? .5 : none, a ? 0 : 1, a ? 0.0 : 1.0}, {a ? .25 : none, -1, kNaN},
               {a ? .25 : none, -1, kNaN}});
    add_round(c, side, 5, 1, 40, 1, 1, 1, 506, {{a ? .6875 : none, 1, 1}});
  }
  return c;
}

// The sample report plus a scenario "speculative" holding the crafted pair.
RunReport speculative_report(const Comparison& c) {
  RunReport r = sample_report();
  ScenarioResult s;
  s.name = "speculative";
  s.kind = "speculative";
  s.source = "builtin:speculative";
  s.scenario_json = "{}";
  s.steps = {{1, 0, "decode", 10, 4, {}}, {2, 0, "decode", 13, 3, {}}};
  s.comparisons = {c};
  s.verdict = c.verdict;
  r.scenarios.push_back(s);
  r.verdict = roll_up(r.scenarios);
  return r;
}

const std::string kTable = "/scenarios/speculative/comparisons/00/acceptance";

// Opens `path` read-write, runs fn(file), closes it.
template <typename Fn>
void edit(const std::string& path, Fn fn) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  fn(f);
  H5Fclose(f);
}

// ---- round trip and layout ----

TEST(ReportAcceptance, RoundTripKeepsEveryRowIncludingNaNAndRoundsWithoutDrafts) {
  const RunReport in = speculative_report(speculative_pair());
  const std::vector<AcceptanceRow>& rows = in.scenarios.back().comparisons[0].acceptance;
  ASSERT_EQ(rows.size(), 22u);  // 11 rows per side: 3 + 2 + 1 + 4 + 1
  size_t nan_confidence = 0, without_drafts = 0;
  for (const AcceptanceRow& r : rows) {
    nan_confidence += std::isnan(r.confidence);
    without_drafts += r.draft_index == -1;
  }
  ASSERT_EQ(without_drafts, 2u);
  ASSERT_EQ(nan_confidence, 12u);  // every row of b, and a's row without drafts
  const std::string path = temp_dir() + "/r.h5";
  write_report(path, in);
  test::expect_same_report(in, read_report(path, true), true);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

TEST(ReportAcceptance, TheTableHasOneColumnPerFieldAndIsWrittenEmptyWithoutRounds) {
  const std::string path = temp_dir() + "/r.h5";
  write_report(path, speculative_report(speculative_pair()));
  // docs/report-schema.md, "acceptance/ columns".
  const std::vector<std::pair<std::string, H5T_class_t>> columns = {
      {"step", H5T_INTEGER},       {"session", H5T_INTEGER},    {"side", H5T_STRING},
      {"start_pos", H5T_INTEGER},  {"proposed", H5T_INTEGER},   {"verified", H5T_INTEGER},
      {"accepted", H5T_INTEGER},   {"kept", H5T_INTEGER},       {"next_token", H5T_INTEGER},
      {"draft_index", H5T_INTEGER}, {"draft_token", H5T_INTEGER}, {"confidence", H5T_FLOAT},
      {"predicted_survival", H5T_FLOAT}, {"realised", H5T_INTEGER}, {"accept_prob", H5T_FLOAT}};
  const auto rows_of = [](hid_t f, const std::string& p, H5T_class_t want) -> hsize_t {
    const hid_t ds = H5Dopen2(f, p.c_str(), H5P_DEFAULT);
    EXPECT_GE(ds, 0) << p;
    if (ds < 0) return 0;
    const hid_t type = H5Dget_type(ds), space = H5Dget_space(ds);
    EXPECT_EQ(H5Tget_class(type), want) << p;
    if (want != H5T_STRING) {
      EXPECT_EQ(H5Tget_size(type), 8u) << p;  // int64 / float64
    }
    EXPECT_EQ(H5Sget_simple_extent_ndims(space), 1) << p;
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(ds);
    return n;
  };
  edit(path, [&](hid_t f) {
    H5G_info_t info;
    ASSERT_GE(H5Gget_info_by_name(f, kTable.c_str(), &info, H5P_DEFAULT), 0);
    EXPECT_EQ(info.nlinks, columns.size());
    for (const auto& [name, cls] : columns) {
      EXPECT_EQ(rows_of(f, kTable + "/" + name, cls), 22u) << name;
    }
    // A comparison without speculative rounds has the table with zero rows.
    const std::string empty = "/scenarios/cold_prefill/comparisons/00/acceptance";
    for (const auto& [name, cls] : columns) {
      EXPECT_EQ(rows_of(f, empty + "/" + name, cls), 0u) << name;
    }
  });
}

// A file written before the table existed: every acceptance group deleted.
TEST(ReportAcceptance, AFileWithoutTheTableStillReadsAndChecks) {
  const std::string path = temp_dir() + "/old.h5";
  RunReport in = speculative_report(speculative_pair());
  write_report(path, in);
  edit(path, [&](hid_t f) {
    for (const ScenarioResult& s : in.scenarios) {
      for (size_t c = 0; c < s.comparisons.size(); ++c) {
        const std::string g = "/scenarios/" + s.name + "/comparisons/0" + std::to_string(c) + "/acceptance";
        ASSERT_GE(H5Ldelete(f, g.c_str(), H5P_DEFAULT), 0) << g;
      }
    }
  });
  for (ScenarioResult& s : in.scenarios) {
    for (Comparison& c : s.comparisons) c.acceptance.clear();
  }
  test::expect_same_report(in, read_report(path, true), true);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

TEST(ReportAcceptance, SchemaCheckCatchesABrokenTable) {
  const std::string path = temp_dir() + "/r.h5";
  write_report(path, speculative_report(speculative_pair()));
  const std::string realised = kTable + "/realised", side = kTable + "/side";
  edit(path, [&](hid_t f) {
    ASSERT_GE(H5Ldelete(f, realised.c_str(), H5P_DEFAULT), 0);
    // The side column rewritten as fixed-width strings "c".
    ASSERT_GE(H5Ldelete(f, side.c_str(), H5P_DEFAULT), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 1);
    const hsize_t n = 22;
    const std::string values(n, 'c');
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t ds = H5Dcreate2(f, side.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(ds);
    H5Sclose(space);
    H5Tclose(type);
  });
  EXPECT_THAT(check_report_schema(path), ::testing::Contains(AllOf(HasSubstr(realised), HasSubstr("missing"))));
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr(realised)));
  // With the column back, the side names are what is wrong.
  edit(path, [&](hid_t f) {
    const hsize_t n = 22;
    const std::vector<int64_t> ones(n, 1);
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t ds = H5Dcreate2(f, realised.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, ones.data());
    H5Dclose(ds);
    H5Sclose(space);
  });
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_EQ(problems.size(), 22u);  // one per row, nothing else
  EXPECT_THAT(problems, ::testing::Each(HasSubstr(side + ": row ")));
  EXPECT_THAT(problems, ::testing::Contains(HasSubstr(side + ": row 21: 'c' is not \"a\" or \"b\"")));
}

TEST(ReportAcceptance, WriteRefusesABadSideDraftIndexOrRealised) {
  const std::string path = temp_dir() + "/r.h5";
  Comparison c = speculative_pair();
  c.acceptance[3].side = "ref";
  EXPECT_THAT(error_of([&] { write_report(path, speculative_report(c)); }),
              AllOf(HasSubstr("acceptance row 3"), HasSubstr("'ref'")));
  c = speculative_pair();
  c.acceptance[4].draft_index = -2;
  EXPECT_THAT(error_of([&] { write_report(path, speculative_report(c)); }),
              AllOf(HasSubstr("acceptance row 4"), HasSubstr("draft_index -2")));
  c = speculative_pair();
  c.acceptance[0].realised = 2;
  EXPECT_THAT(error_of([&] { write_report(path, speculative_report(c)); }),
              AllOf(HasSubstr("acceptance row 0"), HasSubstr("realised 2")));
  EXPECT_FALSE(std::filesystem::exists(path));
}

// ---- the summary ----

const std::string kIndent = "\n               ";

// The summary with each wrapped detail line joined back to the line it continues (continuations
// are indented 17 columns: report show keeps lines within 120 columns).
std::string summary_of(const RunReport& r) {
  const std::string text = format_summary(r), continuation = "\n                 ";
  std::string out;
  for (size_t at = 0;;) {
    const size_t next = text.find(continuation, at);
    out.append(text, at, next == std::string::npos ? std::string::npos : next - at);
    if (next == std::string::npos) return out;
    out.push_back(' ');
    at = next + continuation.size();
  }
}

TEST(ReportAcceptance, SummaryShowsMeansCalibrationAndTheFirstDifferingStep) {
  const std::string text = summary_of(speculative_report(speculative_pair()));
  std::printf("%s", text.c_str());
  // a: m 2+2+0+1+1 = 6 over 5 rounds, k 3+2+0+2+1 = 8. Verified positions with a confidence: 3 + 2
  // + 2 + 1 = 8, S summing .75+.375+.1875 + .5+.25 + .5+.25 + .6875 = 3.5 (mean .4375); prefix
  // accepted (i < m): 2 + 2 + 1 + 1 = 6 of 8.
  EXPECT_TRUE(has(text, kIndent + "speculative, side a (ref@spec): 5 rounds; mean accepted m 1.2, mean tokens per "
                                  "round 2.2, mean verified k 1.6; predicted survival mean 0.4375 vs realised prefix "
                                  "acceptance 0.75 over 8 verified positions\n"))
      << text;
  // b: m 2+2+0+2+1 = 7, no confidence: no calibration.
  EXPECT_TRUE(has(text, kIndent + "speculative, side b (mutant:accept_one_more:S4@spec): 5 rounds; mean accepted m "
                                  "1.4, mean tokens per round 2.4, mean verified k 1.6\n"))
      << text;
  EXPECT_TRUE(has(text, kIndent + "accept decisions: first differ at step 4 session 0: a m=1 next_token=504, b m=2 "
                                  "next_token=505\n"))
      << text;
  // Comparisons without rounds print none of it.
  const std::string plain = summary_of(sample_report());
  EXPECT_FALSE(has(plain, "speculative")) << plain;
  EXPECT_FALSE(has(plain, "accept decisions")) << plain;
}

TEST(ReportAcceptance, SummaryComparesTheNextTokenAndSaysWhenDecisionsAreIdentical) {
  Comparison c = speculative_pair();
  for (AcceptanceRow& r : c.acceptance) {
    if (r.side == "b" && r.step == 4) r.accepted = 1, r.next_token = 504;  // b decides as a
  }
  EXPECT_TRUE(has(summary_of(speculative_report(c)), kIndent + "accept decisions identical in 5 rounds\n"));
  for (AcceptanceRow& r : c.acceptance) {
    if (r.side == "b" && r.step == 2) r.next_token = 777;  // same m, another correction
  }
  EXPECT_TRUE(has(summary_of(speculative_report(c)),
                  "accept decisions: first differ at step 2 session 0: a m=2 next_token=502, b m=2 next_token=777\n"));
  // A round only one side has is a difference; a side without any round is named.
  c = speculative_pair();
  std::erase_if(c.acceptance, [](const AcceptanceRow& r) { return r.side == "b" && r.step == 1; });
  EXPECT_TRUE(has(summary_of(speculative_report(c)),
                  "accept decisions: first differ at step 1 session 0: a m=2 next_token=501, b no round\n"));
  std::erase_if(c.acceptance, [](const AcceptanceRow& r) { return r.side == "b"; });
  const std::string text = summary_of(speculative_report(c));
  EXPECT_TRUE(has(text, kIndent + "accept decisions: only side a has speculative rounds\n")) << text;
  EXPECT_FALSE(has(text, "side b (")) << text;
}

}  // namespace
}  // namespace dsv41::reports
