// `dsv41 conform` (scenarios/conform/conform.h, docs/conform.md) on the tiny oracle model: the reference's
// own dump (`dsv41 forward --dump`) passes bit-exactly with exit 0; a dump with one component
// perturbed at one layer and step fails with that component, layer and step as the root cause (not
// a later one); a perturbed cache byte fails in the caches; a block-planar index cache is diagnosed
// as a layout error; a dump without logits is too thin (exit 3); corrupt dumps exit 2 naming the
// key; a tolerance file replaces the bit-exact default and the report records it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/cache_format.h"
#include "base/error.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::reports::Verdict;
using dsv41::scenarios::conform::ConformOptions;
using dsv41::scenarios::conform::dump_key;
using dsv41::scenarios::conform::PortDump;
using dsv41::scenarios::conform::read_port_dump;
using dsv41::scenarios::conform::RootCause;
using dsv41::test::has;
using dsv41::test::scratch;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

// 70 prompt tokens in chunks of 48 (48, 22: the 64-slot window wraps), then 2 decode steps.
std::string id_list(int64_t n, int64_t mul) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) s += ',';
    s += std::to_string((i * mul + 11) % 1024);
  }
  return s;
}

const std::string& reference_dump() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/dsv41_conform_dump_" + std::to_string(::getpid());
    fs::remove_all(d);
    const dsv41::test::CliResult r = dsv41::test::run_dsv41(
        "forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt " + id_list(70, 37) +
        " --chunk 48 --decode 5,723 --dump '" + d + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return d;
  }();
  return dir;
}

std::string copy_dump() {
  const std::string d = scratch() + "/dump";
  fs::remove_all(d);
  fs::copy(reference_dump(), d);
  return d;
}

template <typename F>
void rewrite_step(const std::string& dir, int64_t step, F edit) {
  const std::string path = dir + "/" + dsv41::scenarios::conform::dump_step_file(step);
  const st::SafetensorsFile f = st::SafetensorsFile::read(path);
  std::vector<st::Entry> entries;
  for (const std::string& n : f.names()) entries.push_back(f.get(n));
  std::map<std::string, std::string> meta = f.metadata();
  edit(entries, meta);
  st::write(path, entries, meta);
}

st::Entry& entry(std::vector<st::Entry>& es, const std::string& key) {
  for (st::Entry& e : es) {
    if (e.name == key) return e;
  }
  throw std::runtime_error("no key " + key);
}

// The in-process judgement (weights loaded once).
dsv41::reports::RunReport judge(const std::string& dir, const ConformOptions& o = {}) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  static const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kWeights, c);
  const PortDump d = read_port_dump(dir);
  return dsv41::scenarios::conform::conform(d, w, dsv41::reference::model::default_token_map(c), o);
}

std::string conform_cli(const std::string& dir, const std::string& extra = "") {
  return "conform '" + dir + "' --config '" + kConfig + "' --weights '" + kWeights + "' -q -o '" + scratch() +
         "/r.h5'" + extra;
}

// The first layer the dump holds `component` at.
int first_layer(const std::string& component) {
  const PortDump d = read_port_dump(reference_dump());
  const auto it = d.components.find(component);
  if (it == d.components.end() || it->second.empty()) throw std::runtime_error("the dump holds no " + component);
  return it->second.front();
}

// A float entry's values (BF16 or F32), to check they are not vacuous before comparing.
std::vector<float> values(const st::Entry& e) {
  std::vector<float> v;
  for (int64_t i = 0; i < e.numel(); ++i) {
    uint32_t u = 0;
    if (e.dtype == dsv41::reference::DType::kBF16) {
      u = static_cast<uint32_t>(e.bytes[2 * i] | (e.bytes[2 * i + 1] << 8)) << 16;
    } else {
      std::memcpy(&u, &e.bytes[4 * i], 4);
    }
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  return v;
}

void expect_meaningful(const st::Entry& e) {
  const std::vector<float> v = values(e);
  ASSERT_FALSE(v.empty()) << e.name;
  EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; })) << e.name << " is all zero";
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return !std::isnan(x); })) << e.name << " holds NaN";
}

