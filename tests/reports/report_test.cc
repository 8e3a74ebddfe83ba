// reports/: the HDF5 divergence report (docs/report-schema.md). A hand-built RunReport
// (report_fixture.h: two scenarios, every verdict, a divergence, tensors of every logical
// dtype, notes) is written, read back field by field and checked against the schema; files
// broken with the HDF5 C API must be caught by the schema check; non-reports, truncated reports
// and plain HDF5 files must be refused with a dsv41::Error naming the file; two writes differ only
// under /meta/volatile (h5diff, when installed); failed writes leave nothing behind and an
// existing report intact; the docs' h5py snippet runs on a written report; the JUnit file is
// well-formed, escaped and counts every verdict that is not a pass as a failure or an error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "reports/report.h"
#include "tests/reports/report_fixture.h"
#include "tests/support/error_of.h"

namespace dsv41::reports {
namespace {

using ::testing::HasSubstr;
using dsv41::test::error_of;
using test::kFailScenario;
using test::sample_report;
using test::temp_dir;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Exit status of a shell command (-1 when it did not exit normally).
int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool on_path(const std::string& tool) { return shell("command -v " + tool + " >/dev/null 2>&1") == 0; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The failing scenario's comparison 00 group in a written report.
const std::string kFailComparison = "/scenarios/" + kFailScenario + "/comparisons/00";

// ---- round trip ----

TEST(Report, SampleIsNotTrivial) {
  const RunReport r = sample_report();
  ASSERT_EQ(r.scenarios.size(), 2u);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  size_t rows = 0, nonzero = 0, failing = 0;
  for (const ScenarioResult& s : r.scenarios) {
    for (const Comparison& c : s.comparisons) {
      for (const MetricRow& m : c.rows) {
        ++rows;
        nonzero += m.value != 0 && !std::isnan(m.value);
        failing += m.verdict == Verdict::kFail;
      }
    }
  }
  EXPECT_GT(rows, 20u);
  EXPECT_GT(nonzero, rows / 2);
  EXPECT_EQ(failing, 2u);  // step 1 and step 2 of layer 3 in the failing comparison
}

TEST(Report, RoundTripKeepsEveryField) {
  const std::string path = temp_dir() + "/r.h5";
  const RunReport in = sample_report();
  write_report(path, in);
  SCOPED_TRACE("without tensors");
  RunReport expected = in;
  for (ScenarioResult& s : expected.scenarios) {
    for (Comparison& c : s.comparisons) c.tensors.clear();
  }
  const RunReport out = read_report(path);
  test::expect_same_report(expected, out, true);  // tensors are not loaded by default
  SCOPED_TRACE("with tensors");
  test::expect_same_report(in, read_report(path, true), true);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

TEST(Report, EmptyReportRoundTrips) {
  const std::string path = temp_dir() + "/empty.h5";
  RunReport in;  // no scenario: inconclusive
  in.verdict = roll_up(in.scenarios);
  ASSERT_EQ(in.verdict, Verdict::kInconclusive);
  write_report(path, in);
  test::expect_same_report(in, read_report(path), true);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

TEST(Report, SummaryHoldsTheWorstRowPerComponentAndMetric) {
  const RunReport r = sample_report();
  const std::vector<SummaryRow> rows = summarize(r);
  // The failing comparison's attn_out nmse: its 12 rows aggregate to the largest excess, the
  // 3.5e-5 of step 1 layer 3 (the other failing row, 2e-6, is closer to the bound).
  const auto it = std::find_if(rows.begin(), rows.end(), [](const SummaryRow& s) {
    return s.scenario == kFailScenario && s.comparison == 0 && s.component == "attn_out" && s.metric == "nmse";
  });
  ASSERT_NE(it, rows.end());
  const Comparison& c = r.scenarios[1].comparisons[0];
  const MetricRow& worst = *std::max_element(c.rows.begin(), c.rows.end(), [](const MetricRow& a, const MetricRow& b) {
    return (a.metric == "nmse" ? a.value : -1) < (b.metric == "nmse" ? b.value : -1);
  });
  EXPECT_EQ(it->value, worst.value);
  EXPECT_EQ(it->step, worst.step);
  EXPECT_EQ(it->layer, worst.layer);
  EXPECT_EQ(it->verdict, Verdict::kFail);
  EXPECT_EQ(it->rows, 12);
  EXPECT_EQ(it->bound, worst.tolerance->bound);
  EXPECT_EQ(it->origin, worst.tolerance->origin);
  // A higher-is-better metric: the worst is the smallest value.
  const auto jac = std::find_if(rows.begin(), rows.end(), [](const SummaryRow& s) { return s.metric == "jaccard_min"; });
  ASSERT_NE(jac, rows.end());
  double smallest = 2;
  for (const MetricRow& m : c.rows) {
    if (m.metric == "jaccard_min") smallest = std::min(smallest, m.value);
  }
  EXPECT_EQ(jac->value, smallest);
  EXPECT_TRUE(jac->higher_is_better);
  EXPECT_EQ(jac->verdict, Verdict::kPass);
  // Unchecked rows: the largest value, NaN counting as the largest; no bound.
  const auto kl = std::find_if(rows.begin(), rows.end(), [](const SummaryRow& s) { return s.metric == "kl"; });
  ASSERT_NE(kl, rows.end());
  EXPECT_TRUE(std::isnan(kl->value));
  EXPECT_TRUE(std::isnan(kl->bound));
  EXPECT_EQ(kl->origin, "");
  EXPECT_EQ(kl->verdict, Verdict::kMeasured);
  // One row per (scenario, comparison, component, metric), rows adding up to every MetricRow.
  int64_t total = 0, expected = 0;
  for (const SummaryRow& s : rows) total += s.rows;
  for (const ScenarioResult& s : r.scenarios) {
    for (const Comparison& cmp : s.comparisons) expected += static_cast<int64_t>(cmp.rows.size());
  }
  EXPECT_EQ(total, expected);
}

TEST(Report, VerdictsRollUpWorstFirst) {
  const std::vector<Verdict> order = {Verdict::kPass, Verdict::kMeasured, Verdict::kInconclusive, Verdict::kFail,
                                      Verdict::kError};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(parse_verdict(name(order[i])), order[i]);
    for (size_t j = 0; j < order.size(); ++j) {
      EXPECT_EQ(worse(order[i], order[j]), order[std::max(i, j)]) << name(order[i]) << ", " << name(order[j]);
    }
  }
  EXPECT_THAT(error_of([] { parse_verdict("passed"); }), HasSubstr("passed"));
  std::vector<ScenarioResult> s(2);
  s[0].verdict = Verdict::kPass;
  s[1].verdict = Verdict::kMeasured;
  EXPECT_EQ(exit_code(roll_up(s)), 0);  // measured counts as pass
  s[1].verdict = Verdict::kInconclusive;
  EXPECT_EQ(roll_up(s), Verdict::kInconclusive);  // missing evidence never passes
  EXPECT_EQ(exit_code(Verdict::kInconclusive), 3);
  EXPECT_EQ(exit_code(Verdict::kFail), 1);
  EXPECT_EQ(exit_code(Verdict::kError), 2);
  EXPECT_EQ(roll_up({}), Verdict::kInconclusive);
}

// ---- the schema check catches broken files (broken with the HDF5 C API) ----

// Copies the written sample to `path` and opens it read-write.
class BrokenFile {
 public:
  explicit BrokenFile(const std::string& path) : path_(path) {
    write_report(path, sample_report());
    EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());  // valid before breaking it
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(file_, 0);
  }
  ~BrokenFile() { close(); }
  hid_t get() const { return file_; }
  void close() {
    if (file_ >= 0) H5Fclose(file_);
    file_ = -1;
  }

  // Replaces the string attribute `name` of `object` (variable-length UTF-8, as written).
  void set_string_attr(const std::string& object, const std::string& name, const std::string& value) {
    ASSERT_GE(H5Adelete_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate_by_name(file_, object.c_str(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT,
                                      H5P_DEFAULT);
    const char* p = value.c_str();
    EXPECT_GE(H5Awrite(a, type, &p), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }

 private:
  std::string path_;
  hid_t file_ = -1;
};

TEST(ReportSchema, CatchesAMissingSummary) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  ASSERT_GE(H5Ldelete(f.get(), "/summary", H5P_DEFAULT), 0);
  f.close();
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_THAT(problems, ::testing::Contains(HasSubstr("/summary: missing")));
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr("/summary")));
}

TEST(ReportSchema, CatchesAPassingComparisonWithAFailingRow) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  f.set_string_attr(kFailComparison, "verdict", "pass");
  f.close();
  ASSERT_EQ(read_report(path).scenarios[1].comparisons[0].verdict, Verdict::kPass);  // the break took
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_THAT(problems, ::testing::Contains(AllOf(HasSubstr(kFailComparison), HasSubstr("fail"))));
  for (const std::string& p : problems) std::printf("  problem: %s\n", p.c_str());
}

TEST(ReportSchema, CatchesAScenarioVerdictThatIsNotTheWorstOfItsComparisons) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  f.set_string_attr("/scenarios/cold_prefill", "verdict", "measured");
  f.set_string_attr("/", "verdict", "wonderful");
  f.close();
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_THAT(problems, ::testing::Contains(AllOf(HasSubstr("/scenarios/cold_prefill"), HasSubstr("worst"))));
  EXPECT_THAT(problems, ::testing::Contains(HasSubstr("'wonderful'")));
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr("wonderful")));
}

