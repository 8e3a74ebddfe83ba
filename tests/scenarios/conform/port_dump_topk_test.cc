// The selections of a port dump at its edges (docs/port-dump.md, "layerNN.topk width"), on the tiny
// oracle model (index_topk 32; layers 2 and 4 Full at ratio 2):
//   - a first step of one token, where a ratio-2 layer has no compressed position yet
//     (N = (0 + 1) / 2 = 0): `forward --dump` records a [1, 0] topk and a [1, 0] index_scores there,
//     so every step holds the same keys, and `conform` passes the dump bit-exactly;
//   - the official code's padded top-k, [T, index_topk] with -1 beyond N, is the same selection:
//     read_port_dump drops the padding, `conform` passes; a padding column holding a position, or
//     a top-k narrower than min(index_topk, N), is refused naming the key and the rule.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reference/model/model.h"
#include "reports/report.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::scenarios::conform::PortDump;
using dsv41::scenarios::conform::read_port_dump;
using dsv41::test::has;
using dsv41::test::scratch;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

// One prompt token, then four decode steps: positions 0 .. 4, N = 0, 1, 1, 2, 2 at ratio 2.
const std::string& one_token_dump() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/dsv41_topk_dump_" + std::to_string(::getpid());
    fs::remove_all(d);
    const dsv41::test::CliResult r = dsv41::test::run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights +
                                                            "' --prompt 7 --decode 5,723,11,300 --dump '" + d + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return d;
  }();
  return dir;
}

std::string copy_dump() {
  const std::string d = scratch() + "/dump";
  fs::remove_all(d);
  fs::copy(one_token_dump(), d);
  return d;
}

std::vector<int32_t> i32(const st::Entry& e) {
  std::vector<int32_t> v(e.bytes.size() / 4);
  std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return v;
}

// Rewrites `key` of step `step` with `edit` applied to its entry.
template <typename F>
void rewrite(const std::string& dir, int64_t step, const std::string& key, F edit) {
  const std::string path = dir + "/" + dsv41::scenarios::conform::dump_step_file(step);
  const st::SafetensorsFile f = st::SafetensorsFile::read(path);
  std::vector<st::Entry> entries;
  for (const std::string& n : f.names()) entries.push_back(f.get(n));
  bool found = false;
  for (st::Entry& e : entries) {
    if (e.name == key) edit(e), found = true;
  }
  if (!found) throw std::runtime_error("no key " + key);
  st::write(path, entries, f.metadata());
}

// [T, w] -> [T, width] with -1 in the new columns.
void pad(st::Entry& e, int64_t width) {
  const int64_t t = e.shape.at(0), w = e.shape.at(1);
  const std::vector<int32_t> v = i32(e);
  std::vector<int32_t> out(static_cast<size_t>(t * width), -1);
  for (int64_t r = 0; r < t; ++r) std::copy_n(v.begin() + r * w, w, out.begin() + r * width);
  e.shape = {t, width};
  e.bytes.resize(out.size() * 4);
  std::memcpy(e.bytes.data(), out.data(), e.bytes.size());
}

dsv41::reports::RunReport judge(const std::string& dir) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  static const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kWeights, c);
  return dsv41::scenarios::conform::conform(read_port_dump(dir), w, dsv41::reference::model::default_token_map(c), {});
}

// The topk rows (rows_equal_frac) the teacher-forced comparison checked at (step, layer).
int topk_rows(const dsv41::reports::RunReport& r, int64_t step, int layer) {
  int n = 0;
  for (const dsv41::reports::Comparison& c : r.scenarios.at(0).comparisons) {
    for (const dsv41::reports::MetricRow& m : c.rows) {
      if (m.component == "topk" && m.metric == "rows_equal_frac" && m.step == step && m.layer == layer) {
        EXPECT_EQ(m.value, 1.0) << c.mode;
        ++n;
      }
    }
  }
  return n;
}

