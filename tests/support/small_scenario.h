// tests/support/small_scenario.h
//
// The small scenario the runner and `dsv41 run` tests share: a 70-token prompt in two chunks, two
// decode steps, a pause, a 6-token follow-up, one more decode step. Steps: 0, 1 prefill chunks;
// 2, 3 decode; 4 resume; 5 prompt; 6 decode. `tail` completes the JSON object (pairs, modes, ...).
//
// Example:
//   Scenario s = parse_scenario(small_scenario_json(R"("pairs": [])"), "test");
#pragma once

#include <string>

namespace dsv41::test {

inline std::string small_scenario_json(const std::string& tail) {
  return R"({
  "name": "small", "kind": "test", "seed": 5,
  "events": [
    {"prompt": [{"random": 70}], "chunk": 40},
    {"decode": 2},
    {"resume": true},
    {"prompt": [{"random": 6}]},
    {"decode": 1}
  ],
  )" + tail + "}";
}

}  // namespace dsv41::test
