// scenarios/runner/id_list.h
//
// Token-id lists on the command line: "5,723,380" or "@FILE" (one id per line; blank lines and
// lines starting with '#' are skipped). Errors name the option, the line or item, and the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::scenarios::runner {

std::vector<int64_t> parse_id_list(const std::string& spec, const std::string& option);

}  // namespace dsv41::scenarios::runner
