// The work-item tables of a sweep report (docs/report-schema.md "Sweeps"): written only when
// RunMeta::items is set, read back field for field by read_report_items, ignored by read_report,
// refused by write_report when an item names no scenario or appears twice, and a broken table is a
// problem for the schema check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>

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

// The sample report as a sweep of its two scenarios.
RunReport sweep_report() {
  RunReport r = sample_report();
  r.meta.items = {
      {"cold_prefill", "cold_prefill", "tiny", "tiny", "3623a3e74f22484c", "file:weights.safetensors", "ab12",
       "ref,ref-bf16kv", "teacher-forced", 7, 1.5e9, 1, "node-a", "", 2.25, "ok"},
      {kFailScenario, "plans/x.json", "small7", "small.json", "0011223344556677", "generated:seed=7", "", "", "",
       uint64_t{1} << 63, 3e12, 0, "node-b", "1: NVIDIA H200", 61.5, "signal 9 (Killed)"},
  };
  return r;
}

TEST(ReportItems, RoundTripKeepsEveryField) {
  const std::string path = temp_dir() + "/items.h5";
  const RunReport in = sweep_report();
  write_report(path, in);
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
  const std::vector<ItemMeta> out = read_report_items(path);
  ASSERT_EQ(out.size(), in.meta.items.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const ItemMeta &a = in.meta.items[i], &b = out[i];
    EXPECT_EQ(a.item, b.item);
    EXPECT_EQ(a.scenario, b.scenario);
    EXPECT_EQ(a.model, b.model);
    EXPECT_EQ(a.config_name, b.config_name);
    EXPECT_EQ(a.config_hash, b.config_hash);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.weights_sha256, b.weights_sha256);
    EXPECT_EQ(a.sides, b.sides);
    EXPECT_EQ(a.modes, b.modes);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_EQ(a.estimated_cost, b.estimated_cost);
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.host, b.host);
    EXPECT_EQ(a.gpu, b.gpu);
    EXPECT_EQ(a.seconds, b.seconds);
    EXPECT_EQ(a.exit, b.exit);
  }
  // read_report reads a sweep report as any other.
  EXPECT_EQ(read_report(path).scenarios.size(), in.scenarios.size());
}

TEST(ReportItems, AReportWithoutItemsHasNoTables) {
  const std::string path = temp_dir() + "/plain.h5";
  write_report(path, sample_report());
  EXPECT_TRUE(read_report_items(path).empty());
  EXPECT_THAT(check_report_schema(path), ::testing::IsEmpty());
}

TEST(ReportItems, WriteRefusesAnItemThatIsNoScenarioOrAppearsTwice) {
  const std::string path = temp_dir() + "/refused.h5";
  RunReport r = sweep_report();
  r.meta.items[1].item = "nosuch";
  EXPECT_THAT(error_of([&] { write_report(path, r); }), HasSubstr("item 'nosuch' is not a scenario of the report"));
  r.meta.items[1].item = "cold_prefill";
  EXPECT_THAT(error_of([&] { write_report(path, r); }), HasSubstr("item 'cold_prefill' appears twice"));
}

TEST(ReportItems, SchemaCheckCatchesABrokenTable) {
  const std::string path = temp_dir() + "/broken.h5";
  write_report(path, sweep_report());
  ASSERT_THAT(check_report_schema(path), ::testing::IsEmpty());
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/meta/volatile/items/rank", H5P_DEFAULT), 0);
  ASSERT_GE(H5Ldelete(f, "/scenarios/cold_prefill", H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::vector<std::string> problems = check_report_schema(path);
  EXPECT_THAT(problems, ::testing::Contains(HasSubstr("/meta/volatile/items/rank: missing")));
  EXPECT_THAT(error_of([&] { read_report_items(path); }), AllOf(HasSubstr(path), HasSubstr("rank")));
}

TEST(ReportItems, SchemaCheckCatchesAnItemThatIsNoScenario) {
  const std::string path = temp_dir() + "/noscenario.h5";
  write_report(path, sweep_report());
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Lmove(f, "/scenarios/cold_prefill", f, "/scenarios/renamed", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  EXPECT_THAT(check_report_schema(path), ::testing::Contains(HasSubstr("item 'cold_prefill' is not a scenario of the file")));
}

}  // namespace
}  // namespace dsv41::reports