TEST(ReportSchema, CatchesAWrongSchemaVersion) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  const hid_t a = H5Aopen(f.get(), "schema_version", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  const int64_t two = 2;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &two), 0);
  H5Aclose(a);
  f.close();
  EXPECT_THAT(check_report_schema(path), ::testing::Contains(HasSubstr("schema_version 2")));
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr("schema_version 2")));
}

TEST(ReportSchema, CatchesAColumnOfTheWrongLength) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  const std::string column = kFailComparison + "/metrics/value";
  ASSERT_GE(H5Ldelete(f.get(), column.c_str(), H5P_DEFAULT), 0);
  const hsize_t n = 4;  // the table has 15 rows
  const double values[4] = {1, 2, 3, 4};
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(f.get(), column.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  H5Dclose(ds);
  H5Sclose(space);
  f.close();
  EXPECT_THAT(check_report_schema(path), ::testing::Contains(AllOf(HasSubstr(column), HasSubstr("has 4 rows"))));
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr(column)));
}

// A checked row's verdict must follow from its value and bound: with every value NaN (never
// within a bound), a row whose verdict still says pass contradicts itself (issue 14).
TEST(ReportSchema, CatchesACheckedRowWhoseVerdictContradictsItsValue) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  const std::string column = kFailComparison + "/metrics/value";
  const hid_t old = H5Dopen2(f.get(), column.c_str(), H5P_DEFAULT);
  ASSERT_GE(old, 0);
  const hid_t old_space = H5Dget_space(old);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(old_space, &n, nullptr);
  H5Sclose(old_space);
  H5Dclose(old);
  ASSERT_GT(n, 0u);
  ASSERT_GE(H5Ldelete(f.get(), column.c_str(), H5P_DEFAULT), 0);
  const std::vector<double> nan(n, std::numeric_limits<double>::quiet_NaN());
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(f.get(), column.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, nan.data());
  H5Dclose(ds);
  H5Sclose(space);
  f.close();
  EXPECT_THAT(check_report_schema(path),
              ::testing::Contains(AllOf(HasSubstr(kFailComparison + "/metrics"), HasSubstr("verdict 'pass' but its value nan"),
                                        HasSubstr("is beyond its bound"))));
}

