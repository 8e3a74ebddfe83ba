// `dsv41 report show|check|junit|html|diff` end to end (docs/report-schema.md, "The `dsv41 report` verb"):
// exit codes 0 / 1 / 2 on a written report, a report broken with the HDF5 C API, and files that
// are not reports.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "reports/report.h"
#include "tests/reports/report_fixture.h"
#include "tests/support/run_cli.h"

namespace dsv41::reports {
namespace {

using dsv41::test::has;
using dsv41::test::run_dsv41;
using dsv41::test::scratch;

std::string written_report() {
  const std::string path = scratch() + "/report.h5";
  write_report(path, test::sample_report());
  return path;
}

TEST(ReportCli, ShowPrintsTheSummaryOfAFailingRunAndExits0) {
  const std::string path = written_report();
  const dsv41::test::CliResult r = run_dsv41("report show '" + path + "' --rows 2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "verdict fail (exit 1)")) << r.out;
  EXPECT_TRUE(has(r.out, "first divergence: step 1 layer 3 component attn_out")) << r.out;
  EXPECT_TRUE(has(r.out, "worst checked metrics (2 shown; 3 checked")) << r.out;
  EXPECT_TRUE(has(r.out, "rerun:")) << r.out;
}

TEST(ReportCli, CheckSaysValidAndExits0) {
  const std::string path = written_report();
  const dsv41::test::CliResult r = run_dsv41("report check '" + path + "'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "report check: " + path + ": valid (schema 1)\n");
}

TEST(ReportCli, CheckListsTheProblemsOfABrokenReportAndExits1) {
  const std::string path = written_report();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/summary", H5P_DEFAULT), 0);
  H5Fclose(f);
  const dsv41::test::CliResult r = run_dsv41("report check '" + path + "'");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "/summary: missing")) << r.out;
  // Unreadable as a report: show exits 2 naming the file.
  const dsv41::test::CliResult s = run_dsv41("report show '" + path + "'");
  EXPECT_EQ(s.code, 2);
  EXPECT_TRUE(has(s.err, path)) << s.err;
}

TEST(ReportCli, UnreadableFilesExit2) {
  const std::string path = scratch() + "/not.h5";
  std::ofstream(path) << "not HDF5\n";
  for (const char* verb : {"show", "check"}) {
    const dsv41::test::CliResult r = run_dsv41(std::string("report ") + verb + " '" + path + "'");
    EXPECT_EQ(r.code, 2) << verb;
    EXPECT_TRUE(has(r.err, "dsv41: error: ") && has(r.err, path)) << r.err;
  }
  const dsv41::test::CliResult j = run_dsv41("report junit '" + path + "' -o '" + scratch() + "/j.xml'");
  EXPECT_EQ(j.code, 2);
  EXPECT_FALSE(std::filesystem::exists(scratch() + "/j.xml"));
  EXPECT_EQ(run_dsv41("report").code, 2);  // a subcommand is required
}

TEST(ReportCli, JunitWritesTheXmlAndExits0) {
  const std::string path = written_report();
  const std::string xml = scratch() + "/junit.xml";
  const dsv41::test::CliResult r = run_dsv41("report junit '" + path + "' -o '" + xml + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string text = dsv41::test::read_bytes(xml);
  EXPECT_TRUE(has(text, "<testsuites name=\"dsv41\"")) << text;
  EXPECT_TRUE(has(text, "<failure type=\"fail\"")) << text;
  EXPECT_TRUE(has(text, "<failure type=\"inconclusive\"")) << text;
  EXPECT_EQ(run_dsv41("report junit '" + path + "' -o '" + scratch() + "/no/dir/j.xml'").code, 2);
}

TEST(ReportCli, ShowFiltersProfilesAndQuiet) {
  const std::string path = written_report();
  dsv41::test::CliResult r = run_dsv41("report show '" + path + "' --verdict fail,inconclusive --mode free-running");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "filter: --mode free-running --verdict fail,inconclusive")) << r.out;
  EXPECT_TRUE(has(r.out, "\n1 results: 0 error, 0 fail, 1 inconclusive, 0 measured, 0 pass\n")) << r.out;
  r = run_dsv41("report show '" + path + "' --scenario cold_prefill --by layer");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "by layer: cold_prefill: ref@cold vs ref@global [free-running]")) << r.out;
  r = run_dsv41("report show '" + path + "' -q");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  // Bad filters: exit 2 with what the report has.
  r = run_dsv41("report show '" + path + "' --scenario nope");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "no scenario 'nope'") && has(r.err, "cold_prefill")) << r.err;
  EXPECT_EQ(run_dsv41("report show '" + path + "' --verdict passed").code, 2);
  EXPECT_EQ(run_dsv41("report show '" + path + "' --mode sideways").code, 2);
  EXPECT_EQ(run_dsv41("report show '" + path + "' --by component").code, 2);
  EXPECT_EQ(run_dsv41("report show '" + path + "' --pair nobody,else").code, 2);
}

TEST(ReportCli, DiffExits1OnlyWhenACheckedItemRegressed) {
  const std::string before = scratch() + "/before.h5", after = scratch() + "/after.h5";
  RunReport a = test::sample_report();
  write_report(before, a);
  dsv41::test::CliResult r = run_dsv41("report diff '" + before + "' '" + before + "'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "report diff: no checked item regressed (exit 0)")) << r.out;
  // The bit-exact pair now differs: a new failure.
  RunReport b = a;
  Comparison& c = b.scenarios[0].comparisons[0];
  c.rows[0] = test::row(0, 0, "attn_out", "mismatch_frac", 0.5, c.rows[0].tolerance);
  c.verdict = Verdict::kFail;
  b.scenarios[0].verdict = Verdict::kFail;
  b.verdict = roll_up(b.scenarios);
  write_report(after, b);
  r = run_dsv41("report diff '" + before + "' '" + after + "'");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "new failures (2):")) << r.out;
  // The other way round it is a fix.
  r = run_dsv41("report diff '" + after + "' '" + before + "'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "better (")) << r.out;
  EXPECT_EQ(run_dsv41("report diff '" + before + "' '" + scratch() + "/missing.h5'").code, 2);
}

TEST(ReportCli, HtmlWritesOnePage) {
  const std::string path = written_report(), html = scratch() + "/r.html";
  dsv41::test::CliResult r = run_dsv41("report html '" + path + "' -o '" + html + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "report html: wrote " + html)) << r.out;
  const std::string page = dsv41::test::read_bytes(html);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_TRUE(has(page, "window.DSV41_REPORT")) << "the page script";
  EXPECT_TRUE(has(page, "d3js.org")) << "the plotting library, inlined";
  // The kept tensors' first mismatch is in the page (the report was read with its tensors).
  EXPECT_TRUE(has(page, "\"tensors\":[{")) << "kept tensors";
  EXPECT_EQ(run_dsv41("report html '" + scratch() + "/missing.h5' -o '" + html + "'").code, 2);
  EXPECT_EQ(run_dsv41("report html '" + path + "' -o '" + scratch() + "/no/dir/r.html'").code, 2);
}

}  // namespace
}  // namespace dsv41::reports
