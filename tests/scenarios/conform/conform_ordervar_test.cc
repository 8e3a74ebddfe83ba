// `dsv41 conform` under the order-variant claim (docs/conform.md "Claims", scenarios/judge/derived_bounds.h)
// on the tiny oracle model and the self-test scenario: an order-variant port (RMSNorm's sum of
// squares in reverse order: the same function in the same precisions, another order) fails the
// bit-exact claim and passes the order-variant one, whether --order-variant or the manifest says
// so; the reference's own dump still passes bit-exactly; the bounds are not vacuous: planted zoo
// bugs are still flagged and located under them.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"
#include "reports/report.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/conform/conform.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/conform/port_dump.h"
#include "reference/seam/forwarding_ops.h"

namespace {

namespace fs = std::filesystem;
using dsv41::reference::Tensor;
using dsv41::reports::Verdict;
using dsv41::scenarios::conform::ConformOptions;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

const dsv41::reference::ModelConfig& config() {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  return c;
}
const dsv41::reference::checkpoint::ModelWeights& weights() {
  static const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kWeights, config());
  return w;
}

// A legitimate order-variant port: RMSNorm's fp32 sum of squares runs from the last element to the
// first (one fp32 accumulator) instead of torch's lanes; everything else as the reference.
class ReverseSumRmsNorm : public dsv41::reference::seam::ForwardingOps {
 public:
  Tensor<float> rms_norm(const Tensor<float>& x, const Tensor<float>& w, double eps) const override {
    const int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
    Tensor<float> y(x.shape(), x.name() + ".rms_norm");
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data().data() + r * n;
      float sum = 0.0f;
      for (int64_t i = n - 1; i >= 0; --i) sum += xr[i] * xr[i];
      const float rs = 1.0f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) y.data()[r * n + i] = dsv41::reference::round_to_bf16(w.data()[i] * (xr[i] * rs));
    }
    return y;
  }
};

std::string dump_dir(const std::string& name) {
  return testing::TempDir() + "/dsv41_ordervar_" + std::to_string(::getpid()) + "_" + name;
}

// The self-test scenario's dump (the `forward --dump` code path) through `make_ops` (nullptr: the reference).
std::string write_dump(const std::string& name, const dsv41::scenarios::selftest::ZooBug* bug) {
  const std::string d = dump_dir(name);
  fs::remove_all(d);
  dsv41::scenarios::selftest::write_zoo_dump(d, config(), kWeights, weights(), bug);
  return d;
}

const std::string& order_variant_dump() {
  static const std::string d = [] {
    dsv41::scenarios::selftest::ZooBug port;
    port.name = "reverse_sum_rms_norm";
    port.make_ops = [](const dsv41::reference::ModelConfig&) { return std::make_unique<ReverseSumRmsNorm>(); };
    return write_dump("port", &port);
  }();
  return d;
}

dsv41::reports::RunReport judge(const std::string& dir, bool order_variant) {
  ConformOptions o;
  o.order_variant = order_variant;
  return dsv41::scenarios::conform::conform(dsv41::scenarios::conform::read_port_dump(dir), weights(),
                                   dsv41::reference::model::default_token_map(config()), o);
}

// The largest max_rowrel of a component (teacher-forced) and its bound.
std::pair<double, double> worst_rowrel(const dsv41::reports::RunReport& r, const std::string& component) {
  double worst = -1, bound = -1;
  for (const dsv41::reports::Comparison& c : r.scenarios.front().comparisons) {
    if (c.mode != dsv41::scenarios::conform::kConformTeacherForced) continue;
    for (const dsv41::reports::MetricRow& row : c.rows) {
      if (row.component != component || row.metric != dsv41::scenarios::judge::kRowRelMetric) continue;
      worst = std::max(worst, row.value);
      if (row.tolerance) bound = row.tolerance->bound;
    }
  }
  return {worst, bound};
}

TEST(ConformOrderVariant, EveryDerivedBoundHasItsOriginAndReductionLength) {
  const std::vector<dsv41::scenarios::judge::DerivedBound> t = dsv41::scenarios::judge::derived_bound_table(config());
  ASSERT_FALSE(t.empty());
  for (const dsv41::scenarios::judge::DerivedBound& b : t) {
    EXPECT_GT(b.bound, 0) << b.component;
    EXPECT_LT(b.bound, 1) << b.component << ": a bound of the whole row scale says nothing";
    EXPECT_NE(b.origin.find("n = "), std::string::npos) << b.component << ": " << b.origin;
  }
  // Exact given equal inputs: no derived bound.
  for (const char* c : {"embed", "in_stream", "in_pre", "engram_ids", "topk", "candidates", "experts"}) {
    EXPECT_FALSE(dsv41::scenarios::judge::derived_bound(config(), c).has_value()) << c;
  }
}

