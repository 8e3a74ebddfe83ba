// The port dump (docs/port-dump.md): `dsv41 forward --dump DIR` on the tiny oracle model (golden/
// oracle config and weights), read back with read_port_dump, is bit-equal to an in-memory capture
// of the same run (capture_hooks); the manifest lists exactly the components present; every kind
// of bad dump (missing manifest, version mismatch, missing key, wrong dtype, wrong shape,
// truncated file, steps out of order) is refused with an error naming the file and the key.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/model/kv_cache.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/runner/capture.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::scenarios::runner::CapturedItem;
using dsv41::scenarios::conform::dump_key;
using dsv41::scenarios::conform::PortDump;
using dsv41::scenarios::conform::read_port_dump;
using dsv41::scenarios::runner::StepCapture;
using dsv41::test::has;
using dsv41::test::scratch;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

// 100 prompt tokens in chunks of 48 (48, 48, 4: the 64-slot window wraps), then 3 decode steps.
constexpr int64_t kPrompt = 100, kChunk = 48;
const std::vector<int64_t> kDecode = {5, 723, 380};

std::vector<int64_t> prompt_ids() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < kPrompt; ++i) ids.push_back((i * 37 + 11) % 1024);
  return ids;
}

std::string id_list(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t v : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(v);
  }
  return s;
}

// The same run in memory: one capture per step, as `forward --dump` records them.
std::vector<StepCapture> in_memory_run() {
  using namespace dsv41::reference;
  const ModelConfig c = load_config_file(kConfig);
  dsv41::reference::model::Model m(c, dsv41::reference::checkpoint::ModelWeights::load(kWeights, c), dsv41::reference::model::default_token_map(c));
  dsv41::reference::model::ModelState s = m.new_state();
  std::vector<StepCapture> out;
  StepCapture cap;
  m.set_hooks(dsv41::scenarios::runner::capture_hooks(cap, nullptr));
  auto finish = [&](const dsv41::reference::model::StepRecord& r) {
    std::vector<dsv41::reference::model::CacheView> caches = m.cache_views(s);
    for (std::vector<dsv41::reference::model::CacheView> more : {compressor_views(s, m.ops()), dspark_views(s, m.ops())}) {
      caches.insert(caches.end(), more.begin(), more.end());
    }
    dsv41::scenarios::runner::finish_capture(cap, r, std::move(caches));
    out.push_back(cap);
    cap = StepCapture{};
  };
  const std::vector<int64_t> p = prompt_ids();
  for (int64_t at = 0; at < kPrompt; at += kChunk) {
    finish(m.forward_chunk(s, std::vector<int64_t>(p.begin() + at, p.begin() + std::min(kPrompt, at + kChunk))));
  }
  for (int64_t t : kDecode) finish(m.decode(s, t));
  return out;
}

// One dump for the whole test process (the forward runs once), copied per test that corrupts it.
const std::string& reference_dump() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/dsv41_port_dump_" + std::to_string(::getpid());
    fs::remove_all(d);
    const dsv41::test::CliResult r =
        dsv41::test::run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt " +
                               id_list(prompt_ids()) + " --chunk " + std::to_string(kChunk) + " --decode " +
                               id_list(kDecode) + " --dump '" + d + "'");
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

std::string error_of(const std::string& dir) {
  try {
    read_port_dump(dir);
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Rewrites one step file through `edit` (its entries and metadata).
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
  ADD_FAILURE() << "no key " << key;
  return es.front();
}

nlohmann::json manifest(const std::string& dir) {
  std::ifstream in(dir + "/dump.json");
  return nlohmann::json::parse(in);
}
void write_manifest(const std::string& dir, const nlohmann::json& m) { std::ofstream(dir + "/dump.json") << m.dump(1); }

template <typename T>
std::vector<T> raw(const st::Entry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());  // empty: data() may be null (UB)
  return v;
}

// Bit equality of fp32 values (NaN-safe, -0 vs 0 distinguished).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

