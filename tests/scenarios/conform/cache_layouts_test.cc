// Cache layouts (docs/port-dump.md "Cache layouts"; formats/cache_layout.h,
// scenarios/conform/cache_layouts.h). The byte work round-trips and refuses bad block tables; every
// format's rounding bound holds for its own QDQ; then, on the tiny oracle model, the reference's own
// dump rewritten in each layout (paged with a shuffled block table, paged block-planar from slot 1,
// block-planar pages of 8, bf16 and FlashMLA's fp8_ds_mla / fp8_ds_mla_model1 entries built from the
// reference's values, the latter also paged block-planar in padded blocks as engines keep V4's cache)
// passes `conform`, and corrupted ones (block-table entries swapped, a scale byte flipped, a value
// moved, the layout mislabeled) fail at the cache or exit 2 naming the key and the reason.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "formats/cache_format.h"
#include "formats/cache_layout.h"
#include "formats/minifloat.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reference/model/model.h"
#include "reports/report.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
namespace fm = dsv41::formats;
namespace cf = dsv41::scenarios::conform;
using dsv41::test::has;
using dsv41::test::scratch;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(g());
  return b;
}

// bf16 values of a few magnitudes (so blocks see different scales), no NaN.
std::vector<float> bf16_values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = fm::round_to_bf16(d(g) * std::ldexp(1.0f, static_cast<int>(i / 37 % 9) - 4));
  return x;
}

TEST(CacheLayoutBytes, BlockPlanarRoundTripsAndIsNotTheIdentity) {
  const std::vector<uint8_t> b = random_bytes(13 * 72, 1);
  const std::vector<uint8_t> planar = fm::to_block_planar(b, 13, 72, 64, 8);
  EXPECT_NE(planar, b);
  EXPECT_EQ(fm::from_block_planar(planar, 13, 72, 64, 8), b);
  // Page 0's first scale byte follows the page's 8 x 64 value bytes.
  EXPECT_EQ(planar[8 * 64], b[64]);
}

TEST(CacheLayoutBytes, UnpageFollowsTheBlockTable) {
  const int64_t entries = 19, eb = 36, bs = 4;
  const std::vector<uint8_t> b = random_bytes(entries * eb, 2);
  const std::vector<int32_t> table = {6, 1, 4, 0, 7, 2};  // 6 blocks of a pool of 9, shuffled
  for (int64_t planar : {int64_t{0}, int64_t{32}}) {
    for (int64_t first : {int64_t{0}, int64_t{3}}) {
      const std::vector<uint8_t> pool = fm::page_entries(b, entries, eb, 9, bs, table, first, planar, 0xEE);
      EXPECT_EQ(fm::unpage(pool, 9, bs, eb, table, first, entries, planar), b) << planar << " " << first;
      std::vector<int32_t> swapped = table;
      std::swap(swapped[0], swapped[1]);
      EXPECT_NE(fm::unpage(pool, 9, bs, eb, swapped, first, entries, planar), b);
    }
  }
  const std::vector<uint8_t> pool = fm::page_entries(b, entries, eb, 9, bs, table, 0, 0);
  const auto refused = [&](const std::vector<int32_t>& t, int64_t first, int64_t n, const std::string& why) {
    try {
      fm::unpage(pool, 9, bs, eb, t, first, n, 0);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const dsv41::Error& e) {
      EXPECT_TRUE(has(e.what(), why)) << e.what();
    }
  };
  refused({6, 1, 9, 0, 7}, 0, entries, "outside the pool's blocks [0, 9)");
  refused({6, 1, 4, 1, 7}, 0, entries, "a second time");
  refused({6, 1, 4, -1, 7}, 0, entries, "outside");
  refused({6, 1, 4, 0}, 0, entries, "of the block table's 4 blocks of 4 slots (16");  // 16 slots, 19 entries
}

TEST(CacheLayoutBytes, EveryFormatsRoundingBoundHoldsForItsOwnQdq) {
  const int rows = 24;
  for (fm::CacheFormat f : {fm::CacheFormat::kCompressedKvFp4, fm::CacheFormat::kIndexKeysFp4,
                            fm::CacheFormat::kWindowKvFp8, fm::CacheFormat::kBf16}) {
    const int dim = 128;
    const std::vector<float> x = bf16_values(static_cast<size_t>(rows) * dim, 3);
    const fm::DecodedRows d = fm::decode_with_rounding(f, fm::pack_rows(f, x, rows, dim), rows, dim);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(x[i] - d.values[i]), d.rounding[i]) << fm::info(f).name << " value " << i;
      if (d.rounding[i] > 0) worst = std::max(worst, static_cast<double>(std::fabs(x[i] - d.values[i]) / d.rounding[i]));
    }
    // The bound is not vacuous: the quantized formats come close to it somewhere.
    if (f != fm::CacheFormat::kBf16) {
      EXPECT_GT(worst, 0.5) << fm::info(f).name;
    }
  }
}

