// The built-in scenario suite (scenarios/suite/NN_<name>.json, compiled in by CMake into
// suite_data.cc). The file name without its NN_ prefix and .json is the scenario's name.
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

const std::vector<std::pair<std::string, std::string>>& builtin_suite_files();  // suite_data.cc

namespace {

std::string suite_name(const std::string& file) {
  const size_t us = file.find('_');
  const std::string stem = file.substr(0, file.size() - 5);  // drop ".json"
  return us == std::string::npos ? stem : stem.substr(us + 1);
}

}  // namespace

std::vector<std::string> builtin_scenario_names() {
  std::vector<std::string> out;
  for (const auto& [file, text] : builtin_suite_files()) out.push_back(suite_name(file));
  return out;
}

Scenario builtin_scenario(const std::string& name) {
  for (const auto& [file, text] : builtin_suite_files()) {
    if (suite_name(file) != name) continue;
    Scenario s = parse_scenario(text, "builtin:" + name);
    DSV41_CHECK(s.name == name, "built-in scenario file scenarios/suite/", file, " names itself '", s.name,
                "', not '", name, "'");
    return s;
  }
  DSV41_FAIL("no built-in scenario '", name, "'");
}

}  // namespace dsv41::scenarios::runner
