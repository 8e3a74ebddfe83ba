// scenarios/agree/agree_dspark.cc
//
// The DSpark part of `dsv41 agree` (scenarios/agree/agree.h; docs/agreement.md, DSpark): the draft head
// against the official forward_spec outputs of a run (decode/stepK/dspark/: draft_ids,
// draft_logits, confidence; the oracle also keeps main_x, the block's internals and the Markov
// items), and the DSpark rings (prefill/state/dsparkI, decode/final_state/dsparkI).
//
//   teacher-forced  the step ran with the official streams (the backbone forcing), so main_hidden
//                   is the official one and the rings are written from it; the draft after a
//                   decode step continues the official last token (draft_ids[0]) and its Markov
//                   chain is fed the official draft tokens; the draft block itself is not forced.
//                   Rows: main_x (stream bounds), the rings (bit for bit), draft logits (NMSE),
//                   confidence (the fp32 dot's bound), the own draft tokens (tie-equivalent),
//                   and where the run holds them the block output, experts and Markov bias.
//   free-running    our own draft after our own step (its argmax as the last token) against the
//                   lowest-index run: measured.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "base/error.h"
#include "scenarios/agree/agree_internal.h"

namespace dsv41::scenarios::agree::agree_detail {
namespace {

using reference::model::Component;
using reference::model::DraftResult;
using reference::model::ForwardHooks;
using reference::Tensor;

std::string dspark_group(const OracleStep& st) { return st.prefix + "dspark/"; }
std::string block_group(const OracleStep& st, int i) { return dspark_group(st) + "dspark" + std::to_string(i) + "/"; }

std::vector<int64_t> official_ids(const golden::H5File& f, const std::string& item) {
  return f.read<int64_t>(item + "/value").data;
}

// What a draft showed its hooks (the values it computed before any forcing).
struct DraftCapture {
  std::map<std::pair<dsv41::reference::model::Component, int>, dsv41::reference::Tensor<float>> f;
  std::map<std::pair<dsv41::reference::model::Component, int>, dsv41::reference::Tensor<int32_t>> i;
};

bool is_dspark_mix(dsv41::reference::model::Component c) {
  return c == reference::model::Component::kDSparkHcAttnPre || c == reference::model::Component::kDSparkHcAttnPost || c == reference::model::Component::kDSparkHcAttnComb ||
         c == reference::model::Component::kDSparkHcFfnPre || c == reference::model::Component::kDSparkHcFfnPost || c == reference::model::Component::kDSparkHcFfnComb;
}

// The official item of a DSpark block value ("hc_attn_pre", "attn_out", ...: the hook's name
// without its "dspark_" prefix), under the step's block group.
std::string block_item(const OracleStep& st, const reference::ModelConfig& c, Component what, int layer) {
  const std::string n = reference::model::name(what);
  return block_group(st, layer - c.n_layers) + (n.rfind("dspark_", 0) == 0 ? n.substr(7) : n);
}

// Does the run hold, for every DSpark block of this step, the official mixes and attention output
// (the block internals a forced attribution replaces)?
bool has_block_internals(const OracleStep& st, const reference::ModelConfig& c) {
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    for (const char* item : {"hc_attn_pre", "hc_attn_post", "hc_attn_comb", "hc_ffn_pre", "hc_ffn_post", "hc_ffn_comb",
                             "attn_out", "out_stream"}) {
      if (!st.items->has(block_group(st, i) + item)) return false;
    }
  }
  return true;
}

// Drafts after `state` with hooks that record every value and force the Markov chain's tokens
// to `forced` ([block], none when empty); the backend's defect applies as in a step. nudge > 0:
// every value of the DSpark blocks' mHC mixes is first moved one fp32 ulp up or down, the
// direction drawn from std::mt19937_64(nudge) (far inside the mixes' error budget, docs/mhc.md).
// official_internals: every DSpark block's mixes and attention output are replaced by the
// official ones (the forced attribution below; `cap` then records the official values).
reference::model::DraftResult run_draft(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                      const reference::model::ModelState& state, int64_t last_token, const std::vector<int64_t>& forced,
                      Defect& defect, DraftCapture& cap, uint64_t nudge = 0, bool official_internals = false) {
  ForwardHooks h;
  std::mt19937_64 rng(nudge);
  const reference::ModelConfig& c = run.config();
  h.tensor = [&cap, &rng, &st, &c, nudge, official_internals](Component what, int layer, Tensor<float>& v) {
    if (nudge > 0 && is_dspark_mix(what)) {
      for (float& x : v.data()) x = std::nextafter(x, (rng() & 1) ? INFINITY : -INFINITY);
    }
    if (official_internals && (is_dspark_mix(what) || what == Component::kDSparkAttnOut)) {
      copy_into(v, official_values(*st.items, block_item(st, c, what, layer), what == Component::kDSparkAttnOut),
                reference::model::name(what));
    }
    cap.f[{what, layer}] = v;  // what the draft went on with
  };
  h.index = [&cap, &forced](Component what, int layer, Tensor<int32_t>& v) {
    cap.i[{what, layer}] = v;
    if (what == Component::kDSparkToken && !forced.empty()) {
      v.at(0, 0) = static_cast<int32_t>(forced.at(static_cast<size_t>(layer)));
    }
  };
  model.set_hooks(defect.wrap(h, run.config(), st));
  reference::model::DraftSampling s;
  s.temperature = 0.0;  // the official runs sample at temperature 0 (argmax)
  try {
    DraftResult r = model.draft(state, last_token, s);
    model.set_hooks({});
    return r;
  } catch (...) {
    model.set_hooks({});
    throw;
  }
}

// |ours - official| / (2 gamma_K sum_k |in_k w_k|) over the slots: the confidence is one fp32 dot
// of K = dim + rank terms on each side (torch's F.linear, the reference's FMA chain); Higham's
// bound of a recursive fp32 sum, gamma_K = K u / (1 - K u), u = 2^-24, holds for any order when
// both sides take the same inputs (the block's output, which the draft computed: checked equal
// where the run keeps it).
double confidence_ratio(const reference::model::DraftResult& r, const std::vector<float>& official, const DraftCapture& cap,
                        const reference::model::Model& model) {
  const reference::ModelConfig& c = model.config();
  const int last = c.n_layers + c.n_mtp_layers - 1;
  const Tensor<float> x = reference::hc_pre(cap.f.at({Component::kDSparkOutStream, last}),
                                            cap.f.at({Component::kDSparkHcFfnPre, last}));
  const std::vector<float>& w = model.weights().dspark.confidence_proj.w;
  const int64_t K = c.dim + c.dspark_markov_rank;
  const double u = 0x1p-24, gamma = static_cast<double>(K) * u / (1 - static_cast<double>(K) * u);
  double worst = official.size() == r.confidence.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < r.confidence.size() && i < official.size(); ++i) {
    const std::vector<float>& e = cap.f.at({Component::kDSparkMarkovEmbed, static_cast<int>(i)}).data();
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double in = k < c.dim ? x.at(static_cast<int64_t>(i), k) : e[static_cast<size_t>(k - c.dim)];
      s += std::fabs(in * w[static_cast<size_t>(k)]);
    }
    const double d = std::fabs(double{r.confidence[i]} - official[i]);
    worst = std::max(worst, s > 0 ? d / (2 * gamma * s) : (d > 0 ? std::numeric_limits<double>::infinity() : 0.0));
    if (!std::isfinite(r.confidence[i])) worst = std::numeric_limits<double>::infinity();
  }
  return worst;
}