TEST(Conform, ReferenceDumpPassesBitExactly) {
  const PortDump d = read_port_dump(reference_dump());
  ASSERT_GE(d.steps.size(), 4u);
  for (const char* k : {"model.logits", "layer03.attn_out", "layer03.out_stream"}) expect_meaningful(d.steps[1].tensors.at(k));
  const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(reference_dump(), " --junit '" + scratch() + "/j.xml'"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "every covered component of every step agrees")) << r.out;
  EXPECT_TRUE(has(r.out, "support matrix")) << r.out;
  EXPECT_TRUE(dsv41::reports::check_report_schema(scratch() + "/r.h5").empty());
  const dsv41::reports::RunReport rep = dsv41::reports::read_report(scratch() + "/r.h5");
  EXPECT_EQ(rep.verdict, Verdict::kPass);
  ASSERT_EQ(rep.scenarios.size(), 1u);
  ASSERT_EQ(rep.scenarios[0].comparisons.size(), 2u);
  // Bit-exact: every exactness row checked at its bound of 1, for the kinds of output a port shows.
  std::map<std::string, int> checked;
  for (const dsv41::reports::Comparison& c : rep.scenarios[0].comparisons) {
    EXPECT_EQ(c.verdict, Verdict::kPass) << c.mode;
    for (const dsv41::reports::MetricRow& m : c.rows) {
      if (m.metric == "bit_equal_frac" || m.metric == "rows_equal_frac" || m.metric == "bytes_equal_frac" ||
          m.metric == "equal_frac") {
        ASSERT_TRUE(m.tolerance.has_value()) << m.component << " " << m.metric;
        EXPECT_EQ(m.tolerance->bound, 1.0);
        EXPECT_EQ(m.value, 1.0) << m.component << " layer " << m.layer << " step " << m.step;
        ++checked[m.component];
      }
    }
  }
  for (const char* c : {"attn_out", "out_stream", "hc_attn_comb", "topk", "experts", "candidates", "engram_ids",
                        "logits", "cache.index_keys", "cache.compressed_kv", "cache.window_kv"}) {
    EXPECT_GT(checked[c], 0) << c << " was never checked";
  }
  EXPECT_TRUE(dsv41::test::read_bytes(scratch() + "/j.xml").find("<testcase") != std::string::npos);
  const dsv41::test::CliResult show = dsv41::test::run_dsv41("report show '" + scratch() + "/r.h5'");
  EXPECT_EQ(show.code, 0) << show.err;
  EXPECT_TRUE(has(show.out, "teacher-forced")) << show.out;
}

// One element of (layer, component) at `step` nudged by one unit in the last place, or doubled
// or halved (its exponent's lowest bit flipped: large enough to show in the components downstream too).
void nudge(const std::string& dir, int64_t step, int layer, const std::string& component, bool scaled = false) {
  rewrite_step(dir, step, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
    st::Entry& e = entry(es, dump_key(layer, component));
    expect_meaningful(e);
    const std::vector<float> v = values(e);
    size_t i = v.size() / 2;
    while (i < v.size() && v[i] == 0.0f) ++i;  // a nonzero element (a nudged zero would be denormal)
    ASSERT_LT(i, v.size());
    const size_t width = e.dtype == dsv41::reference::DType::kBF16 ? 2 : 4;
    if (scaled) {
      e.bytes[i * width + width - 2] ^= 0x80;  // the exponent's lowest bit (bf16 bits 7, fp32 bits 23)
      const std::vector<float> after = values(e);
      ASSERT_TRUE(std::isfinite(after[i]) && after[i] != v[i]);
    } else {
      e.bytes[i * width] ^= 1;
    }
  });
}

struct Planted {
  std::string component;
  int layer;
  int64_t step;
};

class ConformLocates : public testing::TestWithParam<Planted> {};

