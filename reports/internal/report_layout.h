// reports/internal/report_layout.h (internal to reports/)
//
// The names of the divergence report's HDF5 layout (docs/report-schema.md): the schema string and
// version, the fixed paths, the column lists the reader (report_read.cc) and the schema check
// (report_schema.cc) expect, and the NN numbering. report_write.cc writes exactly these columns,
// in these orders (the round-trip and schema tests fail otherwise).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dsv41::reports::layout {

inline constexpr const char* kSchema = "dsv41-divergence-report";
inline constexpr int64_t kSchemaVersion = 1;

inline constexpr const char* kMeta = "/meta";
inline constexpr const char* kVolatile = "/meta/volatile";
inline constexpr const char* kWallTimes = "/meta/volatile/wall_times";
inline constexpr const char* kSummary = "/summary";
inline constexpr const char* kScenarios = "/scenarios";

// Columns (name, kind): 's' string, 'i' int64, 'u' uint64, 'f' float64, 'b' uint8 flag.
struct Column {
  const char* name;
  char kind;
};

inline const std::vector<Column>& metrics_columns() {
  static const std::vector<Column> c = {{"step", 'i'},   {"session", 'i'},   {"position", 'i'},
                                        {"layer", 'i'},  {"component", 's'}, {"metric", 's'},
                                        {"value", 'f'},  {"bound", 'f'},     {"higher_is_better", 'b'},
                                        {"origin", 's'}, {"note", 's'},      {"verdict", 's'}};
  return c;
}

inline const std::vector<Column>& steps_columns() {
  static const std::vector<Column> c = {{"step", 'i'},      {"session", 'i'}, {"phase", 's'},
                                        {"start_pos", 'i'}, {"tokens", 'i'},  {"boundaries", 's'}};
  return c;
}

// <comparison>/acceptance: one row per AcceptanceRow, in its field order. Optional on read (a
// file written before the table existed has none: no speculative rounds); always written.
inline const std::vector<Column>& acceptance_columns() {
  static const std::vector<Column> c = {
      {"step", 'i'},        {"session", 'i'},     {"side", 's'},        {"start_pos", 'i'},
      {"proposed", 'i'},    {"verified", 'i'},    {"accepted", 'i'},    {"kept", 'i'},
      {"next_token", 'i'},  {"draft_index", 'i'}, {"draft_token", 'i'}, {"confidence", 'f'},
      {"predicted_survival", 'f'}, {"realised", 'i'}, {"accept_prob", 'f'}};
  return c;
}

inline const std::vector<Column>& summary_columns() {
  static const std::vector<Column> c = {
      {"scenario", 's'}, {"comparison", 'i'}, {"side_a", 's'}, {"side_b", 's'},  {"mode", 's'},
      {"component", 's'}, {"metric", 's'},    {"value", 'f'},  {"step", 'i'},    {"layer", 'i'},
      {"bound", 'f'},    {"higher_is_better", 'b'}, {"origin", 's'}, {"verdict", 's'}, {"rows", 'i'}};
  return c;
}

inline const std::vector<Column>& wall_time_columns() {
  static const std::vector<Column> c = {{"scenario", 's'}, {"comparison", 'i'}, {"seconds", 'f'}};
  return c;
}

// String attributes of the objects (all variable-length UTF-8).
inline const std::vector<const char*>& meta_string_attrs() {
  static const std::vector<const char*> a = {"config_name", "config_hash", "weights", "weights_sha256"};
  return a;
}
inline const std::vector<const char*>& volatile_string_attrs() {
  static const std::vector<const char*> a = {"tool_version", "git_commit", "command_line", "created_utc", "host"};
  return a;
}
inline const std::vector<const char*>& scenario_string_attrs() {
  static const std::vector<const char*> a = {"kind", "description", "source", "verdict", "error"};
  return a;
}
inline const std::vector<const char*>& comparison_string_attrs() {
  static const std::vector<const char*> a = {"side_a", "side_b", "mode", "expectation", "expectation_origin",
                                              "verdict"};
  return a;
}
inline const std::vector<const char*>& divergence_string_attrs() {
  static const std::vector<const char*> a = {"component", "metric", "origin", "note", "detail", "rerun"};
  return a;
}
inline const std::vector<const char*>& tensor_string_attrs() {
  static const std::vector<const char*> a = {"component", "side", "logical_dtype"};
  return a;
}

inline std::string scenario_path(const std::string& name) { return std::string(kScenarios) + "/" + name; }

// "00", "01", ..., "99", "100": the group name of item i (comparisons, tensors).
inline std::string index_name(size_t i) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%02zu", i);
  return buf;
}

}  // namespace dsv41::reports::layout