TEST(CacheLayoutBytes, SparseMlaFp8Entries) {
  EXPECT_EQ(fm::sparse_mla_fp8_entry_bytes(fm::SparseMlaFp8::kV32, 576, 64), 656);           // FlashMLA V32_FP8Sparse
  EXPECT_EQ(fm::sparse_mla_fp8_entry_bytes(fm::SparseMlaFp8::kModel1, 512, 64), 584);        // FlashMLA MODEL1_FP8Sparse
  EXPECT_EQ(fm::sparse_mla_fp8_value_bytes(fm::SparseMlaFp8::kModel1, 512, 64), 576);        // a page's value part
  for (fm::SparseMlaFp8 f : {fm::SparseMlaFp8::kV32, fm::SparseMlaFp8::kModel1}) {
    const int rows = 5, dim = f == fm::SparseMlaFp8::kV32 ? 576 : 512, rope = 64;
    const int eb = fm::sparse_mla_fp8_entry_bytes(f, dim, rope);
    const std::vector<float> x = bf16_values(static_cast<size_t>(rows) * dim, 4);
    std::vector<uint8_t> b = fm::pack_sparse_mla_fp8(f, x, rows, dim, rope);
    ASSERT_EQ(b.size(), static_cast<size_t>(rows) * eb);
    const fm::DecodedRows d = fm::decode_sparse_mla_fp8(f, b, rows, dim, rope);
    int64_t moved = 0;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < dim; ++i) {
        const size_t k = static_cast<size_t>(r) * dim + i;
        ASSERT_LE(std::fabs(x[k] - d.values[k]), d.rounding[k]) << fm::name(f) << " " << k;
        if (i >= dim - rope) {
          EXPECT_EQ(d.values[k], x[k]) << "the RoPE part is bf16, exact";
        }
        moved += d.values[k] != x[k];
      }
    }
    EXPECT_GT(moved, 0) << fm::name(f);  // the fp8 part rounds
    // A NaN scale (tile 2 of entry 1) does not parse.
    if (f == fm::SparseMlaFp8::kV32) {
      const float nan = std::nanf("");
      std::memcpy(&b[static_cast<size_t>(eb) + 512 + 8], &nan, 4);
    } else {
      b[static_cast<size_t>(eb) + 576 + 2] = 0xFF;
    }
    try {
      fm::decode_sparse_mla_fp8(f, b, rows, dim, rope);
      ADD_FAILURE() << fm::name(f) << ": a NaN scale decoded";
    } catch (const dsv41::Error& e) {
      EXPECT_TRUE(has(e.what(), std::string(fm::name(f)) + " entry 1: the ")) << e.what();
      EXPECT_TRUE(has(e.what(), "scale of tile 2 is nan, not a positive finite scale")) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The reference's own dump, rewritten in each layout, judged.

const std::string& reference_dump() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/dsv41_layouts_dump_" + std::to_string(::getpid());
    fs::remove_all(d);
    std::string prompt;
    for (int i = 0; i < 20; ++i) prompt += (i ? "," : "") + std::to_string((i * 37 + 11) % 1024);
    const dsv41::test::CliResult r = dsv41::test::run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights +
                                                            "' --prompt " + prompt + " --chunk 12 --decode 5 --dump '" +
                                                            d + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return d;
  }();
  return dir;
}

std::string copy_dump(const std::string& name) {
  const std::string d = scratch() + "/" + name;
  fs::remove_all(d);
  fs::copy(reference_dump(), d);
  return d;
}

using Edit = std::function<void(std::vector<st::Entry>&, std::map<std::string, std::string>&)>;

void rewrite_steps(const std::string& dir, const Edit& edit) {
  for (int64_t step = 0; fs::exists(dir + "/" + cf::dump_step_file(step)); ++step) {
    const std::string path = dir + "/" + cf::dump_step_file(step);
    const st::SafetensorsFile f = st::SafetensorsFile::read(path);
    std::vector<st::Entry> es;
    for (const std::string& n : f.names()) es.push_back(f.get(n));
    std::map<std::string, std::string> meta = f.metadata();
    edit(es, meta);
    st::write(path, es, meta);
  }
}

