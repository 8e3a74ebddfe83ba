// tests/scenarios/conform/conform_partial_test.cc
//
// Partial ports (docs/conform.md "Partial ports", issue 33 item 5), through the dsv41 executable: a
// port that dumps only the components it implements is judged on those. Without --require the
// default coverage rule holds (no logits: exit 3); with --require naming what it covers it exits 0
// when those pass, 3 when one is missing, 1 when a covered one fails (located in JUnit at its
// (component, layer)); the coverage is printed before the verdict; JUnit has one testcase per
// (component, layer) and a <skipped> one per component the dump does not hold.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference/checkpoint/safetensors.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;

using dsv41::test::has;
using dsv41::test::read_bytes;
using Result = dsv41::test::CliResult;

std::string temp(const std::string& name) {
  return testing::TempDir() + "/dsv41_partial_" + std::to_string(::getpid()) + "_" + name;
}

Result run(const std::string& args) { return dsv41::test::run_dsv41(args); }

const std::string kWeights = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/weights.safetensors";
const std::string kJudge = " --config tiny --weights '" + kWeights + "' -q --no-hypotheses";

// The reference's own dump of a 40-token prompt and 2 decode steps (made once).
const std::string& full_dump() {
  static const std::string d = [] {
    const std::string dir = temp("full");
    fs::remove_all(dir);
    const Result r = run("forward --config tiny --weights '" + kWeights + "' --prompt " +
                         [] { std::string p; for (int i = 1; i <= 40; ++i) p += (i > 1 ? "," : "") + std::to_string(i * 7 % 1000); return p; }() +
                         " --decode 5,9 --dump '" + dir + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return dir;
  }();
  return d;
}

// A copy of `src` holding only the components in `keep` (the step keys too); scale: multiply one
// element of `bump` (a dump key) in step `bump_step` by 1.02.
std::string partial_copy(const std::string& name, const std::set<std::string>& keep, const std::string& bump = "",
                         int bump_step = -1) {
  const std::string src = full_dump(), dst = temp(name);
  fs::remove_all(dst);
  fs::create_directories(dst);
  nlohmann::json m = nlohmann::json::parse(std::ifstream(src + "/dump.json"));
  nlohmann::json comps = nlohmann::json::object();
  for (const auto& [c, layers] : m["components"].items()) {
    if (keep.count(c)) comps[c] = layers;
  }
  m["components"] = comps;
  m.erase("not_covered");
  bool bumped = false;
  for (const auto& step : m["steps"]) {
    const std::string file = step["file"].get<std::string>();
    const st::SafetensorsFile f = st::SafetensorsFile::read(src + "/" + file);
    std::vector<st::Entry> out;
    for (const std::string& key : f.names()) {
      const size_t dot = key.find('.');
      std::string c = key.substr(dot + 1);
      if (c.rfind("cache.", 0) == 0) c = c.substr(0, c.find('.', 6));
      else if (c.find('.') != std::string::npos) c = c.substr(0, c.find('.'));
      if (key.rfind("step.", 0) != 0 && !keep.count(c)) continue;
      st::Entry e = f.get(key);
      if (key == bump && step["step"].get<int>() == bump_step) {
        EXPECT_EQ(e.dtype, dsv41::reference::DType::kBF16);
        uint16_t v;
        std::memcpy(&v, e.bytes.data() + 2 * 5, 2);  // element 5: bf16 -> fp32, x1.02, back (truncated)
        uint32_t u = static_cast<uint32_t>(v) << 16;
        float x;
        std::memcpy(&x, &u, 4);
        EXPECT_NE(x, 0.0f);
        x *= 1.02f;
        std::memcpy(&u, &x, 4);
        v = static_cast<uint16_t>(u >> 16);
        std::memcpy(e.bytes.data() + 2 * 5, &v, 2);
        bumped = true;
      }
      out.push_back(std::move(e));
    }
    st::write(dst + "/" + file, out, f.metadata());
  }
  EXPECT_EQ(bumped, !bump.empty());
  std::ofstream(dst + "/dump.json") << m.dump(1);
  return dst;
}

// The attention block alone: what a port of one kernel dumps.
const std::set<std::string> kAttention = {"attn_in", "attn_out"};

TEST(ConformPartial, WithoutRequireTheDefaultRuleHolds) {
  const std::string d = partial_copy("attn_default", kAttention);
  const Result r = run("conform '" + d + "'" + kJudge + " -o '" + temp("a.h5") + "'");
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "no logits")) << r.out;
}

TEST(ConformPartial, RequireWhatItCoversPassesWithSkippedTestcases) {
  const std::string d = partial_copy("attn_ok", kAttention);
  const std::string junit = temp("ok.xml");
  const Result r = run("conform '" + d + "'" + kJudge + " --require attn_in,attn_out -o '" + temp("b.h5") + "' --junit '" + junit + "'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // The coverage comes first, before the summary.
  const size_t cov = r.out.find("coverage, the support matrix"), summary = r.out.find("attn_out: layers");
  ASSERT_NE(cov, std::string::npos) << r.out;
  EXPECT_LT(cov, summary) << r.out;
  EXPECT_TRUE(has(r.out, "logits: not covered")) << r.out;
  const std::string x = read_bytes(junit);
  ASSERT_FALSE(x.empty());
  EXPECT_TRUE(has(x, "name=\"layer00.attn_out\"")) << x;
  EXPECT_TRUE(has(x, "name=\"layer01.attn_in\"")) << x;
  EXPECT_TRUE(has(x, "<skipped message=\"not covered: the dump does not hold logits\"/>")) << x;
  EXPECT_FALSE(has(x, "<failure")) << x;
  EXPECT_FALSE(has(x, "<error")) << x;
}

TEST(ConformPartial, ARequiredComponentMissingIsInconclusive) {
  const std::string d = partial_copy("attn_missing", kAttention);
  const std::string junit = temp("missing.xml");
  const Result r = run("conform '" + d + "'" + kJudge + " --require attn_out,ffn_out -o '" + temp("c.h5") + "' --junit '" + junit + "'");
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "--require names ffn_out, which the dump does not hold")) << r.out;
  const std::string x = read_bytes(junit);
  EXPECT_TRUE(has(x, "required (--require) but not covered: the dump does not hold ffn_out")) << x;
}

TEST(ConformPartial, ACoveredBugFailsAtItsComponentAndLayer) {
  const std::string d = partial_copy("attn_bug", kAttention, "layer01.attn_out", 1);
  const std::string junit = temp("bug.xml");
  const Result r = run("conform '" + d + "'" + kJudge + " --require attn_in,attn_out -o '" + temp("d.h5") + "' --junit '" + junit + "'");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "root cause (teacher-forced): step 1, layer 1, attn_out")) << r.out;
  const std::string x = read_bytes(junit);
  // Every failure in the file is a testcase layer01.attn_out's (one per comparison that judges it).
  int failures = 0;
  for (size_t f = x.find("<failure"); f != std::string::npos; f = x.find("<failure", f + 1)) {
    ++failures;
    const size_t name = x.rfind("<testcase ", f);
    ASSERT_NE(name, std::string::npos);
    EXPECT_TRUE(has(x.substr(name, f - name), "name=\"layer01.attn_out\"")) << x.substr(name, f - name + 200);
  }
  EXPECT_GE(failures, 1) << x;
}

TEST(ConformPartial, AnUnknownRequiredComponentIsBadInput) {
  const Result r = run("conform '" + full_dump() + "'" + kJudge + " --require attn_out,bogus -o '" + temp("e.h5") + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--require 'attn_out,bogus': 'bogus' is not a component")) << r.err;
}

}  // namespace