TEST(ConformOrderVariant, PortFailsBitExactAndPassesOrderVariant) {
  const dsv41::reports::RunReport exact = judge(order_variant_dump(), false);
  EXPECT_EQ(exact.verdict, Verdict::kFail) << "an order-variant port must not pass the bit-exact claim";
  const dsv41::reports::RunReport ov = judge(order_variant_dump(), true);
  std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(ov);
  EXPECT_EQ(ov.verdict, Verdict::kPass) << (rc ? rc->component + "@" + std::to_string(rc->layer) + " step " +
                                                     std::to_string(rc->step) + ": " + rc->metric + " " +
                                                     std::to_string(rc->value) + "; " + rc->detail
                                               : std::string("no root cause"));
  // The port does differ, within the bounds; what the bounds used (printed for docs/conform.md).
  bool any_differs = false;
  for (const dsv41::scenarios::judge::DerivedBound& b : dsv41::scenarios::judge::derived_bound_table(config())) {
    const auto [worst, bound] = worst_rowrel(ov, b.component);
    if (worst < 0) continue;
    any_differs = any_differs || worst > 0;
    EXPECT_LE(worst, bound) << b.component;
    std::cout << "order-variant port: " << b.component << " max_rowrel " << worst << " of bound " << bound << "\n";
  }
  EXPECT_TRUE(any_differs);
}

TEST(ConformOrderVariant, ManifestClaimIsHonouredAndRecorded) {
  const std::string d = dump_dir("manifest");
  fs::remove_all(d);
  fs::copy(order_variant_dump(), d);
  const std::string manifest = d + "/" + dsv41::scenarios::conform::kPortDumpManifest;
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  EXPECT_EQ(m["claim"], dsv41::scenarios::conform::kClaimBitExact);  // what forward --dump writes
  m["claim"] = dsv41::scenarios::conform::kClaimOrderVariant;
  std::ofstream(manifest) << m.dump();
  const dsv41::reports::RunReport r = judge(d, false);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  const nlohmann::json sj = nlohmann::json::parse(r.scenarios.front().scenario_json);
  EXPECT_EQ(sj["claim"], dsv41::scenarios::conform::kClaimOrderVariant);
  EXPECT_FALSE(sj["derived_bounds"].empty());
  m["claim"] = "approximately";
  std::ofstream(manifest) << m.dump();
  EXPECT_THROW(dsv41::scenarios::conform::read_port_dump(d), dsv41::Error);
}

TEST(ConformOrderVariant, ReferenceStillPassesBitExactly) {
  const std::string d = write_dump("clean", nullptr);
  EXPECT_EQ(judge(d, false).verdict, Verdict::kPass);
  EXPECT_EQ(judge(d, true).verdict, Verdict::kPass);
}

// The bounds are not vacuous: each zoo bug below is flagged and located under them. The rest of the
// zoo is printed (docs/conform.md lists which stay detectable and why).
TEST(ConformOrderVariant, ZooBugsStillFlaggedAndLocated) {
  // Bugs whose error is far above every bound on their path (a wrong softmax, a wrong index, a wrong
  // hash, a wrong routing function, a wrong block pin), and the storage bugs whose decoded cache
  // values move beyond a quantisation step (decoded_rowrel): docs/conform.md gives the whole table.
  const std::vector<std::string> must = {"sink_in_numerator",     "topk_window_offset",          "reuse_wrong_owner",
                                         "newest_block_not_pinned", "engram_multiplier_off_by_one", "softmax_routing",
                                         "e8m0_scale_floor", "swapped_nibbles", "index_keys_block_planar",
                                         "indexer_rope_pairs", "compressed_position_off_by_one",
                                         "global_only_window_not_rebuilt", "rope_tables_swapped",
                                         "compressor_partial_group_lost"};
  for (const dsv41::scenarios::selftest::ZooBug& bug : dsv41::scenarios::selftest::bug_zoo()) {
    const std::string d = write_dump(bug.name, &bug);
    const dsv41::reports::RunReport r = judge(d, true);
    const std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(r);
    const bool located = rc && rc->component == bug.expected_component && rc->layer == bug.expected_layer &&
                         rc->step == bug.expected_step;
    std::cout << "order-variant zoo: " << bug.name << " flagged " << (r.verdict == Verdict::kFail) << " located "
              << located << " at " << (rc ? rc->component + "@" + std::to_string(rc->layer) + " step " + std::to_string(rc->step) : "-")
              << " expected " << bug.expected_component << "@" << bug.expected_layer << " step " << bug.expected_step << "\n";
    if (std::find(must.begin(), must.end(), bug.name) != must.end()) {
      EXPECT_EQ(r.verdict, Verdict::kFail) << bug.name;
      EXPECT_TRUE(located) << bug.name;
    }
    fs::remove_all(d);
  }
}