// A tensor stored wider than its logical dtype (int64 for int32) is not what the schema says.
TEST(ReportSchema, CatchesATensorStoredInTheWrongWidth) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  const std::string values = kFailComparison + "/tensors/02/values";  // the int32 top-k tensor
  ASSERT_GE(H5Ldelete(f.get(), values.c_str(), H5P_DEFAULT), 0);
  const hsize_t n = 4;
  const int64_t v[4] = {-1, 0, 7, 2147483647};
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(f.get(), values.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(ds);
  H5Sclose(space);
  f.close();
  EXPECT_THAT(check_report_schema(path),
              ::testing::Contains(AllOf(HasSubstr(values), HasSubstr("32-bit, found 64-bit"))));
}

TEST(ReportSchema, CatchesAMissingAttributeAndAMistypedOne) {
  const std::string path = temp_dir() + "/r.h5";
  BrokenFile f(path);
  ASSERT_GE(H5Adelete_by_name(f.get(), "/meta/volatile", "host", H5P_DEFAULT), 0);
  f.set_string_attr(kFailComparison, "steps_compared", "three");
  f.close();
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_THAT(problems, ::testing::Contains(AllOf(HasSubstr("/meta/volatile"), HasSubstr("'host' is missing"))));
  EXPECT_THAT(problems, ::testing::Contains(AllOf(HasSubstr("steps_compared"), HasSubstr("integers"))));
}

