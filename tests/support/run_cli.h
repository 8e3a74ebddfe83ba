// tests/support/run_cli.h
//
// Runs the built `dsv41` executable (DSV41_EXE, a compile definition of the CLI tests) in a shell,
// capturing its exit code, stdout and stderr, inside a per-process scratch directory of the
// running test (ctest runs tests side by side, each as its own process).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace dsv41::test {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The running test's scratch directory: TempDir/dsv41_cli_<pid>_<suite>_<test>.
inline std::string scratch() {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "/dsv41_cli_" + std::to_string(::getpid()) + "_" +
                          t->test_suite_name() + "_" + t->name();
  std::filesystem::create_directories(dir);
  return dir;
}

// `dsv41 <args>`; stdout and stderr go to files "stdout" / "stderr" in scratch().
inline CliResult run_dsv41(const std::string& args) {
  const std::string out = scratch() + "/stdout", err = scratch() + "/stderr";
  const std::string cmd = std::string("'") + DSV41_EXE + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

}  // namespace dsv41::test
