// scenarios/runner/runner_rows.cc: the probe and global-bytes rows of the runner (scenarios/runner/runner_internal.h).
#include <algorithm>
#include <cstdlib>

#include "reference/session/byte_accounting.h"
#include "scenarios/runner/runner_internal.h"

namespace dsv41::scenarios::runner {

using reports::MetricRow;

// Recall of A's selected positions by B at a probe step, split by the distance of each position
// (its group's first token) to the session's last resume boundary.
void probe_rows(const StepCapture& a, const StepCapture& b, int64_t step, int session, int64_t boundary,
                const reference::ModelConfig& c, std::vector<MetricRow>& rows) {
  const int64_t W = c.window_size;
  const char* names[4] = {"probe_recall[d<-W]", "probe_recall[-W<=d<0]", "probe_recall[0<=d<W]", "probe_recall[d>=W]"};
  const char* counts[4] = {"probe_count[d<-W]", "probe_count[-W<=d<0]", "probe_count[0<=d<W]", "probe_count[d>=W]"};
  for (const CapturedItem& ia : a.items) {
    if (ia.component != "topk") continue;
    const CapturedItem* ib = b.find(ia.layer, "topk");
    if (ib == nullptr) continue;
    const int ratio = c.compress_ratios[static_cast<size_t>(ia.layer)];
    int64_t total[4] = {0, 0, 0, 0}, kept[4] = {0, 0, 0, 0};
    const int64_t rows_a = ia.i.dim(0), rows_b = ib->i.dim(0), k = ia.i.dim(1);
    for (int64_t t = 0; t < std::min(rows_a, rows_b); ++t) {
      const int32_t* ra = ia.i.row(rows_a - 1 - t);
      const int32_t* rb = ib->i.row(rows_b - 1 - t);
      for (int64_t j = 0; j < k; ++j) {
        if (ra[j] < 0) continue;
        const int64_t d = static_cast<int64_t>(ra[j]) * ratio - boundary;
        const int bucket = d < -W ? 0 : d < 0 ? 1 : d < W ? 2 : 3;
        ++total[bucket];
        for (int64_t q = 0; q < ib->i.dim(1); ++q) {
          if (rb[q] == ra[j]) {
            ++kept[bucket];
            break;
          }
        }
      }
    }
    for (int bkt = 0; bkt < 4; ++bkt) {
      MetricRow r;
      r.step = step;
      r.session = session;
      r.position = a.start_pos;
      r.layer = ia.layer;
      r.component = "topk";
      r.metric = counts[bkt];
      r.value = static_cast<double>(total[bkt]);
      rows.push_back(r);
      if (total[bkt] == 0) continue;
      r.metric = names[bkt];
      r.value = static_cast<double>(kept[bkt]) / static_cast<double>(total[bkt]);
      rows.push_back(r);
    }
  }
}

std::vector<MetricRow> global_bytes_rows(const std::vector<reference::model::CacheView>& views, int64_t tokens,
                                         const reference::ModelConfig& c, const std::string& which, int64_t step,
                                         int session, std::string* detail) {
  int64_t held = 0;
  for (const reference::model::CacheView& v : views) {
    if (v.kind == "compressed_kv" || v.kind == "index_keys") held += static_cast<int64_t>(v.bytes.size());
  }
  const int64_t expected = reference::session::global_bytes_for_tokens(reference::session::byte_accounting(c), tokens);
  std::vector<MetricRow> rows;
  MetricRow r;
  r.step = step;
  r.session = session;
  r.position = tokens;
  r.component = "global_bytes." + which;
  const double t = static_cast<double>(std::max<int64_t>(1, tokens));
  r.metric = "bytes_per_token";
  r.value = static_cast<double>(held) / t;
  rows.push_back(r);
  r.metric = "bytes_per_token_expected";
  r.value = static_cast<double>(expected) / t;
  rows.push_back(r);
  r.metric = "held_minus_expected";
  r.value = static_cast<double>(std::llabs(held - expected));
  r.tolerance = reports::Tolerance{0, false, "analytic",
                                   "dsv41 bytes: reference::session::global_bytes_for_tokens(byte_accounting(config), tokens)"};
  r.verdict = held == expected ? reports::Verdict::kPass : reports::Verdict::kFail;
  rows.push_back(r);
  detail->clear();
  if (held != expected) {
    *detail = "side " + which + " holds " + std::to_string(held) + " global bytes for " + std::to_string(tokens) +
              " tokens, dsv41 bytes says " + std::to_string(expected);
  }
  return rows;
}

}  // namespace dsv41::scenarios::runner