// Slot i's own token is tie-equivalent to the official one when equal, or when the two tokens'
// official logits differ by no more than 2 max|ours - official| over that row (a near-tie the
// logits' own error can flip).
double tie_equivalent_frac(const std::vector<int64_t>& own, const std::vector<int64_t>& official,
                           const std::vector<float>& ours, const std::vector<float>& theirs, int64_t vocab) {
  if (own.size() != official.size() || own.empty()) return 0.0;
  int64_t ok = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i] == official[i]) {
      ++ok;
      continue;
    }
    const size_t row = i * static_cast<size_t>(vocab);
    double delta = 0;
    for (int64_t v = 0; v < vocab; ++v) delta = std::max(delta, std::fabs(double{ours[row + v]} - theirs[row + v]));
    const double gap =
        std::fabs(double{theirs[row + static_cast<size_t>(own[i])]} - theirs[row + static_cast<size_t>(official[i])]);
    ok += gap <= 2 * delta;
  }
  return static_cast<double>(ok) / static_cast<double>(own.size());
}

// How far the draft at this step moves when its mixes move by one fp32 ulp (run_draft's nudge,
// seeds 1 .. kDraftNudges): the largest NMSE of the logits and of the confidence against the
// unnudged draft `base`. A step whose draft sits next to a bf16 rounding boundary moves; others
// do not move at all (measured: no nudge moves any oracle draft).
struct Sensitivity {
  double logits = 0, confidence = 0;
};
Sensitivity mixes_sensitivity(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                              const reference::model::ModelState& state, int64_t last_token, const std::vector<int64_t>& forced,
                              Defect& defect, const DraftResult& base) {
  Sensitivity s;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(kAgreeDraftNudges); ++seed) {
    DraftCapture cap;
    const reference::model::DraftResult r = run_draft(run, st, model, state, last_token, forced, defect, cap, seed);
    s.logits = std::max(s.logits, compare_rows(r.logits.data(), base.logits.data(), run.config().vocab_size).nmse);
    s.confidence = std::max(s.confidence, compare_rows(r.confidence, base.confidence,
                                                       static_cast<int64_t>(base.confidence.size())).nmse);
  }
  return s;
}

