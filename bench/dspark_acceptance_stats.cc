// bench/dspark_acceptance_stats.cc: AcceptanceStats::summarize, the numbers of one run or a pool
// of runs (bench/dspark_acceptance.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "bench/dspark_acceptance.h"
#include "base/error.h"

namespace dsv41::bench {

using nlohmann::json;

namespace {

constexpr int kCalibrationBins = 10;  // equal-width bins of the predicted c_i over [0, 1]

// a / b, or null when b == 0 (an undefined rate is not a number in the JSON).
json ratio(double a, double b) { return b == 0 ? json(nullptr) : json(a / b); }

double max_of(const std::vector<float>& p) { return p.empty() ? 0.0 : *std::max_element(p.begin(), p.end()); }

// For each decided draft, another decided draft at the same draft position, far from it in the
// list and from another prompt where there is one: its draft distribution is unrelated to this
// draft's context. [decided] partner index, -1 when the position has a single decided draft.
std::vector<int64_t> unrelated_partners(const std::vector<DecidedDraft>& decided) {
  std::map<int, std::vector<int64_t>> by_position;
  for (int64_t j = 0; j < static_cast<int64_t>(decided.size()); ++j) {
    by_position[decided[static_cast<size_t>(j)].position].push_back(j);
  }
  std::vector<int64_t> partner(decided.size(), -1);
  for (const auto& [position, list] : by_position) {
    const int64_t n = static_cast<int64_t>(list.size());
    if (n < 2) continue;
    for (int64_t a = 0; a < n; ++a) {
      const int64_t j = list[static_cast<size_t>(a)];
      int64_t b = (a + n / 2) % n;  // half the list away; then the next one of another prompt, if any
      for (int64_t step = 0; step < n; ++step) {
        const int64_t cand = (a + n / 2 + step) % n;
        if (cand != a && decided[static_cast<size_t>(list[static_cast<size_t>(cand)])].prompt !=
                             decided[static_cast<size_t>(j)].prompt) {
          b = cand;
          break;
        }
      }
      if (b == a) b = (a + 1) % n;
      partner[static_cast<size_t>(j)] = list[static_cast<size_t>(b)];
    }
  }
  return partner;
}

}  // namespace

double overlap(const std::vector<float>& p, const std::vector<float>& q) {
  DSV41_CHECK(p.size() == q.size(), "overlap: distributions of ", p.size(), " and ", q.size(), " entries");
  double s = 0;
  for (size_t v = 0; v < p.size(); ++v) s += std::min(double{p[v]}, double{q[v]});
  return s;
}

void AcceptanceStats::merge(const AcceptanceStats& other) {
  if (block_ == 0) block_ = other.block_;
  DSV41_CHECK(other.block_ == 0 || other.block_ == block_, "acceptance stats: pooling block sizes ", block_, " and ",
              other.block_);
  rounds_.insert(rounds_.end(), other.rounds_.begin(), other.rounds_.end());
  decided_.insert(decided_.end(), other.decided_.begin(), other.decided_.end());
  seconds_ += other.seconds_;
  emitted_ += other.emitted_;
}

json AcceptanceStats::summarize() const {
  const size_t B = static_cast<size_t>(block_);
  json out;
  const double n_rounds = static_cast<double>(rounds_.size());
  out["rounds"] = rounds_.size();
  out["emitted_tokens"] = emitted_;
  out["seconds"] = seconds_;
  out["seconds_per_round"] = ratio(seconds_, n_rounds);

  // Per round: k, m, tokens per target step, wasted rows; histograms of k and m; survival.
  double sum_k = 0, sum_m = 0, sum_wasted = 0, sum_sk = 0, all_kept = 0;
  std::vector<int64_t> k_hist(B + 1, 0), m_hist(B + 1, 0);
  std::vector<double> depth_rounds(B, 0), depth_pred(B, 0), depth_real(B, 0);  // [B] by depth j - 1
  for (const RoundObservation& r : rounds_) {
    DSV41_CHECK(r.verified >= 1 && static_cast<size_t>(r.verified) <= B && r.accepted >= 0 &&
                    r.accepted <= r.verified,
                "acceptance stats: a round with k = ", r.verified, ", m = ", r.accepted, " (block ", B, ")");
    sum_k += static_cast<double>(r.verified);
    sum_m += static_cast<double>(r.accepted);
    sum_wasted += static_cast<double>(r.verified - r.accepted);
    ++k_hist[static_cast<size_t>(r.verified)];
    ++m_hist[static_cast<size_t>(r.accepted)];
    sum_sk += r.survival.back();
    all_kept += r.accepted == r.verified ? 1 : 0;
    for (size_t j = 0; j < static_cast<size_t>(r.verified); ++j) {
      depth_rounds[j] += 1;
      depth_pred[j] += r.survival[j];
      depth_real[j] += static_cast<int64_t>(j) < r.accepted ? 1 : 0;
    }
  }
  out["mean_k"] = ratio(sum_k, n_rounds);
  out["mean_m"] = ratio(sum_m, n_rounds);
  out["tokens_per_target_step"] = ratio(sum_m + n_rounds, n_rounds);  // (m + 1) per verify step
  out["wasted_rows_per_round"] = ratio(sum_wasted, n_rounds);          // k - m
  out["accepted_fraction_of_verified"] = ratio(sum_m, sum_k);
  out["k_histogram"] = k_hist;  // [B + 1] rounds verifying k = 0..B drafts
  out["m_histogram"] = m_hist;  // [B + 1] rounds accepting m = 0..B drafts

  json depths = json::array();
  for (size_t j = 0; j < B; ++j) {
    depths.push_back({{"depth", j + 1},
                      {"rounds", depth_rounds[j]},
                      {"mean_predicted", ratio(depth_pred[j], depth_rounds[j])},
                      {"realised", ratio(depth_real[j], depth_rounds[j])}});
  }
  out["survival"] = {{"at_k", {{"mean_predicted", ratio(sum_sk, n_rounds)}, {"realised", ratio(all_kept, n_rounds)}}},
                     {"depths", depths}};

  // Per draft position, and the calibration of c_i over every decided draft.
  const std::vector<int64_t> partner = unrelated_partners(decided_);
  std::vector<double> decided(B, 0), accepted(B, 0), conf(B, 0), expected(B, 0), unrelated(B, 0), unrelated_n(B, 0),
      max_t(B, 0), max_d(B, 0);
  struct Bin {
    double count = 0, predicted = 0, realised = 0, accept_prob = 0;
  };
  std::vector<Bin> bins(kCalibrationBins);
  double brier = 0, all_expected = 0, all_accepted = 0, all_accept_prob = 0, all_unrelated = 0, all_unrelated_n = 0;
  for (size_t j = 0; j < decided_.size(); ++j) {
    const DecidedDraft& d = decided_[j];
    DSV41_CHECK(d.position >= 0 && static_cast<size_t>(d.position) < B, "acceptance stats: draft position ",
                d.position, " outside the block ", B);
    const size_t i = static_cast<size_t>(d.position);
    const double y = d.accepted ? 1.0 : 0.0, ov = overlap(d.p_target, d.p_draft);
    decided[i] += 1;
    accepted[i] += y;
    conf[i] += d.confidence;
    expected[i] += ov;
    max_t[i] += max_of(d.p_target);
    max_d[i] += max_of(d.p_draft);
    all_expected += ov;
    all_accepted += y;
    all_accept_prob += d.accept_prob;
    if (partner[j] >= 0) {
      const double u = overlap(d.p_target, decided_[static_cast<size_t>(partner[j])].p_draft);
      unrelated[i] += u;
      unrelated_n[i] += 1;
      all_unrelated += u;
      all_unrelated_n += 1;
    }
    const int b = std::clamp(static_cast<int>(d.confidence * kCalibrationBins), 0, kCalibrationBins - 1);
    bins[static_cast<size_t>(b)].count += 1;
    bins[static_cast<size_t>(b)].predicted += d.confidence;
    bins[static_cast<size_t>(b)].realised += y;
    bins[static_cast<size_t>(b)].accept_prob += d.accept_prob;
    brier += (d.confidence - y) * (d.confidence - y);
  }
  json positions = json::array();
  for (size_t i = 0; i < B; ++i) {
    positions.push_back({{"draft", i + 1},
                         {"decided", decided[i]},
                         {"accepted", accepted[i]},
                         {"acceptance_rate", ratio(accepted[i], decided[i])},
                         {"mean_confidence", ratio(conf[i], decided[i])},
                         {"expected_acceptance", ratio(expected[i], decided[i])},
                         {"unrelated_overlap", ratio(unrelated[i], unrelated_n[i])},
                         {"mean_max_p_target", ratio(max_t[i], decided[i])},
                         {"mean_max_p_draft", ratio(max_d[i], decided[i])}});
  }
  out["positions"] = positions;
  const double n_dec = static_cast<double>(decided_.size());
  // The argmax marginals over the decided drafts: f_t(v) of the target rows, f_d(v) of the drafts.
  // sum_v f_t f_d is the chance a draft argmax drawn from its marginal matches a target argmax
  // drawn from its own, independently: what context-free guessing of frequent tokens achieves.
  std::map<int64_t, double> f_t, f_d;
  for (const DecidedDraft& d : decided_) {
    f_t[std::max_element(d.p_target.begin(), d.p_target.end()) - d.p_target.begin()] += 1;
    f_d[std::max_element(d.p_draft.begin(), d.p_draft.end()) - d.p_draft.begin()] += 1;
  }
  double marginal_match = 0, collision_t = 0;
  for (const auto& [v, n] : f_t) {
    collision_t += (n / n_dec) * (n / n_dec);
    if (f_d.count(v) != 0) marginal_match += (n / n_dec) * (f_d.at(v) / n_dec);
  }
  out["acceptance"] = {{"decided", n_dec},
                       {"rate", ratio(all_accepted, n_dec)},
                       {"expected", ratio(all_expected, n_dec)},
                       {"mean_accept_prob", ratio(all_accept_prob, n_dec)},
                       {"unrelated_overlap", ratio(all_unrelated, all_unrelated_n)},
                       {"argmax_marginal_match", n_dec > 0 ? json(marginal_match) : json(nullptr)},
                       {"distinct_target_argmax", f_t.size()},
                       {"distinct_draft_argmax", f_d.size()},
                       {"target_argmax_effective_count", collision_t > 0 ? json(1 / collision_t) : json(nullptr)}};

  json jbins = json::array();
  double ece = 0;
  for (int b = 0; b < kCalibrationBins; ++b) {
    const Bin& x = bins[static_cast<size_t>(b)];
    if (x.count > 0) ece += x.count / n_dec * std::abs(x.predicted / x.count - x.realised / x.count);
    jbins.push_back({{"lo", static_cast<double>(b) / kCalibrationBins},
                     {"hi", static_cast<double>(b + 1) / kCalibrationBins},
                     {"count", x.count},
                     {"mean_predicted", ratio(x.predicted, x.count)},
                     {"realised_rate", ratio(x.realised, x.count)},
                     {"mean_accept_prob", ratio(x.accept_prob, x.count)}});
  }
  out["calibration"] = {{"pairs", n_dec},
                        {"brier", ratio(brier, n_dec)},
                        {"ece", n_dec > 0 ? json(ece) : json(nullptr)},
                        {"bins", jbins}};
  return out;
}

}  // namespace dsv41::bench
