// base/json_keys.h
//
// Duplicate keys in a JSON input are refused: nlohmann's parser keeps the last of two equal keys
// of one object, so a tolerance file naming a component twice would silently take the second
// (looser) bound. Every dsv41 JSON input read through parse_json_without_duplicates (tolerance
// files, scenarios, sweep plans, port-dump manifests, vector manifests) is refused instead with a
// dsv41::Error naming the file and the key (docs/errors.md, "Classes"). Configs and safetensors
// headers refuse theirs at the top level (reference/ops/config.cc, reference/checkpoint/safetensors.cc).
//
// Example:
//   check_json_nesting(text, where);                               // base/json_limits.h, first
//   const nlohmann::json j = parse_json_without_duplicates(text, where);  // json::exception on bad syntax
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dsv41 {

// nlohmann::json::parse(text), refusing a key that appears twice in one object (at any depth):
// "<where>: key 'K' appears twice in one object (at <path>); ...". Syntax errors throw
// nlohmann::json::exception as json::parse does (callers word them).
inline nlohmann::json parse_json_without_duplicates(std::string_view text, const std::string& where) {
  using json = nlohmann::json;
  struct Open {
    std::set<std::string> keys;
    std::string last;  // the key being parsed (for the path)
  };
  std::vector<Open> open;  // the objects being parsed, innermost last
  const json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == json::parse_event_t::key && !open.empty() && parsed.is_string()) {
      const std::string key = parsed.get<std::string>();
      if (!open.back().keys.insert(key).second) {
        std::string at;
        for (size_t i = 0; i + 1 < open.size(); ++i) at += "." + open[i].last;
        DSV41_FAIL(where, ": key '", key, "' appears twice in one object (at '", at.empty() ? "." : at,
                   "'); JSON would keep only the last, so a duplicate is refused");
      }
      open.back().last = key;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), cb);
}

}  // namespace dsv41