// A block's official mixes of one sublayer ("hc_attn" / "hc_ffn"), shaped like `like`.
reference::HcMixes official_block_mixes(const OracleStep& st, int block, const char* sublayer, const reference::HcMixes& like) {
  const std::string base = block_group(st, block) + sublayer;
  reference::HcMixes m{like.pre, like.post, like.comb};
  copy_into(m.pre, official_values(*st.items, base + "_pre", false), std::string(sublayer) + "_pre");
  copy_into(m.post, official_values(*st.items, base + "_post", false), std::string(sublayer) + "_post");
  copy_into(m.comb, official_values(*st.items, base + "_comb", false), std::string(sublayer) + "_comb");
  return m;
}

// The forced attribution of a draft beyond the head's bounds, where the run holds the blocks'
// internals (agree.h; the backbone's attribution, per DSpark block): (a) each block's own mixes
// of both sublayers within the mixes' budget on the official input (the attention's on the block
// input, the FFN's on the stream rebuilt from the official attention output and mixes), (b) its
// own attention output within kAttnOutMaxUlps / kAttnOutMaxNmse of the official one (a rounding
// inside sparse_attn over the ring and the block), and (c) the draft rerun with every block's
// official mixes and attention output within the head's strict bounds. Records the evidence.
// exact_attention: every block's own attention output was bit-exact.
bool forced_attribution(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                        const reference::model::ModelState& state, int64_t last_token, const std::vector<int64_t>& forced,
                        Defect& defect, const DraftCapture& cap, RowSink& sink, bool& exact_attention) {
  const reference::ModelConfig& c = run.config();
  bool ok = true;
  exact_attention = true;
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    const int layer = c.n_layers + i;
    const reference::checkpoint::BlockWeights& bw = model.weights().blocks[static_cast<size_t>(layer)];
    const Tensor<float>& input = cap.f.at({Component::kDSparkInStream, layer});
    const reference::HcMixes ours_attn{cap.f.at({Component::kDSparkHcAttnPre, layer}), cap.f.at({Component::kDSparkHcAttnPost, layer}),
                                       cap.f.at({Component::kDSparkHcAttnComb, layer})};
    const reference::HcMixes off_attn = official_block_mixes(st, i, "hc_attn", ours_attn);
    Tensor<float> off_attn_out = cap.f.at({Component::kDSparkAttnOut, layer});
    copy_into(off_attn_out, official_values(*st.items, block_group(st, i) + "attn_out", true), "attn_out");
    const Tensor<float> mid = reference::hc_post(off_attn_out, input, off_attn.post, off_attn.comb);
    const reference::HcMixes ours_ffn =
        reference::hc_mixes(mid, bw.hc_ffn.fn.data(), bw.hc_ffn.scale.data(), bw.hc_ffn.base.data(), c.norm_eps,
                            c.hc_sinkhorn_iters, c.hc_eps);
    const reference::HcMixes off_ffn = official_block_mixes(st, i, "hc_ffn", ours_ffn);
    ok = add_mixes_budget_row(sink, layer, "dspark_hc_attn_mixes", ours_attn, off_attn, input, bw.hc_attn, c) && ok;
    ok = add_mixes_budget_row(sink, layer, "dspark_hc_ffn_mixes", ours_ffn, off_ffn, mid, bw.hc_ffn, c) && ok;
    const StreamDiff a = compare_rows(cap.f.at({Component::kDSparkAttnOut, layer}).data(), off_attn_out.data(), c.dim);
    ok = ok && a.finite && a.max_row_ulps <= kAttnOutMaxUlps && a.nmse <= kAttnOutMaxNmse;
    exact_attention = exact_attention && a.finite && a.equal_frac == 1.0;
    const char* note = "docs/agreement.md (DSpark): a bf16 rounding inside sparse_attn over the ring and the block may go "
                       "the other way at a midpoint (the official exp / fp32 sum order); the backbone's bound";
    sink.add(layer, "dspark_attn_out", "max_row_ulps", a.max_row_ulps, judge::make_tolerance(kAttnOutMaxUlps, false, "measured", note));
    sink.add(layer, "dspark_attn_out", "nmse", a.nmse, judge::make_tolerance(kAttnOutMaxNmse, false, "measured", note));
  }
  DraftCapture rerun;
  const DraftResult r = run_draft(run, st, model, state, last_token, forced, defect, rerun, 0, true);
  const StreamDiff ld = compare_rows(r.logits.data(), official_values(*st.items, dspark_group(st) + "draft_logits", false),
                                     c.vocab_size);
  const double conf = confidence_ratio(r, official_values(*st.items, dspark_group(st) + "confidence", false), rerun, model);
  ok = ok && ld.nmse <= kAgreeDraftLogitsMaxNmse && conf <= 1.0;
  sink.add(-1, "dspark_logits", "forced_internals_nmse", ld.nmse,
           judge::make_tolerance(kAgreeDraftLogitsMaxNmse, false, "measured",
                                 "the draft rerun with every block's official mixes and attention output: the head's "
                                 "strict bound"));
  sink.add(-1, "dspark_confidence", "forced_internals_dot_bound_ratio", conf,
           judge::make_tolerance(1.0, false, "analytic", "the confidence's fp32 dot bound, on the forced rerun"));
  return ok;
}

