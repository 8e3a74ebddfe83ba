// reports/internal/report_replay.h (internal to reports/)
//
// The sampled-replay and per-side tables of a report (docs/report-schema.md, docs/scale.md), one
// row per comparison that has them, keyed by (scenario, comparison index):
//   /meta/replay          stable: seed, steps_total, steps_checked, checked (the steps, "0-3, 7")
//   /meta/volatile/sides  volatile: per side "a"/"b" its spec, seconds, peak_device_bytes and
//                         device_in_use_bytes (-1: not a device side)
// Written only when a comparison has them; a report without them reads back without.
#pragma once

#include <string>
#include <vector>

#include "reports/h5_reader.h"
#include "reports/h5_writer.h"
#include "reports/internal/report_layout.h"
#include "reports/report.h"

namespace dsv41::reports {

inline constexpr const char* kReplayTable = "/meta/replay";
inline constexpr const char* kSidesTable = "/meta/volatile/sides";

// The columns of the two tables, in the order write_replay_tables writes them.
inline const std::vector<layout::Column>& replay_columns() {
  static const std::vector<layout::Column> c = {{"scenario", 's'},    {"comparison", 'i'},    {"seed", 'u'},
                                                {"steps_total", 'i'}, {"steps_checked", 'i'}, {"checked", 's'}};
  return c;
}
inline const std::vector<layout::Column>& side_columns() {
  static const std::vector<layout::Column> c = {{"scenario", 's'},          {"comparison", 'i'}, {"side", 's'},
                                                {"spec", 's'},              {"seconds", 'f'},
                                                {"peak_device_bytes", 'i'}, {"device_in_use_bytes", 'i'}};
  return c;
}

void write_replay_tables(H5Writer& w, const RunReport& r);
// Fills Comparison::replay and Comparison::sides from the tables (absent tables: nothing).
void read_replay_tables(const H5Reader& r, RunReport& report);
// The summary lines of a comparison: "sampled replay: ..." and one per measured side.
std::vector<std::string> replay_lines(const Comparison& c);

}  // namespace dsv41::reports
