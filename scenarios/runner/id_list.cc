#include "scenarios/runner/id_list.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "base/error.h"
#include "base/input_file.h"

namespace dsv41::scenarios::runner {
namespace {

int64_t parse_one(const std::string& text, const std::string& where) {
  std::string t = text;
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r')) t.pop_back();
  size_t b = 0;
  while (b < t.size() && (t[b] == ' ' || t[b] == '\t')) ++b;
  t = t.substr(b);
  if (t.empty()) DSV41_FAIL(where, ": empty id");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end == t.c_str() || *end != '\0' || v < 0) {
    DSV41_FAIL(where, ": '", t, "' is not a non-negative integer id");
  }
  return v;
}

}  // namespace

std::vector<int64_t> parse_id_list(const std::string& spec, const std::string& option) {
  std::vector<int64_t> ids;
  if (!spec.empty() && spec[0] == '@') {
    const std::string path = spec.substr(1);
    // The input-file policy (base/input_file.h): a regular file of at most kMaxIdListBytes.
    std::istringstream in(input::read_text_file(path, option + " file", input::kMaxIdListBytes));
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      size_t b = line.find_first_not_of(" \t\r");
      if (b == std::string::npos || line[b] == '#') continue;
      ids.push_back(parse_one(line, option + " " + path + ":" + std::to_string(n)));
    }
    return ids;
  }
  if (spec.empty()) return ids;
  // Items between commas; every item must hold an id ("5,,7" and "5,7," are errors: getline
  // alone would drop a trailing empty item).
  size_t begin = 0;
  for (int n = 1;; ++n) {
    const size_t comma = spec.find(',', begin);
    const std::string item = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    ids.push_back(parse_one(item, option + " item " + std::to_string(n)));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return ids;
}

}  // namespace dsv41::scenarios::runner
