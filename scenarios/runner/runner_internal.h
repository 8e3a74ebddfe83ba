// scenarios/runner/runner_internal.h (internal to the runner): metric rows the runner adds besides
// compare_step's (scenarios/runner/runner.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/model/kv_cache.h"
#include "reports/report.h"
#include "scenarios/runner/capture.h"

namespace dsv41::scenarios::runner {

// Recall of A's selected positions by B at a probe step, split by the distance of each position
// (its group's first token) to the session's last resume boundary: probe_count[...] and
// probe_recall[...] rows of every index layer (docs/scenarios.md).
void probe_rows(const StepCapture& a, const StepCapture& b, int64_t step, int session, int64_t boundary,
                const reference::ModelConfig& c, std::vector<reports::MetricRow>& rows);

// The global bytes one side holds (`which`: "a" or "b"): the bytes of its compressed_kv and
// index_keys views after `tokens` tokens, against `dsv41 bytes`
// (reference::session::global_bytes_for_tokens). Rows of component "global_bytes.<which>": bytes_per_token
// and bytes_per_token_expected (recorded), held_minus_expected (|held - expected| bytes, bound 0,
// analytic). *detail: empty when equal, else what differs.
std::vector<reports::MetricRow> global_bytes_rows(const std::vector<reference::model::CacheView>& views, int64_t tokens,
                                                  const reference::ModelConfig& c, const std::string& which,
                                                  int64_t step, int session, std::string* detail);

}  // namespace dsv41::scenarios::runner