st::Entry& entry(std::vector<st::Entry>& es, const std::string& key) {
  for (st::Entry& e : es) {
    if (e.name == key) return e;
  }
  throw std::runtime_error("no key " + key);
}

dsv41::reports::RunReport judge(const std::string& dir, bool order_variant = false) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  static const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kWeights, c);
  cf::ConformOptions o;
  o.end_to_end = false;  // the caches are judged teacher-forced
  o.order_variant = order_variant;
  return cf::conform(cf::read_port_dump(dir), w, dsv41::reference::model::default_token_map(c), o);
}

// The first layer the dump holds `component` at.
int first_layer(const std::string& component) {
  const cf::PortDump d = cf::read_port_dump(reference_dump());
  return d.components.at(component).front();
}

std::string read_error(const std::string& dir) {
  try {
    cf::read_port_dump(dir);
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "(read without error)";
}

// A key's rows: the worst value of `metric` over every step and whether any row failed.
struct Rows {
  int64_t n = 0;
  double worst = 0;
  bool failed = false;
};
Rows rows_of(const dsv41::reports::RunReport& r, int layer, const std::string& component, const std::string& metric) {
  Rows out;
  for (const auto& s : r.scenarios) {
    for (const auto& c : s.comparisons) {
      for (const auto& row : c.rows) {
        if (row.layer != layer || row.component != component || row.metric != metric) continue;
        ++out.n;
        out.worst = std::max(out.worst, row.value);
        out.failed = out.failed || row.verdict == dsv41::reports::Verdict::kFail;
      }
    }
  }
  return out;
}

bool notes_have(const dsv41::reports::RunReport& r, const std::string& part) {
  for (const auto& s : r.scenarios) {
    for (const auto& c : s.comparisons) {
      for (const std::string& n : c.notes) {
        if (has(n, part)) return true;
      }
    }
  }
  return false;
}

// Pages `key` of every step: blocks of 4 entries in a pool with 3 spare blocks, the table a
// permutation; planar: each block block-planar; first: the first valid slot.
void page_key(const std::string& dir, const std::string& key, bool planar, int64_t first, bool two_d,
              const std::function<void(std::vector<int32_t>&)>& spoil = nullptr, int64_t pad = 0) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  rewrite_steps(dir, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>& meta) {
    st::Entry& e = entry(es, key);
    const int64_t n = e.shape[0], eb = e.shape[1], bs = 4;
    const std::string label = meta.at(key + ".format");
    const int dim = std::stoi(meta.at(key + ".dim"));
    fm::SparseMlaFp8 mla{};
    const int64_t vb = !planar ? 0
                       : fm::sparse_mla_fp8_from_name(label, mla)
                           ? fm::sparse_mla_fp8_value_bytes(mla, dim, c.rope_head_dim)
                           : fm::value_bytes(fm::cache_format_from_name(label), dim);
    const int64_t blocks = (first + n + bs - 1) / bs, pool = blocks + 3;
    std::vector<int32_t> table(static_cast<size_t>(pool));  // the first `blocks` of a shuffled pool
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(static_cast<uint32_t>(n)));
    table.resize(static_cast<size_t>(blocks));
    std::vector<uint8_t> bytes = fm::page_entries(e.bytes, n, eb, pool, bs, table, first, vb, 0x55);
    if (spoil) spoil(table);
    if (pad > 0) {  // each block padded at its end (FlashMLA's MODEL1 block stride)
      std::vector<uint8_t> padded;
      for (int64_t b = 0; b < pool; ++b) {
        padded.insert(padded.end(), bytes.begin() + b * bs * eb, bytes.begin() + (b + 1) * bs * eb);
        padded.insert(padded.end(), static_cast<size_t>(pad), uint8_t{0x77});
      }
      bytes = std::move(padded);
    }
    e.bytes = std::move(bytes);
    e.shape = two_d ? std::vector<int64_t>{pool, bs * eb + pad} : std::vector<int64_t>{pool, bs, eb};
    meta[key + ".layout"] = planar ? cf::kLayoutPagedBlockPlanar : cf::kLayoutPaged;
    meta[key + ".block_size"] = std::to_string(bs);
    meta[key + ".entries"] = std::to_string(n);
    meta[key + ".first"] = std::to_string(first);
    st::Entry t{key + cf::kBlockTableSuffix, dsv41::reference::DType::kI32, {static_cast<int64_t>(table.size())}, {}};
    t.bytes.resize(table.size() * 4);
    std::memcpy(t.bytes.data(), table.data(), t.bytes.size());
    es.push_back(std::move(t));
  });
}

