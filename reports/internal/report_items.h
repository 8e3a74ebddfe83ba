// reports/internal/report_items.h (internal to reports/)
//
// The work-item tables of a sweep report (docs/report-schema.md "Sweeps", docs/sweep.md):
// /meta/items (what each item ran: stable) and /meta/volatile/items (where it ran and for how
// long: volatile), one row per item in plan order, both keyed by the `item` column. Written by
// write_report only when RunMeta::items is not empty; a report without them is a `dsv41 run` one.
#pragma once

#include <string>
#include <vector>

#include "reports/h5_writer.h"
#include "reports/internal/report_layout.h"
#include "reports/report.h"

namespace dsv41::reports::layout {

inline constexpr const char* kItems = "/meta/items";
inline constexpr const char* kVolatileItems = "/meta/volatile/items";

inline const std::vector<Column>& item_columns() {
  static const std::vector<Column> c = {
      {"item", 's'},           {"scenario", 's'}, {"model", 's'}, {"config_name", 's'}, {"config_hash", 's'},
      {"weights", 's'},        {"weights_sha256", 's'}, {"sides", 's'}, {"modes", 's'}, {"seed", 'u'},
      {"estimated_cost", 'f'}};
  return c;
}

inline const std::vector<Column>& volatile_item_columns() {
  static const std::vector<Column> c = {{"item", 's'}, {"rank", 'i'},    {"host", 's'},
                                        {"gpu", 's'},  {"seconds", 'f'}, {"exit", 's'}};
  return c;
}

}  // namespace dsv41::reports::layout

namespace dsv41::reports {

// Writes both tables (nothing when `items` is empty). Refuses (dsv41::Error) an item that names no
// scenario of the report, or two rows for one item: checked by validate_items before the file is
// touched.
void validate_items(const RunReport& report);
void write_items(H5Writer& w, const std::vector<ItemMeta>& items);

}  // namespace dsv41::reports
