// scenarios/selftest/calibration_official.cc: the official code as a member of the calibration set
// (calibration.h calibrate_official): an official run imported as a port dump
// (scenarios/agree/official_dump.h) and judged by conform under the order-variant claim, with the
// official code's known differences waived by name.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "reference/checkpoint/weights.h"
#include "reference/model/model.h"
#include "scenarios/agree/official_dump.h"
#include "scenarios/agree/oracle_run.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/selftest/calibration.h"

namespace dsv41::scenarios::selftest {

namespace fs = std::filesystem;

std::vector<std::string> golden_official_runs() {
  const fs::path golden = fs::path(builtin_oracle_file("config.json")).parent_path().parent_path();
  std::vector<std::string> runs = {(golden / "oracle").string()};
  std::vector<std::string> more;
  if (fs::is_directory(golden / "runs")) {
    for (const fs::directory_entry& e : fs::directory_iterator(golden / "runs")) {
      if (e.is_directory()) more.push_back(e.path().string());
    }
  }
  std::sort(more.begin(), more.end());
  runs.insert(runs.end(), more.begin(), more.end());
  return runs;
}

CalibrationRow calibrate_official(const std::string& run_dir, const std::string& root, bool keep) {
  CalibrationRow row;
  row.variant = "official";
  row.scenario = fs::path(run_dir).lexically_normal().filename().string();
  if (row.scenario.empty()) row.scenario = fs::path(run_dir).lexically_normal().parent_path().filename().string();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dump = root + "/official." + row.scenario;
  try {
    fs::remove_all(dump);
    const agree::OracleRun run = agree::OracleRun::open(run_dir);
    const agree::ImportSummary s = agree::import_official(run, dump, "dsv41 selftest --calibration (official " + run_dir + ")");
    const reference::checkpoint::ModelWeights weights = reference::checkpoint::ModelWeights::load(run.weights_path(), run.config());
    const std::vector<int64_t> token_map =
        run.token_map().empty() ? reference::model::default_token_map(run.config()) : run.token_map();
    conform::ConformOptions co;
    co.name = "official " + row.scenario;
    co.order_variant = true;
    co.tolerances_file = s.waivers_file;
    const reports::RunReport report = conform::conform(conform::read_port_dump(dump), weights, token_map, co);
    row.changed = true;  // another implementation: its own sums, its torch order
    record_conform(report, row);
    row.verdict = row.conform_exit != 0 ? "ALARM" : "ok";
  } catch (const std::exception& e) {
    row.verdict = "ERROR";
    row.root_cause = e.what();
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!keep) {
    fs::remove_all(dump);
    fs::remove(dump + ".known_differences.json");
    fs::remove(dump + ".token_map.txt");
  }
  return row;
}

}  // namespace dsv41::scenarios::selftest