// Rewrites the first compressed_kv cache of the dump: its entry 0's block-0 E4M3 scale byte
// becomes edit(byte). Returns the cache's key and step.
std::pair<std::string, int64_t> edit_compressed_kv_scale(dsv41::scenarios::conform::PortDump& dump,
                                                         const std::function<uint8_t(uint8_t)>& edit) {
  for (dsv41::scenarios::conform::PortDumpStep& s : dump.steps) {
    for (auto& [k, e] : s.tensors) {
      if (k.size() > 19 && k.compare(k.size() - 19, 19, "cache.compressed_kv") == 0 && !e.bytes.empty()) {
        const int64_t eb = e.shape.at(1), dim = eb * 16 / 9;   // d/2 values + d/16 E4M3 scales
        uint8_t& scale = e.bytes.at(static_cast<size_t>(dim / 2));  // entry 0, block 0
        scale = edit(scale);
        return {k, s.index};
      }
    }
  }
  return {"", -1};
}

// A cache byte the port could not have produced from finite values (an E4M3 block scale with its
// sign bit set: 0x29 -> 0xA9) is a failure under the order-variant claim too, located at that cache.
TEST(ConformOrderVariant, AnInvalidCacheByteFailsUnderAnyClaim) {
  const std::string d = write_dump("clean_for_cache", nullptr);
  dsv41::scenarios::conform::PortDump dump = dsv41::scenarios::conform::read_port_dump(d);
  const auto [key, step] = edit_compressed_kv_scale(dump, [](uint8_t b) {
    EXPECT_EQ(b & 0x80, 0);
    return static_cast<uint8_t>(b | 0x80);
  });
  ASSERT_FALSE(key.empty()) << "the dump holds no compressed_kv cache";
  const int layer = std::stoi(key.substr(5, 2));
  for (bool order_variant : {false, true}) {
    ConformOptions o;
    o.order_variant = order_variant;
    const dsv41::reports::RunReport r = dsv41::scenarios::conform::conform(
        dump, weights(), dsv41::reference::model::default_token_map(config()), o);
    EXPECT_EQ(r.verdict, Verdict::kFail) << "order_variant " << order_variant;
    const std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(r);
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(rc->component, "cache.compressed_kv");
    EXPECT_EQ(rc->layer, layer);
    EXPECT_EQ(rc->step, step);
    EXPECT_EQ(rc->metric, "valid_entries_frac");
    EXPECT_NE(rc->detail.find("not a positive finite scale"), std::string::npos) << rc->detail;
  }
  fs::remove_all(d);
}

// A valid but wrong block scale (the E4M3 byte one step up: the block's 16 decoded values x 1.07 to
// 1.13) is within the compressed cache's decoded_rowrel bound, but it scales the whole block: under
// the order-variant claim decoded_block_gain flags it at that cache (the bytes are only measured).
TEST(ConformOrderVariant, AValidButWrongCacheScaleIsLocatedAtTheCache) {
  const std::string d = write_dump("clean_for_scale", nullptr);
  dsv41::scenarios::conform::PortDump dump = dsv41::scenarios::conform::read_port_dump(d);
  const auto [key, step] = edit_compressed_kv_scale(dump, [](uint8_t b) {
    EXPECT_LT(b & 0x7F, 0x7E);  // a positive finite E4M3 below the largest: one step up stays valid
    return static_cast<uint8_t>(b + 1);
  });
  ASSERT_FALSE(key.empty()) << "the dump holds no compressed_kv cache";
  ConformOptions o;
  o.order_variant = true;
  const dsv41::reports::RunReport r = dsv41::scenarios::conform::conform(
      dump, weights(), dsv41::reference::model::default_token_map(config()), o);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  const std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->component, "cache.compressed_kv");
  EXPECT_EQ(rc->layer, std::stoi(key.substr(5, 2)));
  EXPECT_EQ(rc->step, step);
  EXPECT_EQ(rc->metric, "decoded_block_gain");
  EXPECT_GT(rc->value, 1.0 / 32);
  fs::remove_all(d);
}