TEST(CacheLayouts, PagedCachesReadBackCanonicalAndPass) {
  const int layer = first_layer("cache.compressed_kv");
  const std::string kv = cf::dump_key(layer, "cache.compressed_kv"), keys = cf::dump_key(layer, "cache.index_keys");
  const std::string dir = copy_dump("paged");
  page_key(dir, kv, false, 0, false);
  page_key(dir, keys, true, 1, true);
  const cf::PortDump ref = cf::read_port_dump(reference_dump()), got = cf::read_port_dump(dir);
  for (size_t s = 0; s < ref.steps.size(); ++s) {
    for (const std::string& k : {kv, keys}) {
      ASSERT_GT(ref.steps[s].tensors.at(k).bytes.size(), 0u);
      EXPECT_EQ(got.steps[s].tensors.at(k).bytes, ref.steps[s].tensors.at(k).bytes) << k << " step " << s;
      EXPECT_EQ(got.steps[s].tensors.at(k).shape, ref.steps[s].tensors.at(k).shape);
    }
  }
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(cf::conform_exit_code(r), 0) << (cf::root_cause(r) ? cf::root_cause(r)->detail : "");
  EXPECT_GT(rows_of(r, layer, "cache.compressed_kv", "bytes_equal_frac").n, 0);  // compared byte for byte
}

TEST(CacheLayouts, SwappedBlockTableEntriesFailAtTheCache) {
  const int layer = first_layer("cache.compressed_kv");
  const std::string kv = cf::dump_key(layer, "cache.compressed_kv");
  const std::string dir = copy_dump("swapped");
  page_key(dir, kv, false, 0, false, [](std::vector<int32_t>& t) {
    if (t.size() >= 2) std::swap(t[0], t[1]);
  });
  const dsv41::reports::RunReport r = judge(dir);
  EXPECT_EQ(cf::conform_exit_code(r), 1);
  const std::optional<cf::RootCause> rc = cf::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->component, "cache.compressed_kv");
  EXPECT_EQ(rc->layer, layer);
}

TEST(CacheLayouts, BadBlockTablesAndMislabeledLayoutsExit2NamingTheKey) {
  const int layer = first_layer("cache.compressed_kv");
  const std::string kv = cf::dump_key(layer, "cache.compressed_kv");
  {
    const std::string dir = copy_dump("duplicate");
    page_key(dir, kv, false, 0, false, [](std::vector<int32_t>& t) { t.back() = t.front(); });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "a second time")) << e;
  }
  {
    const std::string dir = copy_dump("out_of_range");
    page_key(dir, kv, false, 0, false, [](std::vector<int32_t>& t) { t.back() = 1000; });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "outside the pool's blocks")) << e;
  }
  {  // canonical bytes labelled paged: no block table
    const std::string dir = copy_dump("no_table");
    rewrite_steps(dir, [&](std::vector<st::Entry>&, std::map<std::string, std::string>& meta) {
      meta[kv + ".layout"] = cf::kLayoutPaged;
      meta[kv + ".block_size"] = "4";
      meta[kv + ".entries"] = "1";
    });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "needs the block table")) << e;
  }
  {  // 288-byte FP4 entries labelled fp8_ds_mla: the wrong entry size for the format
    const std::string dir = copy_dump("wrong_format");
    rewrite_steps(dir, [&](std::vector<st::Entry>&, std::map<std::string, std::string>& meta) {
      meta[kv + ".format"] = "fp8_ds_mla";
    });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "bytes an entry")) << e;
  }
  {  // an unknown layout
    const std::string dir = copy_dump("unknown");
    rewrite_steps(dir, [&](std::vector<st::Entry>&, std::map<std::string, std::string>& meta) {
      meta[kv + ".layout"] = "planar8";
    });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "not a cache layout (known: canonical, block_planar:<P>")) << e;
  }
  {  // a page size that is no count
    const std::string dir = copy_dump("page_size");
    rewrite_steps(dir, [&](std::vector<st::Entry>&, std::map<std::string, std::string>& meta) {
      meta[kv + ".layout"] = "block_planar:8x";
    });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "the page size of metadata '" + kv + ".layout' is '8x'")) << e;
  }
}

