// base/data_dir.cc: the data root's lookup (data_dir.h).
#include "base/data_dir.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "base/error.h"

#ifndef DSV41_SOURCE_DIR_STRING
#define DSV41_SOURCE_DIR_STRING ""
#endif

namespace dsv41::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMarker = "golden/oracle/config.json";

// The folder of the loaded file that holds this function (the executable or a shared object).
std::string object_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&object_dir), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  fs::path p = fs::canonical(fs::path(info.dli_fname), ec);
  if (ec) {  // the executable named by a relative argv[0]: /proc/self/exe is the same file
    p = fs::canonical("/proc/self/exe", ec);
    if (ec) return {};
  }
  return p.parent_path().string();
}

bool holds_marker(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(fs::path(dir) / kMarker, ec);
}

}  // namespace

std::vector<Candidate> candidates() {
  std::vector<Candidate> out;
  if (const char* env = std::getenv("DSV41_DATA_DIR"); env != nullptr && *env != '\0') {
    out.push_back({env, "$DSV41_DATA_DIR"});
  }
  const std::string obj = object_dir();
  if (!obj.empty()) {
    // The Python package (pip): dsv41/_core.so and dsv41/bin/dsv41 beside dsv41/data.
    out.push_back({(fs::path(obj) / "data").string(), "the package of " + obj});
    out.push_back({(fs::path(obj).parent_path() / "data").string(), "the package of " + obj});
    // An install prefix: <prefix>/bin/dsv41, <prefix>/lib/python3/dist-packages/dsv41/_core.so.
    fs::path up = fs::path(obj);
    for (int level = 0; level < 5 && up.has_relative_path(); ++level) {
      up = up.parent_path();
      out.push_back({(up / "share" / "dsv41").string(), "the install prefix of " + obj});
    }
  }
  if (*DSV41_SOURCE_DIR_STRING != '\0') out.push_back({DSV41_SOURCE_DIR_STRING, "the source tree of this build"});
  return out;
}

std::string root() {
  const std::vector<Candidate> c = candidates();
  // $DSV41_DATA_DIR is an instruction, not a hint: a wrong one is an error, never skipped.
  if (!c.empty() && c.front().origin == "$DSV41_DATA_DIR") {
    DSV41_CHECK(holds_marker(c.front().path), "DSV41_DATA_DIR='", c.front().path, "' holds no ", kMarker,
                " (it must name dsv41's data folder: <prefix>/share/dsv41 or a source checkout)");
    return c.front().path;
  }
  std::string tried;
  for (const Candidate& k : c) {
    if (holds_marker(k.path)) return k.path;
    tried += "\n  " + k.path + " (" + k.origin + ")";
  }
  DSV41_FAIL("dsv41's built-in data (", kMarker, ") was not found; looked in:", tried,
             "\nset DSV41_DATA_DIR to the folder that holds it (an install's <prefix>/share/dsv41)");
}

std::string file(const std::string& relative) { return root() + "/" + relative; }

}  // namespace dsv41::data
