// base/json_context.h
//
// One mechanism for JSON fields of the wrong type (issue 35, class 11): a nlohmann::json exception
// (type_error from get<>() / value() on a field of another type, out_of_range from at()) escaping
// the parse of a file is rethrown as a dsv41::Error naming the file and the field, instead of
// reaching the CLI as "unexpected failure: [json.exception.type_error.302] ...".
// typed_value() reads an optional field and names its key when the type is wrong.
//
// Example:
//   return json_context("vectors manifest '" + path + "'", [&] { return parse(j); });
//   const std::string tool = typed_value(j, "tool", std::string(), where);
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dsv41 {

// "type must be string, but is number" from "[json.exception.type_error.302] type must be ...".
inline std::string json_reason(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s = s.substr(close + 2);
  }
  return s;
}

// Runs parse(); a nlohmann::json::exception escaping it becomes
// "<where>: a field has the wrong type or is missing (<reason>)".
template <typename F>
auto json_context(const std::string& where, F&& parse) -> decltype(parse()) {
  try {
    return std::forward<F>(parse)();
  } catch (const nlohmann::json::exception& e) {
    DSV41_FAIL(where, ": a field has the wrong type or is missing (", json_reason(e), ")");
  }
}

// o[key] as T, or fallback when o has no key; "<where>: '<key>': must be <type of fallback>, got
// <json type>" when the value has another type.
template <typename T>
T typed_value(const nlohmann::json& o, const std::string& key, const T& fallback, const std::string& where) {
  if (!o.is_object() || !o.contains(key)) return fallback;
  const nlohmann::json& v = o[key];
  try {
    return v.get<T>();
  } catch (const nlohmann::json::exception& e) {
    DSV41_FAIL(where, ": '", key, "': ", json_reason(e), " (got ", v.type_name(), ")");
  }
}

}  // namespace dsv41