TEST(CacheLayouts, BlockPlanarWindowPassesAndMislabeledFails) {
  const int layer = first_layer("cache.window_kv");
  const std::string key = cf::dump_key(layer, "cache.window_kv");
  const auto planar = [&](bool relabel) {
    return [&, relabel](std::vector<st::Entry>& es, std::map<std::string, std::string>& meta) {
      st::Entry& e = entry(es, key);
      const int dim = std::stoi(meta.at(key + ".dim"));
      e.bytes = fm::to_block_planar(e.bytes, e.shape[0], e.shape[1],
                                    fm::value_bytes(fm::cache_format_from_name(meta.at(key + ".format")), dim), 8);
      if (relabel) meta[key + ".layout"] = "block_planar:8";
    };
  };
  const std::string good = copy_dump("planar");
  rewrite_steps(good, planar(true));
  const dsv41::reports::RunReport r = judge(good);
  EXPECT_EQ(cf::conform_exit_code(r), 0) << (cf::root_cause(r) ? cf::root_cause(r)->detail : "");
  // Mislabeled: the planar bytes declared canonical (the layout missing), and planar:4 for planar:8.
  const std::string bad = copy_dump("planar_unlabeled");
  rewrite_steps(bad, planar(false));
  const dsv41::reports::RunReport rb = judge(bad);
  EXPECT_EQ(cf::conform_exit_code(rb), 1);
  ASSERT_TRUE(cf::root_cause(rb).has_value());
  EXPECT_EQ(cf::root_cause(rb)->component, "cache.window_kv");
  const std::string wrong = copy_dump("planar_4");
  rewrite_steps(wrong, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>& meta) {
    planar(true)(es, meta);
    meta[key + ".layout"] = "block_planar:4";
  });
  EXPECT_EQ(cf::conform_exit_code(judge(wrong)), 1);
}

// compressed_kv of every step re-encoded from the reference's decoded values: bf16, or fp8_ds_mla.
void reencode(const std::string& dir, const std::string& key, const std::string& label,
              const std::function<void(std::vector<float>&, std::vector<uint8_t>&, int64_t step)>& spoil = nullptr) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  int64_t step = 0;
  rewrite_steps(dir, [&](std::vector<st::Entry>& es, std::map<std::string, std::string>& meta) {
    st::Entry& e = entry(es, key);
    const int n = static_cast<int>(e.shape[0]), dim = std::stoi(meta.at(key + ".dim"));
    std::vector<float> x = fm::unpack_rows(fm::cache_format_from_name(meta.at(key + ".format")), e.bytes, n, dim);
    std::vector<uint8_t> bytes;
    if (spoil) spoil(x, bytes, step);
    fm::SparseMlaFp8 mla{};
    bytes = fm::sparse_mla_fp8_from_name(label, mla) ? fm::pack_sparse_mla_fp8(mla, x, n, dim, c.rope_head_dim)
                                                     : fm::pack_rows(fm::cache_format_from_name(label), x, n, dim);
    if (spoil) spoil(x, bytes, step);
    e.bytes = bytes;
    e.shape[1] = static_cast<int64_t>(bytes.size()) / std::max(n, 1);
    if (n == 0) e.shape[1] = cf::label_entry_bytes(label, dim, c);
    meta[key + ".format"] = label;
    ++step;
  });
}

TEST(CacheLayouts, OtherEntryFormatsAreJudgedByValues) {
  const int layer = first_layer("cache.compressed_kv");
  const std::string kv = cf::dump_key(layer, "cache.compressed_kv");
  // The last: V4's FlashMLA cache as engines keep it, MODEL1 entries paged block-planar, blocks padded.
  for (const std::string name : {"bf16", "fp8_ds_mla", "fp8_ds_mla_model1", "fp8_ds_mla_model1 paged"}) {
    const std::string label = name.substr(0, name.find(' '));
    const std::string dir = copy_dump(label + (name == label ? "" : "_paged"));
    reencode(dir, kv, label);
    if (name != label) page_key(dir, kv, true, 1, true, nullptr, 40);
    const dsv41::reports::RunReport r = judge(dir);
    EXPECT_EQ(cf::conform_exit_code(r), 0) << label << ": " << (cf::root_cause(r) ? cf::root_cause(r)->detail : "");
    const Rows ratio = rows_of(r, layer, "cache.compressed_kv", cf::kDecodedRoundingRatioMetric);
    EXPECT_GT(ratio.n, 0) << label;
    EXPECT_LE(ratio.worst, 1.0) << label;
    if (label != "bf16") {
      EXPECT_GT(ratio.worst, 0.0) << "the fp8 part rounds";
    }
    EXPECT_EQ(rows_of(r, layer, "cache.compressed_kv", "bytes_equal_frac").n, 0) << "no bytes to compare";
    EXPECT_TRUE(notes_have(r, "format differs (port " + label + ", reference fp4_e2m1_e4m3_b16): judged by values"))
        << label;
    const Rows ov = rows_of(judge(dir, true), layer, "cache.compressed_kv", cf::kDecodedRoundingRatioMetric);
    EXPECT_GT(ov.n, 0) << label;
    EXPECT_FALSE(ov.failed) << label << " under order-variant";
    EXPECT_LE(ov.worst, ratio.worst) << label << ": the chain only widens the allowance";
    const std::vector<dsv41::reports::JunitSuite> suites = cf::conform_junit_suites(r, cf::read_port_dump(dir), {});
    bool junit = false;
    for (const auto& s : suites) {
      for (const auto& k : s.cases) junit = junit || (k.name == kv && has(k.body, "format differs: judged by values"));
    }
    EXPECT_TRUE(junit) << label;
  }
}