// ---- files that are not reports ----

TEST(ReportRead, RefusesANonHdf5File) {
  const std::string path = temp_dir() + "/notes.h5";
  write_text(path, "this is not an HDF5 file\n");
  EXPECT_THAT(error_of([&] { read_report(path); }), AllOf(HasSubstr(path), HasSubstr("not an HDF5 file")));
  EXPECT_THAT(error_of([&] { check_report_schema(path); }), HasSubstr(path));
  EXPECT_THAT(error_of([&] { read_report(path + ".missing"); }), HasSubstr("no such file"));
}

TEST(ReportRead, RefusesATruncatedReport) {
  const std::string dir = temp_dir();
  const std::string good = dir + "/r.h5";
  write_report(good, sample_report());
  const std::string bytes = read_text(good);
  ASSERT_GT(bytes.size(), 4096u);
  // Cuts through the superblock, the metadata and the data, down to one missing byte.
  for (const size_t keep : {size_t{8}, size_t{100}, bytes.size() / 4, bytes.size() / 2, bytes.size() * 9 / 10,
                            bytes.size() - 1}) {
    SCOPED_TRACE("kept " + std::to_string(keep) + " of " + std::to_string(bytes.size()) + " bytes");
    const std::string cut = dir + "/cut.h5";
    write_text(cut, bytes.substr(0, keep));
    EXPECT_THAT(error_of([&] { read_report(cut); }), HasSubstr(cut));
  }
}