TEST(PortDumpTopk, AOneTokenFirstStepAtRatio2DumpsEmptySelectionsAndConforms) {
  const PortDump d = read_port_dump(one_token_dump());
  ASSERT_EQ(d.steps.size(), 5u);
  for (int layer : {2, 4}) {
    const std::string topk = dsv41::scenarios::conform::dump_key(layer, "topk");
    const std::string scores = dsv41::scenarios::conform::dump_key(layer, "index_scores");
    EXPECT_EQ(d.steps[0].tensors.at(topk).shape, (std::vector<int64_t>{1, 0})) << topk;
    EXPECT_EQ(d.steps[0].tensors.at(scores).shape, (std::vector<int64_t>{1, 0})) << scores;
    for (size_t s = 1; s < d.steps.size(); ++s) {  // N = (s + 1) / 2 >= 1: a real selection, not vacuous
      const int64_t n = static_cast<int64_t>(s + 1) / 2;
      ASSERT_EQ(d.steps[s].tensors.at(topk).shape, (std::vector<int64_t>{1, n})) << topk << " step " << s;
      const std::vector<int32_t> v = i32(d.steps[s].tensors.at(topk));
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [n](int32_t x) { return x >= 0 && x < n; })) << topk << " step " << s;
    }
  }
  const dsv41::test::CliResult r = dsv41::test::run_dsv41("conform '" + one_token_dump() + "' --config '" + kConfig +
                                                          "' --weights '" + kWeights + "' -q -o '" + scratch() + "/r.h5'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "every covered component of every step agrees")) << r.out;
  const dsv41::reports::RunReport rep = dsv41::reports::read_report(scratch() + "/r.h5");
  EXPECT_EQ(rep.verdict, dsv41::reports::Verdict::kPass);
  EXPECT_EQ(topk_rows(rep, 0, 2), 2);  // the [1, 0] selection is judged (both comparisons), and passes
  EXPECT_EQ(topk_rows(rep, 3, 2), 2);
}

TEST(PortDumpTopk, ThePaddedOfficialTopkIsTheSameSelection) {
  const std::string dir = copy_dump();
  for (int64_t step = 0; step < 5; ++step) {
    for (int layer : {2, 4}) rewrite(dir, step, dsv41::scenarios::conform::dump_key(layer, "topk"), [](st::Entry& e) { pad(e, 32); });
  }
  const PortDump padded = read_port_dump(dir), plain = read_port_dump(one_token_dump());
  for (int64_t step = 0; step < 5; ++step) {
    const st::Entry& a = padded.steps[static_cast<size_t>(step)].tensors.at("layer02.topk");
    const st::Entry& b = plain.steps[static_cast<size_t>(step)].tensors.at("layer02.topk");
    EXPECT_EQ(a.shape, b.shape) << "step " << step;  // the padding columns dropped by the reader
    EXPECT_EQ(a.bytes, b.bytes) << "step " << step;
  }
  const dsv41::reports::RunReport rep = judge(dir);
  EXPECT_EQ(rep.verdict, dsv41::reports::Verdict::kPass);
  EXPECT_EQ(topk_rows(rep, 4, 4), 2);
}

TEST(PortDumpTopk, RefusesAPaddingColumnThatSelectsAndANarrowerTopk) {
  const std::string dir = copy_dump();
  rewrite(dir, 3, "layer02.topk", [](st::Entry& e) {
    pad(e, 32);
    const int32_t one = 1;
    std::memcpy(e.bytes.data() + 5 * 4, &one, 4);  // column 5 >= N = 2 selects position 1
  });
  try {
    read_port_dump(dir);
    FAIL() << "a padded top-k with a position in its padding was read";
  } catch (const dsv41::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "step_000003.safetensors") && has(m, "key 'layer02.topk'") && has(m, "column 5 holds 1") &&
                has(m, "N = (start_pos + T) / ratio = (3 + 1) / 2 = 2"))
        << m;
  }
  const std::string narrow = copy_dump();
  rewrite(narrow, 4, "layer04.topk", [](st::Entry& e) {
    e.shape = {1, 1};
    e.bytes.resize(4);
  });
  try {
    read_port_dump(narrow);
    FAIL() << "a top-k narrower than min(index_topk, N) was read";
  } catch (const dsv41::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "key 'layer04.topk' has shape [1, 1]") && has(m, "[T, min(index_topk, N)] = [1, 2]")) << m;
  }
}

}  // namespace
