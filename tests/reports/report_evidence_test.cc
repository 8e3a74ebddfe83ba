// Issue 35, class "a verdict needs evidence" (docs/errors.md "Classes"): `report check` refuses a
// comparison whose verdict is pass but whose metric rows (and so its summary rows) were emptied:
// before, such a report was "valid".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "reports/report.h"
#include "tests/reports/report_fixture.h"

namespace dsv41::reports {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using test::sample_report;
using test::temp_dir;

TEST(ReportEvidence, APassWithNoMetricRowsIsInvalid) {
  RunReport r = sample_report();
  Comparison* pass = nullptr;
  std::string scenario;
  for (ScenarioResult& s : r.scenarios) {
    for (Comparison& c : s.comparisons) {
      if (c.verdict == Verdict::kPass && pass == nullptr) {
        pass = &c;
        scenario = s.name;
      }
    }
  }
  ASSERT_NE(pass, nullptr) << "the sample report has a passing comparison";
  ASSERT_FALSE(pass->rows.empty());
  const std::string good = temp_dir() + "/good.h5", bad = temp_dir() + "/bad.h5";
  write_report(good, r);
  EXPECT_THAT(check_report_schema(good), ::testing::IsEmpty()) << "the report with its rows is valid";
  pass->rows.clear();  // the evidence gone, the verdict kept
  write_report(bad, r);
  EXPECT_THAT(check_report_schema(bad),
              Contains(AllOf(HasSubstr("/scenarios/" + scenario + "/comparisons/"),
                             HasSubstr("verdict 'pass' but no checked metric row backs it"))));
}

}  // namespace
}  // namespace dsv41::reports
