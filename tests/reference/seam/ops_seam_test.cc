// The ops seam (reference/seam/ops.h): the model reaches every component through one table, and a
// second implementation of that table runs the whole forward. The second implementation is
// FakeDeviceOps (tests/support/fake_device_ops.h): the reference ops, but every tensor the model
// passes between them lives in a pretend device memory the model cannot read. Checked on the
// oracle run (333-token prefill, 8 decode steps):
//   - the results are the reference's bit for bit (logits, selections, Engram ids, experts, every
//     cache byte, the compressor state), for both cache precisions;
//   - every op of the table is called, so none is bypassed by a direct call the fake would refuse;
//   - without hooks, a step moves nothing to the host until its last op ran (then its record:
//     logits and selections); with hooks, values go to the host and back, and teacher forcing
//     through them works as on the host;
//   - bounded replay (encoder and decoder replay) runs through the seam with the same bits;
//   - Model::draft (DSpark) runs through the seam with the same bits after every step, greedy and
//     sampled, and moves to the host only the rows it samples and its result;
//   - ForwardingOps (reference/seam/forwarding_ops.h), the base of every wrapper, hands every method
//     (memory included) to its inner table: over the fake device it runs the oracle bit for bit and
//     every op reaches the fake; it names the layer that runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "golden/golden_io.h"
#include "reference/model/model.h"
#include "reference/seam/forwarding_ops.h"
#include "reference/seam/ops.h"
#include "tests/support/fake_device_ops.h"
#include "tests/support/oracle_model.h"

namespace dsv41::reference::seam {
namespace {

using test::FakeDeviceOps;

const test::OracleModel& oracle() { return test::oracle_model(); }

std::vector<int64_t> decode_tokens() {
  static const std::vector<int64_t> tokens = [] {
    const golden::H5File dec(test::kOracleDir + "decode.h5");
    std::vector<int64_t> t;
    for (int k = 0; dec.has("decode/step" + std::to_string(k)); ++k) {
      t.push_back(dec.read<int64_t>("decode/step" + std::to_string(k) + "/input_token/value").data.at(0));
    }
    return t;
  }();
  return tokens;
}

// A model of the oracle's config, weights and token map on `ops`.
model::Model oracle_model_on(const Ops& ops, CachePrecision precision = CachePrecision::kPacked) {
  const test::OracleModel& o = oracle();
  model::Model m(o.config, checkpoint::ModelWeights::load(test::kOracleDir + "weights.safetensors", o.config), o.token_map, ops);
  m.set_cache_precision(precision);
  return m;
}

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

void expect_same_record(const model::StepRecord& a, const model::StepRecord& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  bool nonzero = false;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_FALSE(std::isnan(a.logits[i])) << what << " logit " << i;
    nonzero = nonzero || a.logits[i] != 0.0f;
    ASSERT_EQ(bits(a.logits[i]), bits(b.logits[i])) << what << " logit " << i;
  }
  EXPECT_TRUE(nonzero) << what << ": all-zero logits";
  const auto same = [&](const auto& x, const auto& y, const char* name) {
    ASSERT_EQ(x.size(), y.size()) << what << " " << name;
    for (const auto& [l, t] : x) {
      ASSERT_TRUE(y.count(l)) << what << " " << name << " layer " << l;
      EXPECT_EQ(t.shape(), y.at(l).shape()) << what << " " << name << " layer " << l;
      EXPECT_EQ(t.data(), y.at(l).data()) << what << " " << name << " layer " << l;
    }
  };
  same(a.topk, b.topk, "topk");
  same(a.candidates, b.candidates, "candidates");
  same(a.engram_ids, b.engram_ids, "engram_ids");
  same(a.experts, b.experts, "experts");
}

void expect_same_draft(const model::DraftResult& a, const model::DraftResult& b, const std::string& what) {
  EXPECT_EQ(a.position, b.position) << what;
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.shape(), b.logits.shape()) << what;
  for (size_t i = 0; i < a.logits.data().size(); ++i) {
    ASSERT_EQ(bits(a.logits.data()[i]), bits(b.logits.data()[i])) << what << " logit " << i;
  }
  EXPECT_EQ(a.probs.data(), b.probs.data()) << what;
  ASSERT_EQ(a.confidence.size(), b.confidence.size()) << what;
  for (size_t i = 0; i < a.confidence.size(); ++i) EXPECT_EQ(bits(a.confidence[i]), bits(b.confidence[i])) << what;
}