TEST(ReportRead, RefusesAPlainHdf5File) {
  const std::string path = temp_dir() + "/plain.h5";
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hsize_t n = 3;
  const int32_t v[3] = {1, 2, 3};
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(f, "/logits", H5T_NATIVE_INT32, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
  EXPECT_THAT(error_of([&] { read_report(path); }),
              AllOf(HasSubstr(path), HasSubstr("not a dsv41 divergence report"), HasSubstr("schema")));
  EXPECT_THAT(check_report_schema(path), ::testing::Contains(AllOf(HasSubstr("/"), HasSubstr("'schema' is missing"))));
}

// ---- determinism ----

TEST(ReportDeterminism, TwoWritesDifferOnlyUnderMetaVolatile) {
  if (!on_path("h5diff")) GTEST_SKIP() << "h5diff not on PATH (Debian package hdf5-tools)";
  const std::string dir = temp_dir();
  RunReport r = sample_report();
  write_report(dir + "/a.h5", r);
  // A second run of the same command: only the volatile fields change.
  r.meta.created_utc = "2026-11-30T08:00:00Z";
  r.meta.seconds = 9.5;
  r.meta.host = "other-host";
  for (ScenarioResult& s : r.scenarios) {
    for (Comparison& c : s.comparisons) c.seconds += 1;
  }
  write_report(dir + "/b.h5", r);
  const std::string cmd = "h5diff ";
  EXPECT_EQ(shell(cmd + "--exclude-path /meta/volatile '" + dir + "/a.h5' '" + dir + "/b.h5' >'" + dir + "/d1' 2>&1"), 0)
      << read_text(dir + "/d1");
  // h5diff does see the volatile differences, and a changed metric outside /meta/volatile.
  EXPECT_EQ(shell(cmd + "'" + dir + "/a.h5' '" + dir + "/b.h5' >/dev/null 2>&1"), 1);
  r.scenarios[0].comparisons[0].rows[2].value += 1;
  write_report(dir + "/c.h5", r);
  EXPECT_EQ(shell(cmd + "--exclude-path /meta/volatile '" + dir + "/a.h5' '" + dir + "/c.h5' >/dev/null 2>&1"), 1);
}

TEST(ReportDeterminism, TheSameReportTwiceGivesTheSameBytes) {
  // No timestamps anywhere (H5Pset_obj_track_times(false)): the same RunReport, volatile fields
  // included, gives the same file, byte for byte.
  const std::string dir = temp_dir();
  write_report(dir + "/a.h5", sample_report());
  write_report(dir + "/b.h5", sample_report());
  const std::string a = read_text(dir + "/a.h5");
  ASSERT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == read_text(dir + "/b.h5"));
}

// ---- atomicity ----

TEST(ReportWrite, MissingDirectoryThrowsAndLeavesNothing) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/no/such/dir/r.h5";
  EXPECT_THAT(error_of([&] { write_report(path, sample_report()); }), HasSubstr(path));
  EXPECT_FALSE(std::filesystem::exists(dir + "/no"));
  EXPECT_THAT(files_in(dir), ::testing::IsEmpty());
}

TEST(ReportWrite, AFailedWriteKeepsTheExistingReport) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/r.h5";
  const RunReport good = sample_report();
  write_report(path, good);
  const std::string before = read_text(path);
  RunReport bad = good;
  bad.scenarios[1].name = "resume/global";
  EXPECT_THAT(error_of([&] { write_report(path, bad); }), AllOf(HasSubstr("resume/global"), HasSubstr("'/'")));
  bad.scenarios[1].name = "";
  EXPECT_THAT(error_of([&] { write_report(path, bad); }), HasSubstr("empty name"));
  bad.scenarios[1].name = "cold_prefill";
  EXPECT_THAT(error_of([&] { write_report(path, bad); }), HasSubstr("duplicate scenario name 'cold_prefill'"));
  bad = good;
  bad.scenarios[1].comparisons[0].tensors[0].values[0] = 0.1;  // not a bf16 value
  EXPECT_THAT(error_of([&] { write_report(path, bad); }), HasSubstr("not a bf16 value"));
  bad = good;
  bad.scenarios[0].comparisons[0].rows[0].tolerance->origin = "";
  EXPECT_THAT(error_of([&] { write_report(path, bad); }), HasSubstr("without an origin"));
  EXPECT_EQ(read_text(path), before);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"r.h5"});  // no temp file left
  test::expect_same_report(read_report(path), read_report(path), false);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

// ---- the h5py snippet of docs/report-schema.md ----

// The first python3 that imports h5py and numpy ("" when none does).
std::string python_with_h5py() {
  for (const std::string& py : {std::string("/usr/bin/python3"), std::string(DSV41_PYTHON3)}) {
    if (!py.empty() && shell("'" + py + "' -c 'import h5py, numpy' >/dev/null 2>&1") == 0) return py;
  }
  return "";
}

