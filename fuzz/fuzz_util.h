// fuzz/fuzz_util.h
//
// Helpers shared by the libFuzzer targets (fuzz/README.md): the contract every parser is fuzzed
// against is "succeed or throw dsv41::Error". accept() runs a parse and swallows only
// dsv41::Error, so any other exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it
// as a crash ("deadly signal" after std::terminate), as it does for ASan/UBSan reports, leaks
// (-detect_leaks=1, the default) and hangs (-timeout).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "base/error.h"

namespace dsv41::fuzz {

template <typename F>
void accept(F&& parse) {
  try {
    parse();
  } catch (const dsv41::Error&) {
    // the parser refused the input: the expected outcome for most inputs
  }
}

// A scratch folder of this process ($TMPDIR or /tmp, then dsv41-fuzz-<pid>), created once.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("dsv41-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes bytes to path (replacing it).
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path.string());
}

// The bytes as a string / a string_view.
inline std::string_view view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace dsv41::fuzz