void expect_same_state(const model::Model& ma, const model::ModelState& a, const model::Model& mb, const model::ModelState& b) {
  ASSERT_EQ(a.pos, b.pos);
  const std::vector<model::CacheView> va = ma.cache_views(a), vb = mb.cache_views(b);
  ASSERT_EQ(va.size(), vb.size());
  int64_t bytes = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_EQ(va[i].kind, vb[i].kind);
    EXPECT_EQ(va[i].layer, vb[i].layer);
    EXPECT_EQ(va[i].bytes, vb[i].bytes) << va[i].kind << " of layer " << va[i].layer;
    EXPECT_EQ(va[i].positions, vb[i].positions) << va[i].kind << " of layer " << va[i].layer;
    bytes += static_cast<int64_t>(va[i].bytes.size());
  }
  EXPECT_GT(bytes, 0) << "no cache bytes compared";
  for (size_t l = 0; l < a.layers.size(); ++l) {
    if (!a.layers[l].compressor) continue;
    const model::CompressorState &ca = *a.layers[l].compressor, &cb = *b.layers[l].compressor;
    EXPECT_EQ(ca.next_pos, cb.next_pos);
    EXPECT_EQ(ma.ops().download(ca.kv).data(), mb.ops().download(cb.kv).data()) << "compressor of layer " << l;
    EXPECT_EQ(ma.ops().download(ca.score).data(), mb.ops().download(cb.score).data()) << "compressor of layer " << l;
  }
  ASSERT_EQ(a.dspark_window_kv.size(), b.dspark_window_kv.size());
  for (size_t i = 0; i < a.dspark_window_kv.size(); ++i) {
    const model::WindowKvRing &ra = a.dspark_window_kv[i], &rb = b.dspark_window_kv[i];
    EXPECT_EQ(ra.positions, rb.positions) << "DSpark ring " << i;
    EXPECT_EQ(ma.ops().download(ra.bytes).data(), mb.ops().download(rb.bytes).data()) << "DSpark ring " << i;
  }
}

// Every method of the table (reference/seam/ops.h) but the memory ones, by the name FakeDeviceOps notes.
const std::vector<std::string>& all_ops() {
  static const std::vector<std::string> ops = {
      "slice_rows",   "embed",          "linear",          "linear_fp32",      "grouped_linear",
      "rms_norm",     "rope_rows",      "qdq",             "write_entries",    "read_entries",
      "concat_kv_rows", "attention_index_rows", "sparse_attn", "compress",      "index_weights",
      "index_scores", "candidate_blocks", "mask_scores",   "index_topk",       "hc_mixes",
      "hc_identity_pre", "hc_pre",      "hc_post",         "engram_hash_ids",  "engram_lookup",
      "engram_gate_residual", "moe_gate", "moe_routing_weights", "moe_experts", "hc_mean",
      "concat_cols",  "concat_rows",    "add_markov_bias"};
  return ops;
}

class OpsSeam : public ::testing::TestWithParam<CachePrecision> {};

TEST_P(OpsSeam, FakeDeviceRunsTheOracleForwardBitForBit) {
  FakeDeviceOps fake;
  const model::Model ref = oracle_model_on(reference_ops(), GetParam());
  const model::Model dev = oracle_model_on(fake, GetParam());
  model::ModelState sr = ref.new_state(), sd = dev.new_state();
  expect_same_record(ref.prefill(sr, oracle().tokens), dev.prefill(sd, oracle().tokens), "prefill");
  expect_same_draft(ref.draft(sr, 17), dev.draft(sd, 17), "draft after the prefill");
  for (size_t k = 0; k < decode_tokens().size(); ++k) {
    const std::string step = "decode step " + std::to_string(k);
    expect_same_record(ref.decode(sr, decode_tokens()[k]), dev.decode(sd, decode_tokens()[k]), step);
    expect_same_draft(ref.draft(sr, decode_tokens()[k]), dev.draft(sd, decode_tokens()[k]), "draft after " + step);
  }
  const model::DraftSampling sampled{0.9, 1234};
  expect_same_draft(ref.draft(sr, 40, sampled), dev.draft(sd, 40, sampled), "sampled draft");
  expect_same_state(ref, sr, dev, sd);
  // The host cannot read what the device holds.
  EXPECT_THROW(sd.layers[0].window_kv.bytes.data(), Error);
}

