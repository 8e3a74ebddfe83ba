// base/data_dir.h: where the built-in data is read from (docs/install.md), in the order promised.
#include "base/data_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"

namespace {

namespace fs = std::filesystem;

// Sets DSV41_DATA_DIR for one test and puts the old value back.
class DataDirEnv {
 public:
  explicit DataDirEnv(const char* value) {
    if (const char* old = std::getenv("DSV41_DATA_DIR")) old_ = old, had_ = true;
    if (value) setenv("DSV41_DATA_DIR", value, 1);
    else unsetenv("DSV41_DATA_DIR");
  }
  ~DataDirEnv() {
    if (had_) setenv("DSV41_DATA_DIR", old_.c_str(), 1);
    else unsetenv("DSV41_DATA_DIR");
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(DataDir, ABuildInItsCheckoutReadsTheSourceTree) {
  DataDirEnv env(nullptr);
  EXPECT_EQ(fs::canonical(dsv41::data::root()), fs::canonical(DSV41_SOURCE_DIR));
  EXPECT_TRUE(fs::is_regular_file(dsv41::data::file("golden/oracle/weights.safetensors")));
  // The source tree is the last candidate, after the install layouts beside this test binary.
  const auto c = dsv41::data::candidates();
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c.back().path, DSV41_SOURCE_DIR);
}

TEST(DataDir, TheVariableWinsAndAWrongOneIsAnError) {
  const std::string dir = testing::TempDir() + "/dsv41_data_dir_test";
  fs::remove_all(dir);
  fs::create_directories(dir + "/golden/oracle");
  {
    DataDirEnv env(dir.c_str());
    // No marker yet: an error naming the variable and the folder, never a silent fallback.
    try {
      dsv41::data::root();
      FAIL() << "a DSV41_DATA_DIR without golden/oracle/config.json was accepted";
    } catch (const dsv41::Error& e) {
      EXPECT_NE(std::string(e.what()).find("DSV41_DATA_DIR='" + dir + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("golden/oracle/config.json"), std::string::npos) << e.what();
    }
    std::ofstream(dir + "/golden/oracle/config.json") << "{}";
    EXPECT_EQ(dsv41::data::root(), dir);
    EXPECT_EQ(dsv41::data::file("scenarios/configs/small.json"), dir + "/scenarios/configs/small.json");
    EXPECT_EQ(dsv41::data::candidates().front().origin, "$DSV41_DATA_DIR");
  }
  fs::remove_all(dir);
}

TEST(DataDir, AnInstallPrefixBesideTheBinaryIsACandidate) {
  DataDirEnv env(nullptr);
  // This test binary lives in <build>/tests/base: <build>/tests/share/dsv41, <build>/share/dsv41, ...
  const fs::path exe = fs::canonical("/proc/self/exe");
  bool found = false;
  for (const auto& k : dsv41::data::candidates()) {
    if (k.path == (exe.parent_path().parent_path() / "share" / "dsv41").string()) found = true;
  }
  EXPECT_TRUE(found);
}

}  // namespace
