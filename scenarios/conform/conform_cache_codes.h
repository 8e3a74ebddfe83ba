// scenarios/conform/conform_cache_codes.h
//
// QUANTIZER-BOUNDARY CHECK of the FP4 caches (cache.compressed_kv, cache.index_keys) under the
// order-variant claim (docs/conform.md "Cache codes"). A correct port's quantizer input differs from
// the reference's by its chain's rounding noise, so a code may flip where the value sits near a
// rounding boundary, which is why decoded_rowrel's bound must hold two sides' whole quantisation
// error (2/3 of the block max for E2M1 + E8M0/32) and a code one step off elsewhere passes it. Here
// the reference's own pre-quantisation rows of the step (recorded in the teacher-forced replay,
// ReplayOps::record_writes) make the check per element:
//   B = chain x max |x| of the entry      (judge::derived_cache_chain_bound: what the input may differ by)
//   a block's scale may be any the format gives for an amax in [amax - B, amax + B];
//   under one such scale s (the same for the whole block), each decoded port value y_i must lie in
//   [q_s(x_i - B), q_s(x_i + B)], q_s the format's rounding (RNE to the E2M1 grid times s, saturated)
//   code_excess = max over entries written this step of min over the block's admissible scales of
//                 max_i distance(y_i, that interval), over the entry's max |x|
// Tolerance 0 (analytic): a flip near a boundary is inside the interval; a code one step off where
// the value is farther than B from any boundary, or a scale no admissible amax gives, is not.
// Entries whose reference bytes are not the quantisation of the recorded rows (a mapping this check
// does not know) are skipped; so are the FP8 window ring (slots, not entries) and DSpark's.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/model/kv_cache.h"
#include "reference/ops/config.h"
#include "reports/report.h"
#include "scenarios/conform/conform_hypotheses.h"

namespace dsv41::scenarios::conform {

inline constexpr const char* kCodeExcessMetric = "code_excess";

// One row (metric code_excess) per FP4 cache of `own` written in this step that `port` holds too.
std::vector<reports::MetricRow> cache_code_rows(const reference::ModelConfig& c, const std::vector<CacheWrite>& writes,
                                                const std::vector<reference::model::CacheView>& own,
                                                const std::vector<reference::model::CacheView>& port, int64_t step,
                                                int64_t position);
// The tolerance of code_excess for a cache component (bound 0, origin "analytic").
reports::Tolerance code_excess_tolerance(const reference::ModelConfig& c, const std::string& component);

}  // namespace dsv41::scenarios::conform
