// reports/table.h
//
// TableColumn: one named column of a table as H5Writer writes it (a compound dataset with
// write_table, or a group of equal-length 1-D datasets with write_columns) and H5Reader reads it
// back. A column holds one value per row, of one type: variable-length UTF-8 strings, float64,
// int64, uint64 or uint8 (flags).
//
// Example:
//   std::vector<TableColumn> t = {{"component", std::vector<std::string>{"logits"}},
//                                 {"value", std::vector<double>{0.5}}};
//   w.write_table("/summary", t);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace dsv41::reports {

struct TableColumn {
  using Values = std::variant<std::vector<std::string>, std::vector<double>, std::vector<int64_t>,
                              std::vector<uint64_t>, std::vector<uint8_t>>;
  std::string name;
  Values values;  // [rows]

  size_t size() const {
    return std::visit([](const auto& v) { return v.size(); }, values);
  }
};

}  // namespace dsv41::reports
