// `dsv41 report show|check|junit` end to end (docs/report-schema.md, "The `dsv41 report` verb"):
// exit codes 0 / 1 / 2 on a written report, a report broken with the HDF5 C API, and files that
// are not reports.
#include <gtest/gtest.h>
#include <hdf5.h>

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

}  // namespace
}  // namespace dsv41::reports