INSTANTIATE_TEST_SUITE_P(BothPrecisions, OpsSeam, ::testing::Values(CachePrecision::kPacked, CachePrecision::kBf16),
                         [](const ::testing::TestParamInfo<CachePrecision>& p) {
                           return std::string(p.param == CachePrecision::kPacked ? "Packed" : "Bf16");
                         });

// Without hooks, a decode step downloads nothing until every op of the step has run; then exactly
// its record: one tensor per recorded selection, plus the logits.
TEST(OpsSeamTransfers, AStepWithoutHooksDownloadsOnlyItsRecordAtTheEnd) {
  FakeDeviceOps fake;
  const model::Model dev = oracle_model_on(fake);
  model::ModelState s = dev.new_state();
  dev.prefill(s, test::oracle_tokens(0, 100));
  fake.clear();
  const model::StepRecord r = dev.decode(s, decode_tokens()[0]);
  const std::vector<std::string>& ev = fake.events;
  const auto first_download = std::find(ev.begin(), ev.end(), "download");
  ASSERT_NE(first_download, ev.end());
  const std::set<std::string> ops(all_ops().begin(), all_ops().end());
  for (auto it = first_download; it != ev.end(); ++it) {
    EXPECT_EQ(ops.count(*it), 0u) << "op " << *it << " ran after the step began downloading its record";
  }
  const int64_t downloads = std::count(ev.begin(), ev.end(), "download");
  const int64_t records =
      static_cast<int64_t>(r.topk.size() + r.candidates.size() + r.engram_ids.size() + r.experts.size()) + 1;
  EXPECT_EQ(downloads, records);
  EXPECT_GT(std::count_if(ev.begin(), first_download, [&](const std::string& e) { return ops.count(e) > 0; }), 100)
      << "the step ran too few ops";
  // A draft downloads each slot's logits row (the sampler runs on the host), then its logits and
  // confidence; nothing else.
  fake.clear();
  const model::DraftResult d = dev.draft(s, 3);
  EXPECT_EQ(std::count(fake.events.begin(), fake.events.end(), "download"),
            static_cast<int64_t>(d.tokens.size()) + 2);
}

// StepOptions::logits_only (a sampled replay's unchecked steps): the step downloads its logits and
// nothing else, with the logits and the state of a full step.
TEST(OpsSeamTransfers, ALogitsOnlyStepDownloadsOnlyItsLogits) {
  FakeDeviceOps full_ops, lean_ops;
  const model::Model full = oracle_model_on(full_ops), lean = oracle_model_on(lean_ops);
  model::ModelState sf = full.new_state(), sl = lean.new_state();
  model::StepOptions o;
  o.logits_only = true;
  for (const auto& [first, n] : {std::pair<int64_t, int64_t>{0, 100}, {100, 60}}) {
    full_ops.clear();
    lean_ops.clear();
    const model::StepRecord rf = full.forward_chunk(sf, test::oracle_tokens(first, n), model::StepOptions{});
    const model::StepRecord rl = lean.forward_chunk(sl, test::oracle_tokens(first, n), o);
    ASSERT_FALSE(rf.candidates.empty()) << "the full step records no candidate mask: nothing is left out";
    EXPECT_TRUE(rl.topk.empty() && rl.candidates.empty() && rl.engram_ids.empty() && rl.experts.empty());
    EXPECT_EQ(std::count(lean_ops.events.begin(), lean_ops.events.end(), "download"), 1);
    EXPECT_GT(std::count(full_ops.events.begin(), full_ops.events.end(), "download"), 1);
    ASSERT_EQ(rl.logits.size(), rf.logits.size());
    EXPECT_FALSE(std::all_of(rl.logits.begin(), rl.logits.end(), [](float v) { return v == 0.0f; }));
    EXPECT_EQ(rl.logits, rf.logits);
  }
  expect_same_state(full, sf, lean, sl);
}