TEST(PortDump, RoundTripsBitEqualToTheInMemoryCapture) {
  const PortDump d = read_port_dump(reference_dump());
  const std::vector<StepCapture> mem = in_memory_run();
  ASSERT_EQ(d.steps.size(), mem.size());
  EXPECT_EQ(d.version, dsv41::scenarios::conform::kPortDumpVersion);
  std::set<std::string> components;
  for (size_t k = 0; k < mem.size(); ++k) {
    const auto& s = d.steps[k];
    const StepCapture& cap = mem[k];
    EXPECT_EQ(s.start_pos, cap.start_pos);
    EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), cap.tokens);
    EXPECT_EQ(s.event, k < 3 ? "prefill" : "decode");
    size_t keys = 2;  // step.tokens, step.positions
    for (const CapturedItem& it : cap.items) {
      components.insert(it.component);
      const st::Entry* e = s.find(it.layer, it.component);
      ASSERT_NE(e, nullptr) << dump_key(it.layer, it.component) << " step " << k;
      ++keys;
      const std::string what = dump_key(it.layer, it.component) + " step " + std::to_string(k);
      switch (it.kind) {
        case CapturedItem::kFloat: {
          const std::vector<float> v = e->to_f32();
          ASSERT_FALSE(v.empty()) << what;
          EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; })) << what;
          EXPECT_TRUE(std::none_of(v.begin(), v.end(), [](float x) { return std::isnan(x); })) << what;
          EXPECT_EQ(e->shape, it.f.shape()) << what;
          EXPECT_TRUE(same_bits(v, it.f.data())) << what;
          break;
        }
        case CapturedItem::kIndex: EXPECT_EQ(raw<int32_t>(*e), it.i.data()) << what; break;
        case CapturedItem::kMask: EXPECT_EQ(raw<uint8_t>(*e), it.m.data()) << what; break;
        case CapturedItem::kIds:
          EXPECT_EQ(raw<int64_t>(*e), it.ids) << what;
          EXPECT_EQ(e->shape, it.ids_shape) << what;
          break;
      }
    }
    const st::Entry* logits = s.find(-1, "logits");
    ASSERT_NE(logits, nullptr);
    ++keys;
    components.insert("logits");
    EXPECT_TRUE(std::any_of(cap.logits.begin(), cap.logits.end(), [](float x) { return x != 0.0f; }));
    EXPECT_TRUE(same_bits(logits->to_f32(), cap.logits));
    for (const dsv41::reference::model::CacheView& v : cap.caches) {
      const std::string component = "cache." + v.kind;
      components.insert(component);
      const st::Entry* e = s.find(v.layer, component);
      ASSERT_NE(e, nullptr) << dump_key(v.layer, component);
      ++keys;
      EXPECT_EQ(e->bytes, v.bytes) << dump_key(v.layer, component) << " step " << k;
      if (static_cast<int64_t>(v.positions.size()) == v.entries) {
        const auto p = s.tensors.find(dump_key(v.layer, component) + ".positions");
        ASSERT_NE(p, s.tensors.end());
        ++keys;
        EXPECT_EQ(raw<int64_t>(p->second), v.positions);
      }
    }
    EXPECT_EQ(s.tensors.size(), keys) << "step " << k << ": the dump holds keys the capture does not";
  }
  // The manifest lists exactly the components present; the rest of the table is not covered.
  std::set<std::string> listed;
  for (const auto& [name, layers] : d.components) listed.insert(name);
  EXPECT_EQ(listed, components);
  EXPECT_EQ(d.not_covered.size() + listed.size(), dsv41::reference::model::component_table().size());
  for (const std::string& n : d.not_covered) EXPECT_FALSE(components.count(n)) << n;
  EXPECT_TRUE(components.count("attn_out") && components.count("topk") && components.count("cache.window_kv"));
}

TEST(PortDump, RefusesAMissingManifest) {
  const std::string d = copy_dump();
  fs::remove(d + "/dump.json");
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "dump.json") && has(e, "missing manifest")) << e;
}

TEST(PortDump, RefusesAnotherVersion) {
  const std::string d = copy_dump();
  nlohmann::json m = manifest(d);
  m["version"] = 3;
  write_manifest(d, m);
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "dump.json") && has(e, "version 3")) << e;
}

// Version 1 manifests (no `kept`: every step keeps its tokens) are still read; a kept below
// n_tokens outside a verify step is refused.
TEST(PortDump, ReadsVersion1AndRefusesAKeptBelowTheTokensOfADecodeStep) {
  const std::string d = copy_dump();
  nlohmann::json m = manifest(d);
  m["version"] = 1;
  for (nlohmann::json& s : m["steps"]) s.erase("kept");
  write_manifest(d, m);
  const PortDump v1 = read_port_dump(d);
  EXPECT_EQ(v1.version, 1);
  ASSERT_GE(v1.steps.size(), 2u);
  EXPECT_EQ(v1.steps[0].kept, static_cast<int64_t>(v1.steps[0].tokens.size()));
  m["version"] = 2;
  for (nlohmann::json& s : m["steps"]) s["kept"] = s["n_tokens"];
  m["steps"][0]["kept"] = 1;
  write_manifest(d, m);
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "steps[0]") && has(e, "kept 1 of n_tokens")) << e;
}

TEST(PortDump, RefusesAMissingKeyThatTheManifestPromises) {
  const std::string d = copy_dump();
  rewrite_step(d, 1, [](std::vector<st::Entry>& es, auto&) {
    es.erase(std::remove_if(es.begin(), es.end(), [](const st::Entry& e) { return e.name == "layer03.attn_out"; }),
             es.end());
  });
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "step_000001.safetensors") && has(e, "missing key 'layer03.attn_out'")) << e;
}

TEST(PortDump, RefusesAWrongDtype) {
  const std::string d = copy_dump();
  rewrite_step(d, 2, [](std::vector<st::Entry>& es, auto&) {
    st::Entry& e = entry(es, "layer02.ffn_out");
    const std::vector<float> v = e.to_f32();
    e.dtype = dsv41::reference::DType::kF32;
    e.bytes.resize(v.size() * 4);
    std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
  });
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "step_000002.safetensors") && has(e, "'layer02.ffn_out' has dtype F32, expected BF16")) << e;
}

