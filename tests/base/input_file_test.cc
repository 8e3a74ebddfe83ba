// The input-file policy (base/input_file.h, issue 35 classes 6 and 7): FIFOs, devices and
// directories refused at once (a FIFO without a writer never blocks the open), text inputs bounded
// by their kind's limit before anything is read, reads exact, and the memory checks' arithmetic.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "base/input_file.h"

namespace dsv41::input {
namespace {

std::string dir() {
  const std::string d = testing::TempDir() + "/dsv41_input_file_" + std::to_string(::getpid()) + "_" +
                        testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(d);
  return d;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(InputFile, ReadsARegularFileWhole) {
  const std::string p = dir() + "/a.json";
  std::ofstream(p, std::ios::binary) << "{\"a\": 1}\n";
  const std::string text = read_text_file(p, "config file", kMaxConfigBytes);
  EXPECT_EQ(text, "{\"a\": 1}\n");
  const InputFile f = InputFile::open(p, "config file");
  EXPECT_EQ(f.size(), 9u);
  char buf[3] = {};
  f.read_at(1, buf, 3);
  EXPECT_EQ(std::string(buf, 3), "\"a\"");
  // Past the end: refused, naming the file.
  EXPECT_TRUE(has(error_of([&] { f.read_at(8, buf, 3); }), "config file '" + p + "': ends at byte 9")) << p;
}

TEST(InputFile, AFifoIsRefusedWithoutBlocking) {
  const std::string p = dir() + "/fifo";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { read_text_file(p, "--tolerances file", kMaxToleranceBytes); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(e, "--tolerances file '" + p + "': is a FIFO, not a regular file")) << e;
  EXPECT_LT(s, 5.0);  // no writer ever comes: a blocking open would hang here
  EXPECT_TRUE(has(error_of([&] { require_regular_file(p, "port dump"); }), "port dump '" + p + "': is a FIFO")) << p;
}

TEST(InputFile, DevicesAndDirectoriesAreRefused) {
  EXPECT_TRUE(has(error_of([] { read_text_file("/dev/zero", "config file", kMaxConfigBytes); }),
                  "config file '/dev/zero': is a character device, not a regular file"));
  const std::string d = dir();
  EXPECT_TRUE(has(error_of([&] { InputFile::open(d, "vectors manifest"); }),
                  "vectors manifest '" + d + "': is a directory, not a regular file"));
  EXPECT_TRUE(has(error_of([&] { InputFile::open(d + "/absent", "session file"); }),
                  "session file '" + d + "/absent': cannot open (No such file or directory)"));
}

TEST(InputFile, ASymlinkToARegularFileIsFollowed) {
  const std::string d = dir();
  std::ofstream(d + "/t.txt") << "1\n2\n";
  std::filesystem::create_symlink(d + "/t.txt", d + "/link");
  EXPECT_EQ(read_text_file(d + "/link", "--prompt file", kMaxIdListBytes), "1\n2\n");
}

TEST(InputFile, ATextFileOverItsLimitIsRefusedBeforeReading) {
  // A sparse 5 GiB file: nothing is written, and a read of it would allocate 5 GiB.
  const std::string p = dir() + "/big.json";
  { std::ofstream(p) << "{"; }
  std::filesystem::resize_file(p, uint64_t{5} << 30);
  const std::string e = error_of([&] { read_text_file(p, "config file", kMaxConfigBytes); });
  EXPECT_TRUE(has(e, "config file '" + p + "': 5368709120 bytes (5.0 GiB), over the limit of 16777216 bytes (16.0 MiB)"))
      << e;
  EXPECT_TRUE(has(e, "docs/cli.md \"Limits\"")) << e;
  std::filesystem::remove(p);
}

TEST(InputFile, CheckedArithmeticAndTheMachinesMemory) {
  EXPECT_EQ(checked_mul(uint64_t{1} << 31, 4, "x"), uint64_t{1} << 33);
  EXPECT_TRUE(has(error_of([] { checked_mul(uint64_t{1} << 40, uint64_t{1} << 40, "weights"); }),
                  "weights: 1099511627776 x 1099511627776 overflows 64 bits"));
  EXPECT_TRUE(has(error_of([] { checked_add(UINT64_MAX, 1, "state"); }), "state: 18446744073709551615 + 1 overflows"));
  const uint64_t phys = physical_memory_bytes();
  ASSERT_GT(phys, uint64_t{1} << 26);  // a machine with at least 64 MiB
  EXPECT_NO_THROW(check_memory(1 << 20, "a small table"));
  EXPECT_TRUE(has(error_of([&] { check_memory(phys + 1, "dataset 'x'"); }),
                  "dataset 'x': needs " + std::to_string(phys + 1) + " bytes"));
  EXPECT_TRUE(has(error_of([&] { check_memory(phys + 1, "dataset 'x'"); }), "more than this machine's physical memory"));
  EXPECT_TRUE(has(error_of([] { check_memory(2048, "cache", 1024); }), "cache: needs 2048 bytes (2.0 KiB), over the limit of 1024"));
}

}  // namespace
}  // namespace dsv41::input