TEST_P(ConformLocates, RootCauseIsThePerturbedComponent) {
  const Planted p = GetParam();
  const std::string dir = copy_dump();
  if (p.component == "experts") {
    rewrite_step(dir, p.step, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
      st::Entry& e = entry(es, dump_key(p.layer, p.component));
      int32_t* x = reinterpret_cast<int32_t*>(e.bytes.data());
      const int64_t k = e.shape[1];
      std::vector<int32_t> row(x, x + k);
      int32_t other = 0;
      while (std::find(row.begin(), row.end(), other) != row.end()) ++other;  // an expert the row lacks
      x[0] = other;
    });
  } else {
    nudge(dir, p.step, p.layer, p.component, /*scaled=*/true);
  }
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 1);
  const std::optional<RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->mode, dsv41::scenarios::conform::kConformTeacherForced);
  EXPECT_EQ(rc->component, p.component) << rc->detail;
  EXPECT_EQ(rc->layer, p.layer);
  EXPECT_EQ(rc->step, p.step);
  EXPECT_TRUE(has(rc->repro, "--stop-after-step " + std::to_string(p.step))) << rc->repro;
  // The perturbation shows downstream too (the test is not vacuous), yet the root cause is first.
  int fails = 0;
  for (const std::string& n : r.scenarios[0].comparisons[0].notes) fails += n.rfind("FAIL ", 0) == 0;
  EXPECT_GE(fails, 2);
  // The repro judges only that row and fails the same way.
  ConformOptions o;
  o.stop_after_step = p.step;
  o.only = p.component + "@" + std::to_string(p.layer);
  const dsv41::reports::RunReport again = judge(dir, o);
  const std::optional<RootCause> rc2 = dsv41::scenarios::conform::root_cause(again);
  ASSERT_TRUE(rc2.has_value());
  EXPECT_EQ(rc2->component, p.component);
  EXPECT_EQ(rc2->step, p.step);
}

INSTANTIATE_TEST_SUITE_P(Planted, ConformLocates,
                         testing::Values(Planted{"attn_out", 3, 2}, Planted{"hc_ffn_comb", 1, 0},
                                         Planted{"ffn_in", 6, 1}, Planted{"experts", 2, 3}),
                         [](const testing::TestParamInfo<Planted>& i) {
                           return i.param.component + "_L" + std::to_string(i.param.layer) + "_S" +
                                  std::to_string(i.param.step);
                         });

// A port whose attention output at layer 3, step 2 is doubled in one element, and which carries on
// from it (its later components and steps computed from the wrong value): teacher-forced, only that
// item fails (the error neither hides nor smears the later ones); end to end, the logits do.
TEST(Conform, AConsistentPortBugFailsOnlyWhereItIs) {
  using namespace dsv41::reference;
  const ModelConfig c = load_config_file(kConfig);
  dsv41::reference::model::Model m(c, dsv41::reference::checkpoint::ModelWeights::load(kWeights, c), dsv41::reference::model::default_token_map(c));
  dsv41::reference::model::ModelState s = m.new_state();
  const std::string dir = scratch() + "/buggy";
  fs::remove_all(dir);
  dsv41::scenarios::conform::PortDumpWriter w(dir, c, kWeights, "default", "conform_test: a consistent port bug");
  dsv41::scenarios::runner::StepCapture cap;
  int64_t step = 0;
  bool fired = false;
  const dsv41::reference::model::ForwardHooks record = dsv41::scenarios::runner::capture_hooks(cap, nullptr);
  dsv41::reference::model::ForwardHooks bug = record;
  bug.tensor = [&](dsv41::reference::model::Component what, int layer, Tensor<float>& v) {
    if (what == dsv41::reference::model::Component::kAttnOut && layer == 3 && step == 2) {
      v.data()[7] = v.data()[7] == 0.0f ? 1.0f : 2.0f * v.data()[7];  // a bf16 value stays one
      fired = true;
    }
    record.tensor(what, layer, v);  // the port records the value it carries on with
  };
  m.set_hooks(bug);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 70; ++i) ids.push_back((i * 37 + 11) % 1024);
  auto run = [&](const std::vector<int64_t>& t, const char* event) {
    const dsv41::reference::model::StepRecord r = m.forward_chunk(s, t);
    std::vector<dsv41::reference::model::CacheView> caches = m.cache_views(s);
    for (std::vector<dsv41::reference::model::CacheView> more : {dsv41::reference::model::compressor_views(s, m.ops()), dsv41::reference::model::dspark_views(s, m.ops())}) {
      caches.insert(caches.end(), more.begin(), more.end());
    }
    dsv41::scenarios::runner::finish_capture(cap, r, std::move(caches));
    w.add_step(cap, t, event);
    cap = dsv41::scenarios::runner::StepCapture{};
    ++step;
  };
  run(std::vector<int64_t>(ids.begin(), ids.begin() + 48), "prefill");
  run(std::vector<int64_t>(ids.begin() + 48, ids.end()), "prefill");
  run({5}, "decode");
  run({723}, "decode");
  w.finish();
  ASSERT_TRUE(fired);
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 1);
  const std::optional<RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->mode, dsv41::scenarios::conform::kConformTeacherForced);
  EXPECT_EQ(rc->component, "attn_out");
  EXPECT_EQ(rc->layer, 3);
  EXPECT_EQ(rc->step, 2);
  std::vector<std::string> fails;
  for (const std::string& n : r.scenarios[0].comparisons[0].notes) {
    if (n.rfind("FAIL ", 0) == 0) fails.push_back(n);
  }
  EXPECT_EQ(fails.size(), 1u) << (fails.size() > 1 ? fails[1] : "");
  const dsv41::reports::Comparison& e2e = r.scenarios[0].comparisons[1];
  EXPECT_EQ(e2e.verdict, Verdict::kFail);
  ASSERT_TRUE(e2e.first_divergence.has_value());
  EXPECT_EQ(e2e.first_divergence->step, 2);
}

