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
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_cache_codes.h"
#include "scenarios/conform/conform_forcing.h"
#include "scenarios/conform/conform_hypotheses.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/invariants.h"
#include "scenarios/judge/metrics.h"
#include "scenarios/judge/order_variant.h"

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

bool is_cache_or_reader(const std::string& component) {
  static const std::set<std::string> readers = {"attn_out", "index_scores", "topk", "candidates", "dspark_attn_out"};
  return component.rfind("cache.", 0) == 0 || readers.count(component) > 0;
}

bool always_exact(const std::string& metric) { return kAlwaysExact.count(metric) > 0; }

std::optional<Tolerance> bound_of(const ConformTolerances& tol, const std::string& component, const std::string& metric,
                                  const Claim& claim, bool forced, const Forcing* fr) {
  if (kAlwaysExact.count(metric)) return exact_tol(metric);
  // A cache of another entry format judged by value: its bound comes from the two formats (and,
  // order-variant, the chain), folded into the row (cache_layouts.h), under every claim.
  if (metric == kDecodedRoundingRatioMetric) return decoded_rounding_ratio_tolerance();
  if (metric == judge::kCombColsumMetric) {  // an invariant of any order (judge/invariants.h), forced or not
    if (!claim.order_variant) return std::nullopt;
    return judge::comb_colsum_tolerance(claim.config->hc_mult, claim.config->hc_eps);
  }
  const std::map<std::string, Tolerance>* f = file_bounds(tol, component);
  if (f == nullptr && claim.order_variant) {  // the derived defaults (scenarios/judge/order_variant.h)
    if (component == reference::model::name(reference::model::Component::kEngramIds)) {
      return metric == "equal_frac" ? std::optional<Tolerance>(exact_tol(metric)) : std::nullopt;
    }
    if (!forced) return std::nullopt;
    if (metric == kCodeExcessMetric) {  // the quantizer-boundary check: teacher-forced caches only
      return fr != nullptr && !fr->forced ? std::nullopt
                                          : std::optional<Tolerance>(code_excess_tolerance(*claim.config, component));
    }
    if (is_hypothesis_metric(metric)) {  // directional tests: teacher-forced components only
      return fr != nullptr && !fr->forced ? std::nullopt : std::optional<Tolerance>(hypothesis_tolerance(metric));
    }
    const judge::OrderVariantTolerance t = judge::order_variant_tolerance(*claim.config, component, metric, fr, claim.accumulation);
    if (t.kind != judge::OrderVariantTolerance::kExact) return t.tolerance;
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