TEST(ReportDocs, TheReadSnippetRunsOnAWrittenReport) {
  const std::string doc = read_text(std::string(DSV41_SOURCE_DIR) + "/docs/report-schema.md");
  const std::string begin = "<!-- snippet:read-report -->", end = "<!-- /snippet:read-report -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/report-schema.md lacks " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/report-schema.md lacks " << end;
  std::string block = doc.substr(b + begin.size(), e - b - begin.size());
  const size_t fence = block.find("```python");
  ASSERT_NE(fence, std::string::npos);
  block = block.substr(block.find('\n', fence) + 1);
  block = block.substr(0, block.rfind("```"));
  ASSERT_GT(std::count(block.begin(), block.end(), '\n'), 5);

  const std::string py = python_with_h5py();
  if (py.empty()) GTEST_SKIP() << "no python3 with h5py and numpy (apt-get install python3-h5py python3-numpy)";
  // It needs no pandas: run it where importing pandas fails.
  EXPECT_EQ(block.find("pandas"), std::string::npos) << block;
  const std::string dir = temp_dir();
  // Run order is not name order: the failing scenario runs first here.
  RunReport sample = sample_report();
  std::swap(sample.scenarios[0], sample.scenarios[1]);
  write_report(dir + "/report.h5", sample);
  write_text(dir + "/snippet.py", block);
  const int rc = shell("cd '" + dir + "' && '" + py + "' snippet.py report.h5 >out.txt 2>&1");
  const std::string out = read_text(dir + "/out.txt");
  ASSERT_EQ(rc, 0) << out;
  std::printf("%s", out.c_str());
  EXPECT_TRUE(has(out, "verdict: fail")) << out;
  EXPECT_TRUE(has(out, "exit code: 1")) << out;
  // The summary's size and the failing comparison's failing metric rows.
  const RunReport r = sample_report();
  EXPECT_TRUE(has(out, std::to_string(summarize(r).size()) + " summary rows")) << out;
  EXPECT_TRUE(has(out, std::to_string(r.scenarios[1].comparisons[0].rows.size()) + " rows")) << out;
  EXPECT_TRUE(has(out, "attn_out")) << out;
  EXPECT_TRUE(has(out, "nmse")) << out;
  EXPECT_TRUE(has(out, "3.5e-05")) << out;
  // Run order and the mode of every comparison.
  const size_t first = out.find(kFailScenario + " #00: ref@cold vs ref-bf16kv@global [teacher-forced]");
  const size_t second = out.find("cold_prefill #00: ref@cold vs ref@global [free-running]");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_NE(second, std::string::npos) << out;
  EXPECT_LT(first, second) << out;
}

// ---- JUnit ----