TEST(Conform, PerturbedCacheByteFailsInTheCaches) {
  const std::string dir = copy_dump();
  const int layer = first_layer("cache.compressed_kv");
  const int64_t step = 3;
  rewrite_step(dir, step, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
    st::Entry& e = entry(es, dump_key(layer, "cache.compressed_kv"));
    ASSERT_GT(e.shape[0], 0);
    e.bytes[1] ^= 0x11;  // two E2M1 codes of the first entry
  });
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 1);
  const std::optional<RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->component, "cache.compressed_kv");
  EXPECT_EQ(rc->layer, layer);
  EXPECT_EQ(rc->step, step);
  EXPECT_EQ(rc->metric, "bytes_equal_frac");
  EXPECT_TRUE(has(rc->detail, "entry 0 byte 1")) << rc->detail;
  EXPECT_TRUE(has(rc->detail, "no layout explains it")) << rc->detail;
}

TEST(Conform, BlockPlanarIndexCacheIsALayoutError) {
  const std::string dir = copy_dump();
  const int layer = first_layer("cache.index_keys");
  rewrite_step(dir, 1, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>& meta) {
    st::Entry& e = entry(es, dump_key(layer, "cache.index_keys"));
    dsv41::reference::model::CacheView v;
    v.kind = "index_keys";
    v.layer = layer;
    v.format = dsv41::formats::cache_format_from_name(meta.at(e.name + ".format"));
    v.dim = std::stoll(meta.at(e.name + ".dim"));
    v.entry_bytes = e.shape[1];
    v.entries = e.shape[0];
    v.bytes = e.bytes;
    ASSERT_GE(v.entries, 8);
    e.bytes = dsv41::scenarios::conform::to_block_planar(v, 8);
    ASSERT_NE(e.bytes, v.bytes);
  });
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 1);
  const std::optional<RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->component, "cache.index_keys");
  EXPECT_EQ(rc->layer, layer);
  EXPECT_EQ(rc->step, 1);
  EXPECT_TRUE(has(rc->detail, "written block-planar (pages of 8 entries")) << rc->detail;
  EXPECT_TRUE(has(rc->detail, "read token-interleaved")) << rc->detail;
}

TEST(Conform, NoLogitsIsTooThinToJudge) {
  const std::string dir = copy_dump();
  const PortDump d = read_port_dump(dir);
  for (const auto& s : d.steps) {
    rewrite_step(dir, s.index, [](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
      es.erase(std::remove_if(es.begin(), es.end(), [](const st::Entry& e) { return e.name == "model.logits"; }), es.end());
    });
  }
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir + "/dump.json"));
  m["components"].erase("logits");
  std::ofstream(dir + "/dump.json") << m.dump(1);
  const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(dir));
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "no logits")) << r.out;
  EXPECT_TRUE(has(r.out, "logits: not covered")) << r.out;
}

