// base/json_limits.h
//
// The nesting limit on every JSON text dsv41 reads (configs, safetensors headers, scenarios,
// port-dump manifests, tolerances, vector manifests), checked on the raw text BEFORE it is parsed:
// nlohmann's parser is iterative, but copying, printing or comparing a parsed value recurses
// once per level, so a 100k-deep value would exhaust the stack. None of dsv41's formats nests
// deeper than a few levels (docs/errors.md).
//
// Example:
//   check_json_nesting(text, "config 'c.json'");   // throws dsv41::Error past kMaxJsonNesting
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/error.h"

namespace dsv41 {

inline constexpr int kMaxJsonNesting = 64;

// Throws "<where>: JSON nested deeper than 64 levels (at byte N)" when arrays and objects nest
// deeper than kMaxJsonNesting; brackets inside strings do not count. Does not validate the JSON.
inline void check_json_nesting(std::string_view text, const std::string& where) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxJsonNesting) {
        DSV41_FAIL(where, ": JSON nested deeper than ", kMaxJsonNesting, " levels (at byte ", i,
                   "); no dsv41 input nests that deep");
      }
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace dsv41
