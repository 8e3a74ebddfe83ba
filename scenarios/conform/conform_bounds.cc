// scenarios/conform/conform_bounds.cc
//
// `dsv41 conform`'s bounds: which tolerance each row of the replay gets under the claim in effect
// (bit-exact, a tolerance file, or the order-variant claim's derived bounds and invariants), with
// its origin (docs/conform.md "Claims").
#include <map>
#include <optional>
#include <set>
#include <string>

#include "reference/model/hooks.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_forcing.h"
#include "scenarios/conform/conform_hypotheses.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/invariants.h"
#include "scenarios/judge/metrics.h"

namespace dsv41::scenarios::conform {

using reports::Tolerance;

namespace conform_detail {

const char* kExactNote =
    "docs/conform.md: bit-exact by default: the reference is deterministic and the component's semantics are exact "
    "given equal inputs; a tolerance file may replace this with a bound and its origin";

// Rows that are exact whatever the tolerance file says (structure, NaN/Inf masks), and the
// exactness rows of the bit-exact default.
const std::set<std::string> kAlwaysExact = {"present", "nonfinite_mismatch", "nan_mismatch", "format_equal",
                                            "entries_equal_frac", "valid_entries_frac"};
const std::set<std::string> kExactRows = {"bit_equal_frac", "rows_equal_frac", "equal_frac", "bytes_equal_frac"};

Tolerance exact_tol(const std::string& metric) {
  Tolerance t;
  t.higher_is_better = metric != "nonfinite_mismatch" && metric != "nan_mismatch";
  t.bound = t.higher_is_better ? 1.0 : 0.0;
  t.origin = "stated";
  t.note = kExactNote;
  if (metric == "valid_entries_frac") {
    t.origin = "analytic";
    t.note = "docs/conform.md: a stored cache entry decodes (positive finite scales, no NaN or Inf codes) whatever "
             "order the port sums in: exact under any claim";
  }
  return t;
}

const std::map<std::string, Tolerance>* file_bounds(const ConformTolerances& tol, const std::string& component) {
  auto it = tol.find(component);
  if (it == tol.end()) it = tol.find("*");
  return it == tol.end() ? nullptr : &it->second;
}


const char* kOrderVariantE2eNote =
    "docs/conform.md: order-variant claim: end to end, errors compound through the forward (no derived bound): "
    "measured only, except the rows exact on every pair";

std::optional<Tolerance> bound_of(const ConformTolerances& tol, const std::string& component, const std::string& metric,
                                  const Claim& claim, bool forced, const Forcing* fr) {
  if (kAlwaysExact.count(metric)) return exact_tol(metric);
  if (metric == judge::kCombColsumMetric) {  // an invariant of any order (judge/invariants.h), forced or not
    if (!claim.order_variant) return std::nullopt;
    return judge::comb_colsum_tolerance(claim.config->hc_mult, claim.config->hc_eps);
  }
  const std::map<std::string, Tolerance>* f = file_bounds(tol, component);
  if (f == nullptr && claim.order_variant) {  // the derived defaults (scenarios/judge/derived_bounds.h)
    if (component == reference::model::name(reference::model::Component::kEngramIds)) {
      return metric == "equal_frac" ? std::optional<Tolerance>(exact_tol(metric)) : std::nullopt;
    }
    if (!forced) return std::nullopt;
    const bool free_running = fr != nullptr && !fr->forced;
    const auto widened = [&](std::optional<judge::DerivedBound> own) {
      return free_running ? free_running_bound(*claim.config, component, std::move(own), *fr) : own;
    };
    const bool cache = conform_detail::is_cache(component);
    if (cache) {  // bytes measured (a quantizer flip is legitimate); what they decode to is bounded
      const std::optional<judge::DerivedBound> b = widened(judge::derived_cache_bound(*claim.config, component));
      if (!b) return std::nullopt;
      if (metric == judge::kDecodedBlockGainMetric) {
        Tolerance t = judge::decoded_block_gain_tolerance();
        if (free_running) {
          t.bound += b->gain;
          t.note += "; free-running: plus the chain's systematic gain (" + b->origin + ")";
        }
        return t;
      }
      if (metric == judge::kRowGainMetric && component == "cache.compressor") return judge::row_gain_tolerance(*b);
      return metric == judge::kDecodedRowRelMetric ? std::optional<Tolerance>(judge::derived_tolerance(*b)) : std::nullopt;
    }
    // Selections (topk, the candidate pool: a top-k of block scores, the routed experts) follow one
    // tie rule (runner/compare.h); with inputs the dump lacks, their scores move beyond the band: measured.
    const bool selection = component == reference::model::name(reference::model::Component::kExperts) ||
                           component == reference::model::name(reference::model::Component::kTopk) ||
                           component == reference::model::name(reference::model::Component::kCandidates);
    if (selection) {
      if (metric != "tie_equivalent" || free_running) return std::nullopt;
      Tolerance t = exact_tol("rows_equal_frac");
      t.origin = "analytic";
      t.note = component == "experts" ? std::string(judge::kExpertTieNote)
                                      : "order-variant: identical outside the tie band of index_scores' derived bound (" +
                                            std::to_string(judge::topk_tie_band(*claim.config)) + " x the row's max |score|" +
                                            (component == "candidates" ? ", on the block scores" : "") +
                                            "); a difference inside it is a tie";
      return t;
    }
    if (is_hypothesis_metric(metric)) {  // directional tests: teacher-forced components only
      return free_running ? std::nullopt : std::optional<Tolerance>(hypothesis_tolerance(metric));
    }
    std::optional<judge::DerivedBound> own = judge::derived_bound(*claim.config, component);
    const bool float_tensor = reference::model::component_info(*reference::model::component_from_name(component)).kind ==
                              reference::model::ComponentKind::kTensor;
    if (own || (free_running && float_tensor)) {
      const std::optional<judge::DerivedBound> b = widened(std::move(own));
      if (!b) return std::nullopt;
      if (metric == judge::kRowRelMetric) return judge::derived_tolerance(*b);
      if (metric == judge::kRowGainMetric) return judge::row_gain_tolerance(*b);
      if (metric == judge::kTensorGainMetric || metric == judge::kTensorBiasMetric) return judge::tensor_stat_tolerance(*b, metric);
      return std::nullopt;
    }
    // Components exact given equal inputs (embed, in_stream, in_pre): as bit-exact.
  }
  return bit_exact_bound(f, metric);
}

}  // namespace conform_detail

std::optional<Tolerance> bit_exact_bound(const std::map<std::string, Tolerance>* f, const std::string& metric) {
  if (conform_detail::kAlwaysExact.count(metric)) return conform_detail::exact_tol(metric);
  if (f == nullptr) return conform_detail::kExactRows.count(metric) ? std::optional<Tolerance>(conform_detail::exact_tol(metric)) : std::nullopt;
  if (metric == "allclose" && f->count("atol")) {
    Tolerance t = f->at("atol");
    t.bound = 1.0;
    t.higher_is_better = true;
    return t;
  }
  const auto it = f->find(metric);
  return it == f->end() || metric == "atol" || metric == "rtol" ? std::nullopt : std::optional<Tolerance>(it->second);
}

}  // namespace dsv41::scenarios::conform