TEST(Conform, CorruptDumpsExit2NamingTheKey) {
  struct Case {
    std::string name, want;
    std::function<void(const std::string&)> corrupt;
    std::string extra = "";
  };
  const int topk_layer = first_layer("topk");
  const int cache_layer = first_layer("cache.index_keys");
  const std::vector<Case> cases = {
      {"truncated", "step_000002.safetensors",
       [](const std::string& d) { fs::resize_file(d + "/step_000002.safetensors", 1000); }},
      {"missing_key", "layer04.ffn_out",
       [](const std::string& d) {
         rewrite_step(d, 1, [](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
           es.erase(std::remove_if(es.begin(), es.end(), [](const st::Entry& e) { return e.name == "layer04.ffn_out"; }),
                    es.end());
         });
       }},
      {"topk_out_of_range", dump_key(topk_layer, "topk"),
       [&](const std::string& d) {
         rewrite_step(d, 0, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>&) {
           int32_t* x = reinterpret_cast<int32_t*>(entry(es, dump_key(topk_layer, "topk")).bytes.data());
           x[0] = 1 << 20;
         });
       }},
      {"cache_format_missing", dump_key(cache_layer, "cache.index_keys") + ".format",
       [&](const std::string& d) {
         rewrite_step(d, 0, [&](std::vector<st::Entry>&, std::map<std::string, std::string>& meta) {
           meta.erase(dump_key(cache_layer, "cache.index_keys") + ".format");
         });
       }},
      {"steps_out_of_order", "steps out of order",
       [](const std::string& d) {
         fs::rename(d + "/step_000001.safetensors", d + "/tmp");
         fs::rename(d + "/step_000002.safetensors", d + "/step_000001.safetensors");
         fs::rename(d + "/tmp", d + "/step_000002.safetensors");
       }},
      {"bad_tolerance_metric", "unknown metric 'nmsee'",
       [](const std::string& d) {
         std::ofstream(d + "/../tol.json") << R"({"attn_out": {"nmsee": 1e-6, "origin": "measured"}})";
       },
       " --tolerances '" + scratch() + "/tol.json'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = copy_dump();
    c.corrupt(dir);
    const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(dir, c.extra));
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(has(r.err, c.want)) << r.err;
    EXPECT_TRUE(has(r.err, "dsv41: error:")) << r.err;
  }
}

TEST(Conform, ToleranceFileReplacesTheBitExactDefault) {
  const std::string dir = copy_dump();
  nudge(dir, 2, 3, "attn_out");
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(judge(dir)), 1);
  const std::string tol = scratch() + "/tol.json";
  std::ofstream(tol) << R"({"*": {"nmse": 1e-3, "calc_diff": 1e-3, "origin": "measured", "note": "test bound"}})";
  ConformOptions o;
  o.tolerances_file = tol;
  const dsv41::reports::RunReport r = judge(dir, o);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(r), 0);
  bool bounded = false;
  for (const dsv41::reports::MetricRow& m : r.scenarios[0].comparisons[0].rows) {
    if (m.component == "attn_out" && m.step == 2 && m.layer == 3 && m.metric == "nmse") {
      ASSERT_TRUE(m.tolerance.has_value());
      EXPECT_EQ(m.tolerance->origin, "measured");
      EXPECT_EQ(m.tolerance->bound, 1e-3);
      EXPECT_GT(m.value, 0.0);  // the nudge is seen, within the bound
      bounded = true;
    }
  }
  EXPECT_TRUE(bounded);
  EXPECT_TRUE(has(r.scenarios[0].scenario_json, "test bound"));
}

TEST(Conform, PortMetricsByHand) {
  using dsv41::scenarios::judge::port_metrics;
  const std::vector<float> x = {1, 2, 3}, neg = {-1, -2, -3};
  EXPECT_EQ(port_metrics(x, x, 0, 0, "same").calc_diff, 0.0);
  EXPECT_DOUBLE_EQ(port_metrics(x, neg, 0, 0, "neg").calc_diff, 2.0);
  EXPECT_DOUBLE_EQ(port_metrics(x, neg, 0, 0, "neg").cosine, -1.0);
  EXPECT_DOUBLE_EQ(port_metrics({1, 2}, {2, -1}, 0, 0, "orthogonal").calc_diff, 1.0);
  EXPECT_DOUBLE_EQ(port_metrics({1, 2}, {2, -1}, 0, 0, "orthogonal").cosine, 0.0);
  const std::vector<float> y = {1.0f, 2.0f, 3.1f};
  EXPECT_FALSE(port_metrics(x, y, 0.05, 0.0, "a").allclose);
  EXPECT_TRUE(port_metrics(x, y, 0.0, 0.04, "r").allclose);  // 0.1 <= 0.04 * 3
  EXPECT_EQ(port_metrics(x, y, 0.05, 0.0, "a").allclose_violations, 1);
  EXPECT_THROW(port_metrics(x, {1, 2}, 0, 0, "len"), dsv41::Error);
}

}  // namespace