const char* kRingNote = "the DSpark rings hold the official window_kv format's values bit for bit (docs/agreement.md)";

}  // namespace

bool run_has_dspark(const OracleRun& run) {
  if (run.config().n_mtp_layers == 0) return false;
  for (const OracleStep& st : run.steps()) {
    if (st.items->has(dspark_group(st) + "draft_ids")) return true;
  }
  return false;
}

void dspark_ring_rows(const OracleRun& run, const reference::model::Model& model, const reference::model::ModelState& state,
                      const golden::H5File& f, const std::string& group, RowSink& sink) {
  for (size_t i = 0; i < state.dspark_window_kv.size(); ++i) {
    const std::string item = group + "dspark" + std::to_string(i) + "/window_kv_cache";
    if (!f.has(item)) continue;
    const std::vector<float> got = state.dspark_window_kv[i].read_all(model.ops()).data();
    const std::vector<float> want = official_values(f, item, true);
    const StreamDiff d = got.size() == want.size() ? compare_rows(got, want, run.config().head_dim) : StreamDiff{0, 0, 0};
    sink.add(run.config().n_layers + static_cast<int>(i), "dspark_main_kv", "ring_bit_equal_frac", d.equal_frac,
             judge::make_tolerance(1.0, true, "stated", kRingNote));
  }
}