TEST(CacheLayouts, ValueJudgedCachesFailWhenAValueOrAScaleMoves) {
  const int layer = first_layer("cache.compressed_kv");
  const std::string kv = cf::dump_key(layer, "cache.compressed_kv");
  {  // bf16: one value of the last step moved by 3 x its block's largest magnitude
    const std::string dir = copy_dump("bf16_moved");
    reencode(dir, kv, "bf16", [](std::vector<float>& x, std::vector<uint8_t>& bytes, int64_t step) {
      if (step == 2 && bytes.empty() && !x.empty()) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
        x[3] = fm::round_to_bf16(x[3] + 3 * amax);
      }
    });
    for (bool order_variant : {false, true}) {  // order-variant: the chain's bound widens it, not that far
      const dsv41::reports::RunReport r = judge(dir, order_variant);
      EXPECT_EQ(cf::conform_exit_code(r), 1) << order_variant;
      const std::optional<cf::RootCause> rc = cf::root_cause(r);
      ASSERT_TRUE(rc.has_value());
      EXPECT_EQ(rc->component, "cache.compressed_kv");
      EXPECT_EQ(rc->metric, cf::kDecodedRoundingRatioMetric);
      EXPECT_EQ(rc->step, 2);
      EXPECT_TRUE(has(rc->detail, "judged by values; worst entry 0")) << rc->detail;
      EXPECT_EQ(has(rc->detail, "the chain's derived bound"), order_variant) << rc->detail;
    }
  }
  {  // fp8_ds_mla: entry 0's first fp32 scale, its lowest exponent bit flipped (the tile scaled by 2 or 1/2)
    const std::string dir = copy_dump("fp8_scale");
    reencode(dir, kv, "fp8_ds_mla", [](std::vector<float>&, std::vector<uint8_t>& bytes, int64_t step) {
      static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
      const size_t nope = static_cast<size_t>(c.head_dim - c.rope_head_dim);
      if (step == 1 && !bytes.empty()) bytes[nope + 2] ^= 0x80;
    });
    const dsv41::reports::RunReport r = judge(dir);
    EXPECT_EQ(cf::conform_exit_code(r), 1);
    const std::optional<cf::RootCause> rc = cf::root_cause(r);
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(rc->component, "cache.compressed_kv");
    EXPECT_EQ(rc->metric, cf::kDecodedRoundingRatioMetric);
    EXPECT_EQ(rc->step, 1);
  }
  {  // fp8_ds_mla: a NaN scale does not parse (exit 2, the key named)
    const std::string dir = copy_dump("fp8_nan");
    reencode(dir, kv, "fp8_ds_mla", [](std::vector<float>&, std::vector<uint8_t>& bytes, int64_t step) {
      static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
      const size_t nope = static_cast<size_t>(c.head_dim - c.rope_head_dim);
      if (step == 1 && !bytes.empty()) {
        const float nan = std::nanf("");
        std::memcpy(&bytes[nope], &nan, 4);
      }
    });
    const std::string e = read_error(dir);
    EXPECT_TRUE(has(e, "key '" + kv + "'") && has(e, "not a positive finite scale")) << e;
    const dsv41::test::CliResult cli = dsv41::test::run_dsv41("conform '" + dir + "' --config '" + kConfig +
                                                              "' --weights '" + kWeights + "' -q");
    EXPECT_EQ(cli.code, 2) << cli.out << cli.err;
  }
}

}  // namespace
