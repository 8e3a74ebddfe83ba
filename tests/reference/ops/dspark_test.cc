// The DSpark draft head against the official run (golden/oracle: prefill/dspark, decode/stepK/dspark,
// the DSpark rings in prefill/state and decode/final_state; tie_lowest_index.h5 for the free run).
// docs/agreement.md (DSpark) records the numbers these tests print; docs/dspark.md the semantics.
//
//   1. main_hidden is the mean over the hc copies of each target layer's INPUT, after its Engram
//      (bit-exact; golden/runs/w128_long_p1531 has an Engram at target layer 3 and decides it).
//   2. Teacher-forced at the prefill and every decode step: the official main_hidden gives main_x
//      and the rings bit for bit; given the ring, the draft block's internals, logits, Markov
//      items and confidence within their bounds, the draft ids equal.
//   3. Free-running: our own forward and draft against the tie-rule run, measured.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/base.h"
#include "golden/golden_io.h"
#include "reference/ops/attention.h"
#include "reference/ops/dspark.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/linear.h"
#include "reference/ops/mhc.h"
#include "reference/ops/mhc_budget.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/model/model.h"
#include "scenarios/agree/oracle_run.h"
#include "tests/support/oracle_model.h"

namespace dsv41::reference {
namespace {

using scenarios::agree::OracleRun;

const std::string kRuns = DSV41_SOURCE_DIR "/golden/runs/";

const golden::H5File& prefill_file() {
  static const golden::H5File f(test::kOracleDir + "prefill.h5");
  return f;
}
const golden::H5File& decode_file() {
  static const golden::H5File f(test::kOracleDir + "decode.h5");
  return f;
}
const golden::H5File& streams_file() {
  static const golden::H5File f(test::kOracleDir + "prefill_streams.h5");
  return f;
}

// How two float vectors agree: NMSE, the largest difference in bf16 ulps of the row's largest
// official value, and the bit-equal fraction (rows of `row` values).
struct Diff {
  double nmse = 0, max_row_ulps = 0, equal_frac = 1;
};
Diff diff(const std::vector<float>& got, const std::vector<float>& want, int64_t row) {
  EXPECT_EQ(got.size(), want.size());
  Diff d;
  double num = 0, den = 0;
  size_t equal = 0;
  for (size_t r0 = 0; r0 < want.size() && got.size() == want.size(); r0 += static_cast<size_t>(row)) {
    double rmax = 0, dmax = 0;
    for (size_t i = r0; i < r0 + static_cast<size_t>(row); ++i) {
      const double e = double{got[i]} - want[i];
      num += e * e;
      den += double{want[i]} * want[i];
      dmax = std::max(dmax, std::fabs(e));
      rmax = std::max(rmax, std::fabs(double{want[i]}));
      equal += f32_bits(got[i]) == f32_bits(want[i]);
    }
    if (rmax > 0) d.max_row_ulps = std::max(d.max_row_ulps, dmax / std::ldexp(1.0, int(std::floor(std::log2(rmax))) - 7));
  }
  d.nmse = den > 0 ? num / den : num;
  d.equal_frac = want.empty() ? 1.0 : double(equal) / double(want.size());
  return d;
}

std::vector<float> bf16_item(const golden::H5File& f, const std::string& item) { return OracleRun::bf16(f, item).data(); }
std::vector<float> f32_item(const golden::H5File& f, const std::string& item) { return OracleRun::f32(f, item).data(); }
std::vector<int64_t> i64_item(const golden::H5File& f, const std::string& item) {
  return f.read<int64_t>(item + "/value").data;
}

// Every value a draft showed its hooks, by (component, layer); the tokens replaced by `forced`
// (teacher forcing of the Markov chain) when it is not empty.
struct DraftCapture {
  std::map<std::pair<std::string, int>, Tensor<float>> f;
  std::map<std::pair<std::string, int>, Tensor<int32_t>> i;
  std::vector<int64_t> forced;  // [block] official draft_ids[1 ..]
  model::ForwardHooks hooks() {
    model::ForwardHooks h;
    h.tensor = [this](model::Component what, int layer, Tensor<float>& v) { f[{name(what), layer}] = v; };
    h.index = [this](model::Component what, int layer, Tensor<int32_t>& v) {
      i[{name(what), layer}] = v;
      if (what == model::Component::kDSparkToken && !forced.empty()) v.at(0, 0) = static_cast<int32_t>(forced.at(layer));
    };
    return h;
  }
  const std::vector<float>& at(const char* what, int layer) const { return f.at({what, layer}).data(); }
};

// ----------------------------------------------------------------------------- 1. main_hidden

TEST(DSparkMainHidden, IsTheMeanOfTheTargetLayersInputs) {
  const test::OracleModel& o = test::oracle_model();
  std::vector<Tensor<float>> parts;
  for (int l : o.config.dspark_target_layer_ids) {  // 7, 8, 9: no Engram: the input is l-1's output
    parts.push_back(hc_mean(OracleRun::bf16(streams_file(), "prefill/" + scenarios::agree::oracle_layer(l - 1) + "/out_stream")
                                .reshaped({333, o.config.hc_mult, o.config.dim})));
  }
  const Diff d = diff(concat_cols(parts).data(), bf16_item(prefill_file(), "prefill/main_hidden"), o.config.dim);
  EXPECT_EQ(d.equal_frac, 1.0) << "nmse " << d.nmse;
}

// Target layer 3 of w128_long_p1531 has an Engram: main_hidden holds the stream after it.
TEST(DSparkMainHidden, ReadsTheStreamAfterTheEngram) {
  const golden::H5File dec(kRuns + "w128_long_p1531/decode.h5");
  const ModelConfig c = load_config_file(kRuns + "w128_long_p1531/config.json");
  ASSERT_EQ(c.dspark_target_layer_ids.front(), 3);
  ASSERT_EQ(c.engram_layer_ids.back(), 3);
  for (int k = 0; dec.has("decode/step" + std::to_string(k)); ++k) {
    const std::string s = "decode/step" + std::to_string(k) + "/";
    const std::vector<float> mh = bf16_item(dec, s + "main_hidden");
    const std::vector<float> first(mh.begin(), mh.begin() + c.dim);
    const auto mean_of = [&](const std::string& item) {
      return hc_mean(OracleRun::bf16(dec, s + item).reshaped({1, c.hc_mult, c.dim})).data();
    };
    const double after = diff(mean_of("layer03/engram_out"), first, c.dim).equal_frac;
    const double before = diff(mean_of("layer02/out_stream"), first, c.dim).equal_frac;
    std::printf("w128_long_p1531 decode step %d: main_hidden[0:dim] bit-equal %.4f to the stream after the Engram, "
                "%.4f before it\n", k, after, before);
    EXPECT_EQ(after, 1.0) << "step " << k;
    EXPECT_LT(before, 0.1) << "step " << k;
  }
}

// ----------------------------------------------------------------------------- 2. teacher-forced

// Measured agreement of one item, printed; checked against its bound (docs/agreement.md).
struct Bound {
  double max_nmse = 0, max_ulps = 0, min_equal = 1;  // the defaults: bit-exact
};
void expect_within(const std::string& what, const Diff& d, const Bound& b) {
  std::printf("  %-34s nmse %.3g  max %.3g bf16-ulp of the row max  bit-equal %.4f\n", what.c_str(), d.nmse,
              d.max_row_ulps, d.equal_frac);
  EXPECT_LE(d.nmse, b.max_nmse) << what;
  EXPECT_LE(d.max_row_ulps, b.max_ulps) << what;
  EXPECT_GE(d.equal_frac, b.min_equal) << what;
}

TEST(DSparkTeacherForced, MainXFromTheOfficialMainHiddenIsBitExact) {
  const test::OracleModel& o = test::oracle_model();
  const ModelConfig& c = o.config;
  const checkpoint::DSparkWeights& w = o.model->weights().dspark;
  const auto main_x = [&](const golden::H5File& f, const std::string& step) {
    Tensor<float> mh = OracleRun::bf16(f, step + "main_hidden");
    const int64_t T = mh.numel() / w.main_proj.in;
    return rms_norm(linear(std::move(mh).reshaped({T, w.main_proj.in}), w.main_proj), w.main_norm.data(), c.norm_eps);
  };
  expect_within("prefill dspark_main_x", diff(main_x(prefill_file(), "prefill/").data(),
                                              bf16_item(prefill_file(), "prefill/dspark/dspark_main_x"), c.dim), {});
  for (int k = 0; decode_file().has("decode/step" + std::to_string(k)); ++k) {
    const std::string s = "decode/step" + std::to_string(k) + "/";
    expect_within(s + "dspark_main_x",
                  diff(main_x(decode_file(), s).data(), bf16_item(decode_file(), s + "dspark/dspark_main_x"), c.dim), {});
  }
}

// The bounds of the draft's items, teacher-forced (the official main_x, the official draft tokens
// feeding the Markov chain). Origins in docs/agreement.md (DSpark).
const Bound kExact{};
const Bound kStream{1e-6, 2.0, 0.99};  // a block's bf16 outputs: the backbone's stream bounds (scenarios/agree/agree.h)
constexpr double kHeadMaxNmse = 1e-12;  // fp32 GEMMs (head K = dim, Markov head K = rank): the logits bound

void expect_nmse(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, int64_t row,
                 double bound) {
  const Diff d = diff(got, want, row);
  std::printf("  %-34s nmse %.3g  bit-equal %.4f (bound nmse %.0e)\n", what.c_str(), d.nmse, d.equal_frac, bound);
  EXPECT_LE(d.nmse, bound) << what;
}

// The mixes against the official ones, within their error budget (docs/mhc.md: the official fp32
// GEMM's order; reference/ops/mhc_budget.h), computed on the block's own input (bit-exact here).
void expect_mixes(const std::string& what, const DraftCapture& cap, const char* sublayer, int layer,
                  const HcWeights& w, const ModelConfig& c, const std::string& item) {
  const std::string p = std::string("dspark_") + sublayer;
  const HcMixes ours{cap.f.at({p + "_pre", layer}), cap.f.at({p + "_post", layer}), cap.f.at({p + "_comb", layer})};
  HcMixes official = ours;
  official.pre.data() = f32_item(decode_file(), item + "_pre");
  official.post.data() = f32_item(decode_file(), item + "_post");
  official.comb.data() = f32_item(decode_file(), item + "_comb");
  const Tensor<float>& x = cap.f.at({std::string(sublayer) == "hc_attn" ? "dspark_in_stream" : "dspark_attn_stream", layer});
  const MixesBudget b = hc_mixes_budget(x, w.fn.data(), w.scale.data(), w.base.data(), c.norm_eps, c.hc_sinkhorn_iters,
                                        c.hc_eps, official);
  const double ratio = mixes_budget_ratio(ours, official, b);
  std::printf("  %-34s %.3g of the budget\n", what.c_str(), ratio);
  EXPECT_LE(ratio, 1.0) << what;
}

// The confidence: one fp32 dot of K = dim + rank terms per slot on each side (torch's F.linear, the
// reference's FMA chain), so |ours - official| <= 2 gamma_K sum_k |in_k w_k| (Higham's bound of a
// recursive fp32 sum, both sides; gamma_K = K u / (1 - K u), u = 2^-24), on the same inputs.
void expect_confidence(const std::vector<float>& got, const std::vector<float>& want, const DraftCapture& cap,
                       const ModelConfig& c, const checkpoint::DSparkWeights& w) {
  const int layer = c.n_layers + c.n_mtp_layers - 1;
  const Tensor<float> x = hc_pre(cap.f.at({"dspark_out_stream", layer}), cap.f.at({"dspark_hc_ffn_pre", layer}));
  const int64_t K = c.dim + c.dspark_markov_rank;
  const double u = 0x1p-24, gamma = K * u / (1 - K * u);
  double worst = 0;
  for (int64_t i = 0; i < c.dspark_block_size; ++i) {
    const std::vector<float>& e = cap.at("dspark_markov_embed", static_cast<int>(i));
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double in = k < c.dim ? x.at(i, k) : e[static_cast<size_t>(k - c.dim)];
      s += std::fabs(in * w.confidence_proj.w[static_cast<size_t>(k)]);
    }
    const double d = std::fabs(double{got[static_cast<size_t>(i)]} - want[static_cast<size_t>(i)]);
    worst = std::max(worst, d / (2 * gamma * s));
  }
  std::printf("  %-34s max |diff| %.3g of the fp32 dot bound\n", "confidence", worst);
  EXPECT_LE(worst, 1.0) << "confidence";
}

TEST(DSparkTeacherForced, TheRingsAndEveryDecodeStepsDraft) {
  const test::OracleModel& o = test::oracle_model();
  const ModelConfig& c = o.config;
  model::Model& m = *o.model;
  const seam::Ops& ops = m.ops();
  const int layer = c.n_layers;  // dspark0
  const int64_t B = c.dspark_block_size, dim = c.dim, hc = c.hc_mult, V = c.vocab_size;
  // Forward steps with the official main_x: the rings are a function of it alone.
  const auto forward = [&](model::ModelState& s, const std::vector<int64_t>& tokens, const std::string& item) {
    model::ForwardHooks h;
    const golden::H5File& f = item == "prefill/" ? prefill_file() : decode_file();
    const Tensor<float> official = OracleRun::bf16(f, item + "dspark/dspark_main_x");
    h.tensor = [&](model::Component what, int, Tensor<float>& v) {
      if (what == model::Component::kDSparkMainX) v.data() = official.data();
    };
    m.set_hooks(h);
    m.forward_chunk(s, tokens);
    m.set_hooks({});
  };
  const auto ring_diff = [&](const model::ModelState& s, const golden::H5File& f, const std::string& item) {
    return diff(s.dspark_window_kv.at(0).read_all(ops).data(), bf16_item(f, item), c.head_dim);
  };
  model::ModelState s = m.new_state();
  forward(s, o.tokens, "prefill/");
  expect_within("prefill/state/dspark0 ring", ring_diff(s, prefill_file(), "prefill/state/dspark0/window_kv_cache"), kExact);
  const RopeTable rope = RopeTable::for_layer(c, layer);
  const checkpoint::AttentionWeights& aw = m.weights().blocks[static_cast<size_t>(layer)].attn;
  int ids_equal = 0, steps = 0;
  for (int k = 0; decode_file().has("decode/step" + std::to_string(k)); ++k, ++steps) {
    const std::string st = "decode/step" + std::to_string(k) + "/", ds = st + "dspark/", b0 = ds + "dspark0/";
    std::printf("decode step %d\n", k);
    forward(s, {i64_item(decode_file(), st + "input_token").at(0)}, st);
    const std::vector<int64_t> ids = i64_item(decode_file(), ds + "draft_ids");  // [B + 1]
    DraftCapture cap;
    cap.forced.assign(ids.begin() + 1, ids.end());
    m.set_hooks(cap.hooks());
    const model::DraftResult r = m.draft(s, ids.at(0));
    m.set_hooks({});
    // The block's inputs and its attention, item by item.
    const std::vector<float>& emb = cap.at("dspark_embed", -1);
    std::vector<float> copy0;
    for (int64_t t = 0; t < B; ++t) copy0.insert(copy0.end(), emb.begin() + t * hc * dim, emb.begin() + (t * hc + 1) * dim);
    expect_within("embed", diff(copy0, bf16_item(decode_file(), ds + "embed"), dim), kExact);
    expect_within("attn_in", diff(cap.at("dspark_attn_in", layer), bf16_item(decode_file(), b0 + "attn_in"), dim), kExact);
    // sparse_attn's rows: the ring's W slots (the step's position written), then the draft's own
    // K/V, from the official attention input; its queries from the same.
    const std::vector<float> kv_rows = bf16_item(decode_file(), b0 + "sparse_kv");
    const int64_t W = c.window_size, D = c.head_dim;
    expect_within("sparse_kv ring rows", diff(s.dspark_window_kv[0].read_all(ops).data(),
                                              std::vector<float>(kv_rows.begin(), kv_rows.begin() + W * D), D), kExact);
    const Tensor<float> a_in = OracleRun::bf16(decode_file(), b0 + "attn_in").reshaped({B, dim});
    Tensor<float> kv = rms_norm(linear(a_in, aw.wkv), aw.kv_norm.data(), c.norm_eps);
    rope_rows(kv, 1, rope, s.pos, 1, false);
    expect_within("sparse_kv block rows", diff(qdq(formats::CacheFormat::kWindowKvFp8, kv).data(),
                                               std::vector<float>(kv_rows.begin() + W * D, kv_rows.end()), D), kExact);
    Tensor<float> q = linear(rms_norm(linear(a_in, aw.wq_a), aw.q_norm.data(), c.norm_eps), aw.wq_b);
    rope_rows(q, c.n_heads, rope, s.pos, 1, false);
    expect_within("sparse_q", diff(q.data(), bf16_item(decode_file(), b0 + "sparse_q"), D), kExact);
    const Tensor<int32_t> idxs = OracleRun::i32(decode_file(), b0 + "attn_topk_idxs");
    EXPECT_EQ(idxs.data(), dspark_index_rows(W, B).data()) << "the official rows of a full ring";
    const Tensor<float> o_attn =
        sparse_attn(OracleRun::bf16(decode_file(), b0 + "sparse_q").reshaped({B, c.n_heads, D}),
                    Tensor<float>({W + B, D}, kv_rows, "kv"), aw.attn_sink.data(),
                    std::move(Tensor<int32_t>(idxs)).reshaped({B, W + B}), static_cast<float>(std::pow(double(D), -0.5)));
    expect_within("sparse_out", diff(o_attn.data(), bf16_item(decode_file(), b0 + "sparse_out"), D), kStream);
    // The block's outputs.
    expect_within("attn_out", diff(cap.at("dspark_attn_out", layer), bf16_item(decode_file(), b0 + "attn_out"), dim), kStream);
    const checkpoint::BlockWeights& bw = m.weights().blocks[static_cast<size_t>(layer)];
    expect_mixes("hc_attn mixes", cap, "hc_attn", layer, bw.hc_attn, c, b0 + "hc_attn");
    expect_mixes("hc_ffn mixes", cap, "hc_ffn", layer, bw.hc_ffn, c, b0 + "hc_ffn");
    expect_within("ffn_in", diff(cap.at("dspark_ffn_in", layer), bf16_item(decode_file(), b0 + "ffn_in"), dim), kStream);
    std::vector<int32_t> experts;
    for (int64_t e : i64_item(decode_file(), b0 + "gate_indices")) experts.push_back(static_cast<int32_t>(e));
    EXPECT_EQ(cap.i.at({"dspark_experts", layer}).data(), experts) << "experts";
    expect_within("ffn_out", diff(cap.at("dspark_ffn_out", layer), bf16_item(decode_file(), b0 + "ffn_out"), dim), kStream);
    expect_within("out_stream", diff(cap.at("dspark_out_stream", layer), bf16_item(decode_file(), b0 + "out_stream"), dim),
                  kStream);
    expect_within("norm_out", diff(cap.at("dspark_norm_out", -1), bf16_item(decode_file(), ds + "dspark_norm_out"), dim),
                  kStream);
    // The head, the Markov chain and the confidence.
    for (int i = 0; i < B; ++i) {
      const std::string mk = ds + "markov_" + std::to_string(i) + "/";
      EXPECT_EQ(i64_item(decode_file(), mk + "token").at(0), ids.at(static_cast<size_t>(i))) << "markov token " << i;
      expect_within(mk + "embed",
                    diff(cap.at("dspark_markov_embed", i), bf16_item(decode_file(), mk + "embed"), c.dspark_markov_rank),
                    kExact);
      expect_nmse(mk + "logits_bias", cap.at("dspark_markov_bias", i), f32_item(decode_file(), mk + "logits_bias"), V,
                  kHeadMaxNmse);
    }
    expect_nmse("draft_logits", r.logits.data(), f32_item(decode_file(), ds + "draft_logits"), V, kHeadMaxNmse);
    expect_confidence(r.confidence, f32_item(decode_file(), ds + "confidence"), cap, c, m.weights().dspark);
    std::vector<int64_t> own;
    for (int i = 0; i < B; ++i) own.push_back(cap.i.at({"dspark_token", i}).at(0, 0));
    ids_equal += own == cap.forced;
    EXPECT_EQ(own, cap.forced) << "draft ids, decode step " << k;
  }
  expect_within("decode/final_state/dspark0 ring", ring_diff(s, decode_file(), "decode/final_state/dspark0/window_kv_cache"),
                kExact);
  std::printf("draft ids equal at %d of %d decode steps\n", ids_equal, steps);
}

// ----------------------------------------------------------------------------- 3. free-running

// Our own forward (nothing forced) and our own draft after it, against the tie-rule run (the
// official code with dsv41's top-k tie rule): measured. The backbone's selections flip at
// near-ties (docs/agreement.md), which moves main_hidden and the argmax the draft continues.
TEST(DSparkFreeRunning, DraftsAgainstTheTieRuleRun) {
  const test::OracleModel& o = test::oracle_model();
  const ModelConfig& c = o.config;
  const model::Model& m = *o.model;
  const golden::H5File tie(test::kOracleDir + "tie_lowest_index.h5");
  model::ModelState s = m.new_state();
  m.prefill(s, o.tokens);
  int same_input = 0, same_ids = 0, steps = 0;
  double worst_nmse = 0, worst_conf = 0;
  for (int k = 0; decode_file().has("decode/step" + std::to_string(k)); ++k, ++steps) {
    const std::string st = "decode/step" + std::to_string(k) + "/";
    const model::StepRecord rec = m.decode(s, i64_item(decode_file(), st + "input_token").at(0));
    const int64_t argmax = std::max_element(rec.logits.begin(), rec.logits.end()) - rec.logits.begin();
    const model::DraftResult r = m.draft(s, argmax);
    const std::vector<int64_t> ids = i64_item(tie, st + "dspark/draft_ids");
    std::vector<int64_t> own = {argmax};
    own.insert(own.end(), r.tokens.begin(), r.tokens.end());
    const Diff d = diff(r.logits.data(), f32_item(tie, st + "dspark/draft_logits"), c.vocab_size);
    const std::vector<float> conf = f32_item(tie, st + "dspark/confidence");
    double dc = 0;
    for (size_t i = 0; i < conf.size(); ++i) dc = std::max(dc, std::fabs(double{r.confidence[i]} - conf[i]));
    std::printf("free-running step %d: input %s, ids %s, draft logits nmse %.3g, confidence max |diff| %.3g\n", k,
                argmax == ids[0] ? "equal" : "differs", own == ids ? "equal" : "differ", d.nmse, dc);
    same_input += argmax == ids[0];
    same_ids += own == ids;
    if (argmax == ids[0]) {
      worst_nmse = std::max(worst_nmse, d.nmse);
      worst_conf = std::max(worst_conf, dc);
    }
  }
  std::printf("free-running: same input token at %d of %d steps, same draft ids at %d; where the input agrees: "
              "logits nmse <= %.3g, confidence |diff| <= %.3g\n", same_input, steps, same_ids, worst_nmse, worst_conf);
  // Regression bounds (measured: 6 and 5 of 8, nmse 0.024, |diff| 0.139): a drift, not a defect;
  // a broken draft scores NMSE ~1 and draws other ids.
  EXPECT_GE(same_input, 5);
  EXPECT_GE(same_ids, 4);
  EXPECT_LE(worst_nmse, 0.1);
  EXPECT_LE(worst_conf, 0.3);
}

}  // namespace
}  // namespace dsv41::reference