DSparkStep dspark_teacher_forced_rows(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                                      const reference::model::ModelState& state, const Tensor<float>* main_x, Defect& defect,
                                      bool o_attribute, RowSink& sink) {
  const reference::ModelConfig& c = run.config();
  const golden::H5File& f = *st.items;
  const std::string g = dspark_group(st);
  if (main_x != nullptr && f.has(g + "dspark_main_x")) {
    const StreamDiff d = compare_rows(main_x->data(), official_values(f, g + "dspark_main_x", true), c.dim);
    const char* note = "main_norm(main_proj(the official main_hidden)): the fp8 linear is exact per 32-block, "
                       "<= 1 bf16 ulp where torch's block product was inexact (reference/ops/linear.h); measured bit-exact";
    sink.add(-1, "dspark_main_x", "nmse", d.nmse, judge::make_tolerance(kAgreeStreamMaxNmse, false, "measured", note));
    sink.add(-1, "dspark_main_x", "bit_equal_frac", d.equal_frac, judge::make_tolerance(kAgreeStreamMinEqual, true, "measured", note));
  }
  // The rings after the prefill, and after each decode step where the run keeps them.
  dspark_ring_rows(run, model, state, f, st.index == 0 ? st.prefix + "state/" : g, sink);
  if (st.index == 0 || !f.has(g + "draft_ids")) return {};

  const std::vector<int64_t> ids = official_ids(f, g + "draft_ids");  // [block + 1]
  DSV41_CHECK(static_cast<int64_t>(ids.size()) == c.dspark_block_size + 1, "agree: ", g, "draft_ids holds ", ids.size(),
              " ids, block ", c.dspark_block_size, " + 1");
  const std::vector<int64_t> forced(ids.begin() + 1, ids.end());
  DraftCapture cap;
  const reference::model::DraftResult r = run_draft(run, st, model, state, ids[0], forced, defect, cap);
  std::vector<int64_t> own;
  for (int64_t i = 0; i < c.dspark_block_size; ++i) {
    own.push_back(cap.i.at({reference::model::Component::kDSparkToken, static_cast<int>(i)}).at(0, 0));
  }
  const std::vector<float> official_logits = official_values(f, g + "draft_logits", false);
  const std::vector<float> official_conf = official_values(f, g + "confidence", false);
  const StreamDiff ld = compare_rows(r.logits.data(), official_logits, c.vocab_size);
  const double conf_nmse = compare_rows(r.confidence, official_conf, static_cast<int64_t>(official_conf.size())).nmse;
  const double conf_ratio = confidence_ratio(r, official_conf, cap, model);
  sink.detail = "step " + std::to_string(st.index) + " DSpark draft";
  // Beyond the head's own bounds: the block's output differs. Attributed when the draft at this
  // step moves by as much under a one-ulp nudge of its mixes (a rounding boundary inside the
  // block that the official mixes' fp32 GEMM order crossed) and stays at the stream scale.
  bool attributed = false, mixes_only = false;
  const bool internals = has_block_internals(st, c);
  if (o_attribute && internals && (ld.nmse > kAgreeDraftLogitsMaxNmse || conf_ratio > 1.0)) {
    attributed = forced_attribution(run, st, model, state, ids[0], forced, defect, cap, sink, mixes_only);
    mixes_only = attributed && mixes_only;
    if (attributed) {
      sink.cmp->notes.push_back("step " + std::to_string(st.index) + " DSpark draft: beyond the head's bounds and "
                                "attributed with the block internals (own mixes within their budget, own attention "
                                "output within its bound, the draft within the strict bounds with both official); its "
                                "strict rows are measured");
    }
  } else if (o_attribute && (ld.nmse > kAgreeDraftLogitsMaxNmse || conf_ratio > 1.0)) {
    const Sensitivity sens = mixes_sensitivity(run, st, model, state, ids[0], forced, defect, r);
    // The nudges must reach every quantity that is beyond its bound.
    double ratio = std::numeric_limits<double>::infinity();
    if (ld.nmse > kAgreeDraftLogitsMaxNmse) ratio = std::min(ratio, sens.logits / ld.nmse);
    if (conf_ratio > 1.0) ratio = std::min(ratio, conf_nmse > 0 ? sens.confidence / conf_nmse : 0.0);
    const char* note = "docs/agreement.md (DSpark): the draft rerun with its mixes nudged by one fp32 ulp (20 seeds) "
                       "moves by at least half the observed difference: a rounding boundary inside the block";
    sink.add(-1, "dspark_draft", "mixes_ulp_sensitivity", ratio, judge::make_tolerance(kAgreeDraftMinSensitivity, true, "measured", note));
    const char* scale = "a rounding flip inside the block moves its output like a backbone layer-step's (the stream "
                        "bounds, agree.h), which the head carries; measured <= 1.3e-7";
    sink.add(-1, "dspark_logits", "attributed_nmse", ld.nmse, judge::make_tolerance(kAgreeStreamMaxNmse, false, "measured", scale));
    sink.add(-1, "dspark_confidence", "attributed_nmse", conf_nmse, judge::make_tolerance(kAgreeStreamMaxNmse, false, "measured", scale));
    attributed = ratio >= kAgreeDraftMinSensitivity && ld.nmse <= kAgreeStreamMaxNmse && conf_nmse <= kAgreeStreamMaxNmse;
    if (attributed) {
      sink.cmp->notes.push_back("step " + std::to_string(st.index) + " DSpark draft: beyond the head's bounds and "
                                "attributed (a one-ulp nudge of the mixes moves the draft as much); its strict rows are "
                                "measured");
    }
  }
  const auto strict = [attributed](double bound, bool hib, const char* origin,
                                    const char* note) -> std::optional<dsv41::reports::Tolerance> {
    if (attributed) return std::nullopt;
    return judge::make_tolerance(bound, hib, origin, note);
  };
  sink.add(-1, "dspark_logits", "nmse", ld.nmse,
           strict(kAgreeDraftLogitsMaxNmse, false, "measured",
                  "docs/agreement.md (DSpark): fp32 head and Markov head GEMMs (MKL's order there, an FMA chain here) "
                  "on the block's output; measured <= 1.0e-13 where that output is bit-exact"));
  sink.add(-1, "dspark_confidence", "dot_bound_ratio", conf_ratio,
           strict(1.0, false, "analytic",
                  "|ours - official| <= 2 gamma_K sum|x w| (K = dim + rank, fp32 dot, any order, same inputs)"));
  sink.add(-1, "dspark_confidence", "nmse", conf_nmse, std::nullopt);
  sink.add(-1, "dspark_token", "tie_equivalent_frac",
           tie_equivalent_frac(own, forced, r.logits.data(), official_logits, c.vocab_size),
           judge::make_tolerance(1.0, true, "stated",
                     "an own draft token may differ from the official one only at a near-tie of the official logits "
                     "within twice the row's logits difference"));
  int64_t equal = 0;
  for (size_t i = 0; i < own.size(); ++i) equal += own[i] == forced[i];
  sink.add(-1, "dspark_token", "equal_frac", static_cast<double>(equal) / static_cast<double>(own.size()), std::nullopt);
  // What only some runs keep (the oracle): the block's output and experts, the Markov bias.
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    const int layer = c.n_layers + i;
    const std::string b = block_group(st, i);
    if (f.has(b + "out_stream")) {
      const StreamDiff d = compare_rows(cap.f.at({reference::model::Component::kDSparkOutStream, layer}).data(),
                                        official_values(f, b + "out_stream", true), c.dim);
      const char* note = "docs/agreement.md (DSpark): a block's output; the backbone's stream bounds (agree.h)";
      sink.add(layer, "dspark_out_stream", "nmse", d.nmse, judge::make_tolerance(kAgreeStreamMaxNmse, false, "measured", note));
      sink.add(layer, "dspark_out_stream", "bit_equal_frac", d.equal_frac,
               judge::make_tolerance(kAgreeStreamMinEqual, true, "measured", note));
    }
    for (const Component what : {Component::kDSparkAttnOut, Component::kDSparkFfnOut}) {
      const std::string item = block_item(st, c, what, layer);
      if (!f.has(item) || !cap.f.count({what, layer})) continue;
      const StreamDiff d = compare_rows(cap.f.at({what, layer}).data(), official_values(f, item, true), c.dim);
      sink.add(layer, reference::model::name(what), "nmse", d.nmse, std::nullopt);
      sink.add(layer, reference::model::name(what), "bit_equal_frac", d.equal_frac, std::nullopt);
    }
    if (f.has(b + "gate_indices") && cap.i.count({reference::model::Component::kDSparkExperts, layer})) {
      const std::vector<int32_t> want = OracleRun::i32(f, b + "gate_indices").data();
      sink.add(layer, "dspark_experts", "equal_frac",
               cap.i.at({reference::model::Component::kDSparkExperts, layer}).data() == want ? 1.0 : 0.0, std::nullopt);
    }
  }
  for (int64_t i = 0; i < c.dspark_block_size; ++i) {
    const std::string item = g + "markov_" + std::to_string(i) + "/logits_bias";
    if (!f.has(item)) continue;
    const StreamDiff d = compare_rows(cap.f.at({reference::model::Component::kDSparkMarkovBias, static_cast<int>(i)}).data(),
                                      official_values(f, item, false), c.vocab_size);
    sink.add(static_cast<int>(i), "dspark_markov_bias", "nmse", d.nmse,
             judge::make_tolerance(kAgreeLogitsMaxNmse, false, "measured",
                       "fp32 Markov head (K = rank): the logits' GEMM bound; measured <= 1.7e-14"));
  }
  return {true, attributed, mixes_only};
}