// Hooks see host values and their replacements reach the device: teacher forcing on the fake
// device gives the bits it gives on the host, and a replaced expert choice gets its weights.
TEST(OpsSeamTransfers, HooksSeeAndReplaceDeviceValues) {
  FakeDeviceOps fake;
  model::Model ref = oracle_model_on(reference_ops());
  model::Model dev = oracle_model_on(fake);
  std::vector<std::vector<float>> seen_ref, seen_dev;
  const auto hooks = [](std::vector<std::vector<float>>& seen) {
    model::ForwardHooks h;
    h.tensor = [&seen](model::Component what, int layer, Tensor<float>& v) {
      seen.push_back(v.data());
      if (what == model::Component::kAttnOut && layer == 3) v.at(0, 0) = 0.5f;  // a forced value
    };
    h.index = [](model::Component what, int layer, Tensor<int32_t>& v) {
      if (what != model::Component::kExperts || layer != 2) return;
      const std::set<int32_t> used(v.row(0), v.row(0) + v.dim(1));  // token 0's last expert -> the lowest unused
      for (int32_t e = 0; used.count(v.at(0, v.dim(1) - 1)) != 0; ++e) {
        if (used.count(e) == 0) v.at(0, v.dim(1) - 1) = e;
      }
    };
    return h;
  };
  ref.set_hooks(hooks(seen_ref));
  dev.set_hooks(hooks(seen_dev));
  model::ModelState sr = ref.new_state(), sd = dev.new_state();
  expect_same_record(ref.prefill(sr, test::oracle_tokens(0, 40)), dev.prefill(sd, test::oracle_tokens(0, 40)),
                     "hooked prefill");
  expect_same_record(ref.decode(sr, 5), dev.decode(sd, 5), "hooked decode");
  EXPECT_EQ(seen_ref, seen_dev);
  EXPECT_GT(seen_dev.size(), 100u);
  EXPECT_GT(fake.calls.at("moe_routing_weights"), 0);
  EXPECT_GT(fake.calls.at("upload"), 0);
  expect_same_state(ref, sr, dev, sd);
}