// A port whose head favours one token by +8 at every row: its tokens flip at every step. End to
// end under the order-variant claim every float row is measured, so that comparison must say
// "measured" (never "pass") and say how many top-1 tokens differ; the teacher-forced one fails.
class FavourOneToken : public dsv41::reference::seam::ForwardingOps {
 public:
  Tensor<float> linear_fp32(const Tensor<float>& x, const dsv41::reference::LinearWeight& w) const override {
    Tensor<float> y = ForwardingOps::linear_fp32(x, w);
    const int64_t vocab = config().vocab_size;
    if (y.rank() == 2 && y.dim(1) == vocab) {
      for (int64_t r = 0; r < y.dim(0); ++r) y.data()[static_cast<size_t>(r * vocab + 7)] += 8.0f;
    }
    return y;
  }
};

TEST(ConformOrderVariant, EndToEndWithFlippedTokensIsNeverAPass) {
  dsv41::scenarios::selftest::ZooBug port;
  port.name = "favour_token_7";
  port.make_ops = [](const dsv41::reference::ModelConfig&) { return std::make_unique<FavourOneToken>(); };
  const std::string d = write_dump("favour", &port);
  const dsv41::reports::RunReport r = judge(d, true);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  bool seen = false;
  for (const dsv41::reports::Comparison& c : r.scenarios.front().comparisons) {
    if (c.mode != dsv41::scenarios::conform::kConformEndToEnd) continue;
    seen = true;
    EXPECT_EQ(c.verdict, Verdict::kMeasured);
    bool noted = false;
    for (const std::string& n : c.notes) noted = noted || n.find("top-1 token differs") != std::string::npos;
    EXPECT_TRUE(noted);
  }
  EXPECT_TRUE(seen);
  // The clean reference's own dump: its end-to-end comparison passes (no token differs).
  const dsv41::reports::RunReport clean = judge(write_dump("clean_e2e", nullptr), true);
  for (const dsv41::reports::Comparison& c : clean.scenarios.front().comparisons) EXPECT_EQ(c.verdict, Verdict::kPass) << c.mode;
  fs::remove_all(d);
}


// A tolerance file waives one known failure by (component, layer range, step range) with a written
// reason: that failure is recorded as WAIVED, the root cause moves past it, and a waiver covering
// no failure, or one without a reason, is said so.
TEST(ConformWaivers, AWaivedFailureIsRecordedAndTheRootCauseMovesOn) {
  const std::string d = write_dump("waived", &dsv41::scenarios::selftest::bug_zoo().front());
  const dsv41::reports::RunReport first = judge(d, false);
  ASSERT_EQ(first.verdict, Verdict::kFail);
  const std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(first);
  ASSERT_TRUE(rc.has_value());
  const std::string file = dump_dir("waivers.json");
  nlohmann::json w;
  w["waivers"] = nlohmann::json::array(
      {{{"component", rc->component}, {"layers", {rc->layer, rc->layer}}, {"steps", {rc->step, rc->step}},
        {"reason", "known: planted by the test"}},
       {{"component", "logits"}, {"steps", {100000, 100001}}, {"reason", "covers nothing"}}});
  std::ofstream(file) << w.dump();
  ConformOptions o;
  o.tolerances_file = file;
  const dsv41::reports::RunReport r = dsv41::scenarios::conform::conform(
      dsv41::scenarios::conform::read_port_dump(d), weights(), dsv41::reference::model::default_token_map(config()), o);
  bool waived = false, unused = false;
  for (const dsv41::reports::Comparison& c : r.scenarios.front().comparisons) {
    for (const std::string& n : c.notes) {
      waived = waived || (n.rfind("WAIVED step " + std::to_string(rc->step), 0) == 0 &&
                          n.find(rc->component) != std::string::npos && n.find("known: planted by the test") != std::string::npos);
      unused = unused || n.find("covered no failure") != std::string::npos;
    }
  }
  EXPECT_TRUE(waived);
  EXPECT_TRUE(unused);
  const std::optional<dsv41::scenarios::conform::RootCause> next = dsv41::scenarios::conform::root_cause(r);
  if (next) {
    EXPECT_FALSE(next->component == rc->component && next->layer == rc->layer && next->step == rc->step)
        << "the waived failure is still the root cause";
  }

  w["waivers"][0].erase("reason");
  std::ofstream(file) << w.dump();
  try {
    dsv41::scenarios::conform::load_conform_waivers(file);
    ADD_FAILURE() << "a waiver without a reason was accepted";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("waivers[0]: no \"reason\""), std::string::npos) << e.what();
  }
  fs::remove_all(d);
  fs::remove(file);
}

}  // namespace
