// scenarios/agree/agree_internal.h
//
// Internal to `dsv41 agree` (scenarios/agree/agree.h): what the teacher-forced comparison
// (agree.cc), the free-running one (agree_free.cc), the DSpark rows (agree_dspark.cc) and the run
// driver (agree_report.cc) share.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "reports/report.h"
#include "scenarios/agree/agree.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/agree/oracle_run.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::agree::agree_detail {

// A comparison of float values in rows of `row` values (a token's vector, one stream copy).
struct StreamDiff {
  double nmse = 0;          // sum (a - b)^2 / sum b^2
  double max_row_ulps = 0;  // max over rows of max |a - b| / (bf16 ulp of the row's max |b|)
  double equal_frac = 1;    // values with equal bits
  bool nonzero = false;     // some value of `got` is not zero
  bool finite = true;       // every value of `got` is finite
};
StreamDiff compare_rows(const std::vector<float>& got, const std::vector<float>& ref, int64_t row);

// Adds rows to a comparison at the current step; the first failing row becomes its first
// divergence (with `detail` and `rerun`).
struct RowSink {
  reports::Comparison* cmp = nullptr;
  int64_t step = 0, position = 0;
  std::string detail = "", rerun = "";
  void add(int layer, const std::string& component, const std::string& metric, double value,
           std::optional<dsv41::reports::Tolerance> tol);
};

// The mixes' budget row (docs/mhc.md): `ours` against `official`, both from the stream `x` through
// the weights `w`; adds `<name>` budget_ratio <= 1 (analytic) and returns whether it holds.
bool add_mixes_budget_row(RowSink& sink, int layer, const std::string& name, const reference::HcMixes& ours,
                          const reference::HcMixes& official, const reference::Tensor<float>& x,
                          const reference::HcWeights& w, const reference::ModelConfig& c);

// An official item's values, flattened (its leading batch dimension of 1 dropped).
std::vector<float> official_values(const golden::H5File& f, const std::string& item, bool bf16);
// v's values replaced by `values` (same count, else a dsv41::Error naming `what`).
void copy_into(reference::Tensor<float>& v, std::vector<float> values, const std::string& what);

// The window rows in front of the compressed rows of the official sparse-attention indices:
// the step's tokens in a prefill, window_size in a decode step (the official ring).
int64_t official_topk_offset(const OracleStep& st, const reference::ModelConfig& c);

// The backend's defect, if any, around the agreement's own hooks.
struct Defect {
  std::optional<defects::Mutation> mutation;
  bool fired = false;
  reference::model::ForwardHooks wrap(const reference::model::ForwardHooks& inner, const reference::ModelConfig& c,
                               const OracleStep& st);
};

// "coverage: ...": what the run holds and the mode compares (streams, selections, attention
// internals, final caches, DSpark items), one note of each comparison (docs/agreement.md, "Coverage").
std::string coverage_note(const OracleRun& run, bool forced);
// The caches after the run against the official final state (every value bit for bit, the
// compressor state within kAgreeCompressorMaxUlps).
void final_state_rows(const OracleRun& run, const reference::model::Model& model, const reference::model::ModelState& state,
                      RowSink& sink);
// DSpark (scenarios/agree/agree_dspark.cc): does the run hold draft outputs; the rings of `state`
// against the official ones in `group` ("prefill/state/", "decode/final_state/"), bit for bit;
// the rows of one teacher-forced step (main_x: the reference's own, captured in the step, or
// null) and of one free-running step (the draft after `last_token`, the step's own argmax).
bool run_has_dspark(const OracleRun& run);
void dspark_ring_rows(const OracleRun& run, const reference::model::Model& model, const reference::model::ModelState& state,
                      const golden::H5File& f, const std::string& group, RowSink& sink);
struct DSparkStep {
  bool drafted = false;     // the step held a draft and it was compared
  bool attributed = false;  // beyond the head's bounds and attributed (agree_dspark.cc)
  // Attributed with the block internals, every attention output bit-exact: the mixes alone, within
  // their derived budget, explain it (not counted against kAgreeDraftMaxAttributedFrac).
  bool mixes_only = false;
};
DSparkStep dspark_teacher_forced_rows(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                                      const reference::model::ModelState& state, const reference::Tensor<float>* main_x,
                                      Defect& defect, bool attribute, RowSink& sink);
void dspark_free_rows(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                      const reference::model::ModelState& state, int64_t last_token, Defect& defect, RowSink& sink);

reports::Comparison teacher_forced(const OracleRun& run, reference::model::Model& model, const AgreeOptions& o,
                                   Defect& defect, std::vector<reports::StepInfo>& steps);
reports::Comparison free_running(const OracleRun& run, reference::model::Model& model, const AgreeOptions& o, Defect& defect,
                                 std::vector<reports::StepInfo>& steps);

}  // namespace dsv41::scenarios::agree::agree_detail