// ForwardHooks::skipped and ::read_only (a sampled replay's side A): a skipped component is neither
// shown to the hooks nor moved to the host, a read-only hook's values are downloaded once and never
// uploaded back (its writes reach nothing), and the step's results are those of a step without hooks.
TEST(OpsSeamTransfers, SkippedComponentsAndReadOnlyHooksMoveNothingBack) {
  FakeDeviceOps plain_ops, all_ops_seen, read_only_ops;
  const model::Model plain = oracle_model_on(plain_ops);
  model::Model all = oracle_model_on(all_ops_seen), read_only = oracle_model_on(read_only_ops);
  std::map<model::Component, int64_t> seen_all, seen_read_only;
  const auto hooks = [](std::map<model::Component, int64_t>& seen, bool write) {
    model::ForwardHooks h;
    h.tensor = [&seen, write](model::Component what, int, Tensor<float>& v) {
      ++seen[what];
      if (write && v.numel() > 0) v.data()[0] = 1e30f;  // it must not reach a read-only step
    };
    h.index = [&seen, write](model::Component what, int, Tensor<int32_t>& v) {
      ++seen[what];
      if (write && v.numel() > 0) v.data()[0] = -7;
    };
    h.mask = [&seen](model::Component what, int, Tensor<uint8_t>&) { ++seen[what]; };
    return h;
  };
  model::ForwardHooks ro = hooks(seen_read_only, /*write=*/true);
  ro.skipped = {model::Component::kIndexScores, model::Component::kLogits};
  ro.read_only = true;
  all.set_hooks(hooks(seen_all, /*write=*/false));
  read_only.set_hooks(ro);
  const std::vector<int64_t> tokens = test::oracle_tokens(0, 40);
  model::ModelState sp = plain.new_state(), sa = all.new_state(), sr = read_only.new_state();
  const model::StepRecord rp = plain.prefill(sp, tokens);
  all.prefill(sa, tokens);
  const model::StepRecord rr = read_only.prefill(sr, tokens);
  ASSERT_GT(seen_all[model::Component::kIndexScores], 0) << "the oracle step has no index scores: the skip is untested";
  ASSERT_GT(seen_all[model::Component::kLogits], 0);
  EXPECT_EQ(seen_read_only.count(model::Component::kIndexScores), 0u);
  EXPECT_EQ(seen_read_only.count(model::Component::kLogits), 0u);
  int64_t shown = 0;
  for (const auto& [what, n] : seen_all) {
    if (what == model::Component::kIndexScores || what == model::Component::kLogits) continue;
    EXPECT_EQ(seen_read_only[what], n) << name(what);
    shown += n;
  }
  EXPECT_GT(shown, 100);
  expect_same_record(rp, rr, "read-only hooked prefill");
  expect_same_state(plain, sp, read_only, sr);
  // Transfers: each shown value is downloaded once more than without hooks, none uploaded back.
  EXPECT_EQ(read_only_ops.calls["download"] - plain_ops.calls["download"], shown);
  EXPECT_EQ(read_only_ops.calls["upload"], plain_ops.calls["upload"]);
  EXPECT_EQ(all_ops_seen.calls["upload"] - plain_ops.calls["upload"],
            shown + seen_all[model::Component::kIndexScores] + seen_all[model::Component::kLogits]);
}

// Decoder replay (rows after the candidate source dropped) and encoder replay (the rings rebuilt)
// through the seam.
TEST(OpsSeamReplay, BoundedReplayRunsThroughTheSeam) {
  FakeDeviceOps fake;
  const model::Model ref = oracle_model_on(reference_ops());
  const model::Model dev = oracle_model_on(fake);
  model::ModelState sr = ref.new_state(), sd = dev.new_state();
  model::StepOptions o;
  o.decoder_replay_rows = 7;
  expect_same_record(ref.forward_chunk(sr, test::oracle_tokens(0, 120), o),
                     dev.forward_chunk(sd, test::oracle_tokens(0, 120), o), "decoder replay");
  ref.replay_local_state(sr, test::oracle_tokens(56, 64));
  dev.replay_local_state(sd, test::oracle_tokens(56, 64));
  expect_same_record(ref.decode(sr, 7), dev.decode(sd, 7), "after encoder replay");
  expect_same_state(ref, sr, dev, sd);
}

// Every op of the table runs in the tests above (so none of them is dead or bypassed); this runs
// them all once more in one fresh model and checks the list.
TEST(OpsSeamCoverage, EveryOpOfTheTableRuns) {
  FakeDeviceOps fake;
  model::Model dev = oracle_model_on(fake);
  model::ForwardHooks h;
  h.index = [](model::Component, int, Tensor<int32_t>&) {};  // experts hooked: routing weights recomputed
  dev.set_hooks(h);
  model::ModelState replayed = dev.new_state();
  model::StepOptions o;
  o.decoder_replay_rows = 3;  // slices the published selections too
  dev.forward_chunk(replayed, test::oracle_tokens(0, 80), o);
  model::ModelState s = dev.new_state();
  dev.prefill(s, test::oracle_tokens(0, 80));
  dev.decode(s, 9);  // reads the rings (read_entries)
  dev.draft(s, 9);   // the DSpark ops
  for (const std::string& op : all_ops()) EXPECT_GT(fake.calls[op], 0) << op << " never ran";
}