// Checks tags nest and close, and every '&' starts an entity; returns the first problem.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> open;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == '&') {
      const size_t semi = x.find(';', i);
      const std::string ent = semi == std::string::npos ? "" : x.substr(i, semi - i + 1);
      static const std::vector<std::string> ok = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#10;", "&#13;", "&#9;"};
      if (std::find(ok.begin(), ok.end(), ent) == ok.end()) return "bare '&' at " + std::to_string(i);
    }
    if (x[i] != '<') continue;
    const size_t close = x.find('>', i);
    if (close == std::string::npos) return "unclosed tag at " + std::to_string(i);
    const std::string tag = x.substr(i + 1, close - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    if (tag.empty() || tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
    i = close;
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(ReportJunit, IsWellFormedEscapedAndCountsEveryVerdict) {
  const std::string dir = temp_dir();
  RunReport r = sample_report();
  ScenarioResult broken;  // a scenario that did not complete
  broken.name = "boundary_facts";
  broken.kind = "boundary_facts";
  broken.verdict = Verdict::kError;
  broken.error = "side 'cuda@cold' unavailable: no device";
  r.scenarios.push_back(broken);
  r.verdict = roll_up(r.scenarios);
  const std::string path = dir + "/junit.xml";
  write_junit(path, r);
  const std::string x = read_text(path);
  ASSERT_FALSE(x.empty());
  EXPECT_EQ(xml_problem(x), "");
  if (on_path("xmllint")) {
    EXPECT_EQ(shell("xmllint --noout '" + path + "'"), 0) << x;
  }
  // Expected counts from the report: fail and inconclusive are failures, error is an error.
  size_t tests = 0, failures = 0, errors = 0;
  for (const ScenarioResult& s : r.scenarios) {
    for (const Comparison& c : s.comparisons) {
      ++tests;
      failures += c.verdict == Verdict::kFail || c.verdict == Verdict::kInconclusive;
      errors += c.verdict == Verdict::kError;
    }
    if (s.verdict == Verdict::kError) ++tests, ++errors;
  }
  ASSERT_GT(failures, 1u);
  EXPECT_TRUE(has(x, "<testsuites name=\"dsv41\" tests=\"" + std::to_string(tests) + "\" failures=\"" +
                         std::to_string(failures) + "\" errors=\"" + std::to_string(errors) + "\""))
      << x;
  EXPECT_EQ(count(x, "<testsuite "), r.scenarios.size());
  EXPECT_EQ(count(x, "<testcase "), tests);
  EXPECT_EQ(count(x, "<failure type=\"fail\""), 1u);
  EXPECT_EQ(count(x, "<failure type=\"inconclusive\""), 1u);
  EXPECT_EQ(count(x, "<error "), 1u);
  EXPECT_EQ(count(x, "<skipped"), 0u);  // inconclusive never looks like a pass or a skip
  EXPECT_TRUE(has(x, "name=\"ref@cold vs ref-bf16kv@global [teacher-forced]\"")) << x;
  EXPECT_TRUE(has(x, "<system-out>measured: ")) << x;
  EXPECT_TRUE(has(x, "rerun: dsv41 run --scenario &apos;resume&apos;")) << x;
  EXPECT_TRUE(has(x, "no device")) << x;
  // The scenario name "resume <&>"ü" and the note "<after replay>", escaped.
  EXPECT_TRUE(has(x, "name=\"resume &lt;&amp;&gt;&quot;\xC3\xBC\"")) << x;
  EXPECT_TRUE(has(x, "&lt;after replay&gt;")) << x;
  EXPECT_FALSE(has(x, "<after replay>"));
  EXPECT_FALSE(has(x, "<&>"));
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"junit.xml"});
  EXPECT_THAT(error_of([&] { write_junit(dir + "/no/such/dir/j.xml", r); }), HasSubstr("j.xml"));
}

// ---- the text summary ----

TEST(ReportShow, ListsWorstFirstWithTheFirstDivergenceAndItsRerun) {
  const RunReport r = sample_report();
  const std::string text = format_summary(r, 3);
  std::printf("%s", text.c_str());
  EXPECT_TRUE(has(text, "verdict fail (exit 1)")) << text;
  EXPECT_TRUE(has(text, "config tiny")) << text;
  EXPECT_TRUE(has(text, "ref@cold, ref@global, ref-bf16kv@global")) << text;
  const size_t fail = text.find("\n  fail "), inconclusive = text.find("\n  inconclusive "),
               measured = text.find("\n  measured "), pass = text.find("\n  pass ");
  ASSERT_NE(fail, std::string::npos);
  EXPECT_LT(fail, inconclusive);
  EXPECT_LT(inconclusive, measured);
  EXPECT_LT(measured, pass);
  EXPECT_TRUE(has(text, "first divergence: step 1 layer 3 component attn_out nmse=3.5e-05 > 1e-06 (measured)")) << text;
  EXPECT_TRUE(has(text, "worst checked metrics (2 shown; 3 checked, 1 exact passes not shown)")) << text;
  EXPECT_TRUE(has(text, r.scenarios[1].comparisons[0].first_divergence->rerun)) << text;
  EXPECT_TRUE(has(text, "caches not compared: the formats differ")) << text;  // why inconclusive
}

}  // namespace
}  // namespace dsv41::reports