TEST(PortDump, RefusesAWrongShape) {
  const std::string d = copy_dump();
  rewrite_step(d, 0, [](std::vector<st::Entry>& es, auto&) {
    st::Entry& e = entry(es, "layer04.attn_in");  // [T, dim] -> [2T, dim / 2], same bytes
    e.shape = {e.shape[0] * 2, e.shape[1] / 2};
  });
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "step_000000.safetensors") && has(e, "'layer04.attn_in' has shape")) << e;
}

TEST(PortDump, RefusesATruncatedFile) {
  const std::string d = copy_dump();
  const std::string f = d + "/step_000003.safetensors";
  fs::resize_file(f, fs::file_size(f) - 100);
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "step_000003.safetensors") && has(e, "tensor '")) << e;
}

TEST(PortDump, RefusesStepsOutOfOrder) {
  {  // the files swapped: each file's own step index disagrees with the manifest
    const std::string d = copy_dump();
    fs::rename(d + "/step_000001.safetensors", d + "/tmp");
    fs::rename(d + "/step_000002.safetensors", d + "/step_000001.safetensors");
    fs::rename(d + "/tmp", d + "/step_000002.safetensors");
    const std::string e = error_of(d);
    EXPECT_TRUE(has(e, "step_000001.safetensors") && has(e, "steps out of order")) << e;
  }
  {  // the manifest's steps swapped
    const std::string d = copy_dump();
    nlohmann::json m = manifest(d);
    std::swap(m["steps"][3], m["steps"][4]);
    write_manifest(d, m);
    const std::string e = error_of(d);
    EXPECT_TRUE(has(e, "step_000004.safetensors") && has(e, "steps out of order")) << e;
  }
}

TEST(PortDump, RefusesAKeyTheManifestDoesNotList) {
  const std::string d = copy_dump();
  nlohmann::json m = manifest(d);
  m["components"].erase("experts");
  write_manifest(d, m);
  const std::string e = error_of(d);
  EXPECT_TRUE(has(e, "step_000000.safetensors") && has(e, ".experts' is not listed in dump.json")) << e;
}

TEST(PortDump, ForwardRefusesANonEmptyDirectoryAnExistingH5AndNoOutput) {
  const std::string d = scratch() + "/full";
  fs::create_directories(d);
  std::ofstream(d + "/x") << "x";
  const std::string base = "forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2,3 ";
  dsv41::test::CliResult r = dsv41::test::run_dsv41(base + "--dump '" + d + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "is not empty")) << r.err;
  std::ofstream(scratch() + "/old.h5") << "x";
  r = dsv41::test::run_dsv41(base + "--dump '" + scratch() + "/old.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "old.h5") && has(r.err, "exists")) << r.err;
  r = dsv41::test::run_dsv41(base);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "-o/--output or --dump")) << r.err;
}

// docs/port-dump.md's table is the component table: a row per component with its dtype, shape and
// official module as reference/model/hooks.cc has them.
TEST(PortDump, DocsTableIsTheComponentTable) {
  const std::string doc = dsv41::test::read_bytes(DSV41_SOURCE_DIR "/docs/port-dump.md");
  for (const dsv41::reference::model::ComponentInfo& row : dsv41::reference::model::component_table()) {
    const std::string dtype = dsv41::reference::dtype_name(dsv41::scenarios::conform::dump_dtype(row.name));
    const std::string cells = std::string(row.name) + "` | ";
    EXPECT_TRUE(has(doc, cells)) << row.name;
    EXPECT_TRUE(has(doc, " | " + dtype + " | `" + row.shape + "` | " + row.official + " |")) << row.name;
  }
}

// A resumed session: the first step after --resume starts at the saved position, event
// "resume+prefill"; the steps after it follow on.
TEST(PortDump, RecordsAResumedSession) {
  const std::string base = "forward --config '" + kConfig + "' --weights '" + kWeights + "' ";
  const std::string state = scratch() + "/s.dsv41s", d = scratch() + "/resumed";
  fs::remove_all(d);
  dsv41::test::CliResult r =
      dsv41::test::run_dsv41(base + "--prompt 1,2,3,4,5,6,7,8,9,10 --save-state '" + state + "' -o '" + scratch() +
                             "/first.h5'");
  ASSERT_EQ(r.code, 0) << r.err;
  r = dsv41::test::run_dsv41(base + "--resume '" + state + "' --prompt 11,12 --decode 3 --dump '" + d + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const PortDump p = read_port_dump(d);
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.steps[0].event, "resume+prefill");
  EXPECT_EQ(p.steps[0].start_pos, 10);
  EXPECT_EQ(p.steps[0].tokens, (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(p.steps[0].positions, (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(p.steps[1].event, "decode");
  EXPECT_EQ(p.steps[1].start_pos, 12);
  EXPECT_EQ(p.token_map, "default");
}

}  // namespace