// ForwardingOps over the fake device: every method, the memory ones included, reaches the inner
// table (an op it kept would see device tensors it cannot read and throw), with the same bits.
TEST(ForwardingOps, ForwardsEveryMethodToItsInnerTableBitForBit) {
  FakeDeviceOps fake;
  const ForwardingOps wrapped(fake);
  EXPECT_EQ(wrapped.name(), "forwarding(fake-device)");
  EXPECT_EQ(ForwardingOps(fake, "label").name(), "label");
  model::Model dev = oracle_model_on(wrapped);
  const model::Model ref = oracle_model_on(reference_ops());
  model::ForwardHooks h;
  h.index = [](model::Component, int, Tensor<int32_t>&) {};  // experts hooked: routing weights recomputed
  dev.set_hooks(h);
  model::ModelState replayed = dev.new_state();
  model::StepOptions o;
  o.decoder_replay_rows = 3;
  dev.forward_chunk(replayed, test::oracle_tokens(0, 80), o);
  model::ModelState sd = dev.new_state(), sr = ref.new_state();
  expect_same_record(ref.prefill(sr, test::oracle_tokens(0, 80)), dev.prefill(sd, test::oracle_tokens(0, 80)),
                     "prefill");
  expect_same_record(ref.decode(sr, 9), dev.decode(sd, 9), "decode");
  expect_same_draft(ref.draft(sr, 9), dev.draft(sd, 9), "draft");
  expect_same_state(ref, sr, dev, sd);
  for (const std::string& op : all_ops()) EXPECT_GT(fake.calls[op], 0) << op << " never reached the inner table";
  EXPECT_GT(fake.calls["upload"], 0);
  EXPECT_GT(fake.calls["download"], 0);
}

// current_layer(): the layer whose RoPE table the latest rope_rows call used, so a wrapper knows
// which layer an op belongs to (the zoo's Reuse and RoPE bugs, a Python port's per-layer ops).
TEST(ForwardingOps, CurrentLayerFollowsTheAttentionSublayers) {
  struct LayerOfEachAttention : ForwardingOps {
    mutable std::vector<int> layers;
    Tensor<float> sparse_attn(const Tensor<float>& q, const Tensor<float>& kv, const CacheRows& c,
                              const Tensor<float>& sink, const Tensor<int32_t>& idxs, float scale) const override {
      layers.push_back(current_layer());
      return ForwardingOps::sparse_attn(q, kv, c, sink, idxs, scale);
    }
  } ops;
  EXPECT_EQ(ops.current_layer(), -1);
  const model::Model m = oracle_model_on(ops);
  model::ModelState s = m.new_state();
  m.prefill(s, test::oracle_tokens(0, 40));
  std::vector<int> want(static_cast<size_t>(oracle().config.n_layers));
  for (size_t l = 0; l < want.size(); ++l) want[l] = static_cast<int>(l);
  EXPECT_EQ(ops.layers, want);
  ops.layers.clear();
  m.draft(s, 9);  // the DSpark blocks' attention: layers n_layers .. n_layers + n_mtp_layers - 1
  ASSERT_EQ(static_cast<int>(ops.layers.size()), oracle().config.n_mtp_layers);
  for (int i = 0; i < oracle().config.n_mtp_layers; ++i) EXPECT_EQ(ops.layers[static_cast<size_t>(i)], oracle().config.n_layers + i);
}

TEST(OpsSeamTensor, DeviceTensorsAreOpaqueAndCopiedDeeply) {
  Tensor<float> d = Tensor<float>::on_device({2, 3}, std::make_unique<test::FakeStorage<float>>(std::vector<float>(6, 1.0f)),
                                             "x");
  EXPECT_FALSE(d.on_host());
  EXPECT_EQ(d.where(), "fake-device");
  EXPECT_THROW(d.data(), Error);
  EXPECT_THROW(d.at(0, 0), Error);
  Tensor<float> copy = d;
  static_cast<test::FakeStorage<float>*>(copy.storage())->values[0] = 7.0f;
  EXPECT_EQ(static_cast<test::FakeStorage<float>*>(d.storage())->values[0], 1.0f) << "a copy must not share storage";
  Tensor<float> v = std::move(copy).reshaped({3, 2});
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(v.on_host());
  EXPECT_THROW(std::move(v).reshaped({4, 2}), Error);
}

}  // namespace
}  // namespace dsv41::reference::seam
