// The dsv41 executable end to end: exit codes 0 / 1 / 2 and what it prints (docs/cli.md).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Files named after the running test, so ctest -j can run tests side by side.
std::string temp_path(const std::string& suffix) {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "/dsv41_cli_test_" + t->test_suite_name() + "_" + t->name() + suffix;
}

Result run(const std::string& args) {
  const std::string out = temp_path(".out"), err = temp_path(".err");
  const std::string cmd =
      std::string("'") + DSV41_EXE + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

std::string write_temp(const std::string& text) {
  const std::string path = temp_path(".json");
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CliTool, HelpListsTheVerbs) {
  const Result r = run("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "bytes ")) << r.out;
  EXPECT_TRUE(has(r.out, "selfcheck ")) << r.out;
  EXPECT_TRUE(has(r.out, "--version")) << r.out;
}

// issue 33 item 7: every verb's --help shows its options' defaults, its exit codes and one example.
TEST(CliTool, EveryVerbsHelpShowsDefaultsExitCodesAndAnExample) {
  for (const char* verb : {"bytes", "selfcheck", "forward", "weights", "replay-study", "run", "report", "agree", "conform",
                           "selftest", "exact", "vectors", "sweep", "layer-config", "import-official"}) {
    const Result r = run(std::string(verb) + " --help");
    EXPECT_EQ(r.code, 0) << verb << ": " << r.err;
    EXPECT_TRUE(has(r.out, "Exit codes: ")) << verb << ":\n" << r.out;
    EXPECT_TRUE(has(r.out, "\nExample:\n  dsv41 " + std::string(verb))) << verb << ":\n" << r.out;
  }
  EXPECT_TRUE(has(run("conform --help").out, "-o,--output TEXT=conform.h5"));  // a default shown
  EXPECT_TRUE(has(run("weights --help").out, "--seed UINT:SEED=0"));
}

TEST(CliTool, VersionNamesTheCommit) {
  const Result r = run("--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("dsv41 ", 0), 0u) << r.out;
  EXPECT_TRUE(has(r.out, "(git ")) << r.out;
}

TEST(CliTool, NoVerbIsBadArguments) {
  const Result r = run("");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("dsv41: error: ", 0), 0u) << r.err;
}

TEST(CliTool, UnknownOptionIsBadArguments) {
  const Result r = run("bytes --config full --bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "dsv41: error: ")) << r.err;
  EXPECT_TRUE(has(r.err, "--bogus")) << r.err;
}

TEST(CliBytes, FullPresetPrints890) {
  const Result r = run("bytes --config full");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "global bytes per token: 890\n")) << r.out;
  EXPECT_TRUE(has(r.out, "890000000 B = 890.000 MB")) << r.out;
  EXPECT_TRUE(has(r.out, "848.770 MiB")) << r.out;
  EXPECT_TRUE(has(r.out, "2906112 B = 43 layers x 128 slots x 528 B")) << r.out;
}

TEST(CliBytes, ReleasedConfigFilePrints890) {
  const std::string path = std::string(DSV41_ORACLE_DIR) + "/config_full.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing " << path;
  const Result r = run("bytes --config '" + path + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "global bytes per token: 890\n")) << r.out;
}

TEST(CliBytes, JsonHasTheDocumentedFields) {
  const Result r = run("bytes --config full --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("global_bytes_per_token"), 890);
  EXPECT_EQ(j.at("global_bytes_per_token_exact"), "890");
  ASSERT_EQ(j.at("per_owner").size(), 4u);
  EXPECT_EQ(j.at("per_owner")[0].at("layer"), 2);
  EXPECT_EQ(j.at("per_owner")[0].at("bytes_per_token"), 178);
  EXPECT_EQ(j.at("per_owner")[3].at("ratio"), 1);
  EXPECT_EQ(j.at("tokens_1m").at("bytes"), 890000000);
  EXPECT_EQ(j.at("window_kv_bytes_per_session"), 2906112);
  EXPECT_EQ(j.at("compressor_partial_bytes_per_session"), 12288);
  EXPECT_EQ(j.at("config_hash").get<std::string>().size(), 16u);
}

TEST(CliBytes, TinyJson) {
  const Result r = run("bytes --config tiny --json");
  ASSERT_EQ(r.code, 0) << r.err;
  // 212 derived by hand in tests/reference/session/byte_accounting_test.cc.
  EXPECT_EQ(nlohmann::json::parse(r.out).at("global_bytes_per_token"), 212);
}

TEST(CliBytes, UnknownPresetIsBadInput) {
  const Result r = run("bytes --config huge");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "dsv41: error: unknown preset 'huge'")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CliBytes, MissingFileIsBadInput) {
  const Result r = run("bytes --config /nonexistent/config.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "dsv41: error: config file '/nonexistent/config.json': cannot open"))
      << r.err;
}

TEST(CliBytes, MalformedJsonIsBadInput) {
  const std::string path = write_temp("{\"dim\": 256,,}");
  const Result r = run("bytes --config '" + path + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "dsv41: error: config file '" + path + "': not valid JSON")) << r.err;
  EXPECT_TRUE(has(r.err, "line 1")) << r.err;
}

TEST(CliBytes, InvalidFieldIsBadInput) {
  const std::string path = write_temp("{\"dim\": 256}");
  const Result r = run("bytes --config '" + path + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "field '")) << r.err;
  EXPECT_TRUE(has(r.err, "missing required key")) << r.err;
}

TEST(CliBytes, ConfigOptionIsRequired) {
  const Result r = run("bytes");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--config")) << r.err;
}

TEST(CliSelfcheck, Passes) {
  const Result r = run("selfcheck");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, " passed, 0 failed\n")) << r.out;
  EXPECT_FALSE(has(r.out, "FAIL")) << r.out;
}

TEST(CliSelfcheck, FailedCheckExits1) {
  const Result r = run("selfcheck --inject-failure");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, ", 1 failed\n")) << r.out;
}

}  // namespace