void dspark_free_rows(const OracleRun& run, const OracleStep& st, reference::model::Model& model,
                      const reference::model::ModelState& state, int64_t last_token, Defect& defect, RowSink& sink) {
  const reference::ModelConfig& c = run.config();
  const golden::H5File& f = *st.tie_items;
  const std::string g = dspark_group(st);
  if (st.index == 0 || c.n_mtp_layers == 0 || !f.has(g + "draft_ids")) return;
  DraftCapture cap;
  const reference::model::DraftResult r = run_draft(run, st, model, state, last_token, {}, defect, cap);
  std::vector<int64_t> own = {last_token};
  own.insert(own.end(), r.tokens.begin(), r.tokens.end());
  sink.add(-1, "dspark_token", "ids_equal", own == official_ids(f, g + "draft_ids") ? 1.0 : 0.0, std::nullopt);
  sink.add(-1, "dspark_logits", "nmse",
           compare_rows(r.logits.data(), official_values(f, g + "draft_logits", false), c.vocab_size).nmse, std::nullopt);
  const std::vector<float> conf = official_values(f, g + "confidence", false);
  double worst = conf.size() == r.confidence.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < conf.size() && i < r.confidence.size(); ++i) {
    worst = std::max(worst, std::fabs(double{r.confidence[i]} - conf[i]));
  }
  sink.add(-1, "dspark_confidence", "max_abs_diff", worst, std::nullopt);
}

}  // namespace dsv41::scenarios::agree::agree_detail
