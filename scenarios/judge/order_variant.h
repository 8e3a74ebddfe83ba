// scenarios/judge/order_variant.h
//
// The ORDER-VARIANT judgment, one place for `dsv41 conform` (a port's dump, docs/conform.md) and
// `dsv41 run` (a pair with an order-variant side, docs/scenarios.md "Order-variant pairs"): which
// bound each (component, metric) row gets under the order-variant claim, from the derived bounds
// (scenarios/judge/derived_bounds.h), and which components a comparison really teacher-forces.
//
// FORCING. A component is TEACHER-FORCED when each of its direct inputs (the dataflow of
// reference/model/block.cc, model.cc, forward_attention.cc) reaches the reference as the other
// side's own value. Otherwise the reference computes the missing input itself, and the
// component's difference holds that input's own order noise: its FREE-RUNNING bound is its own
// derived bound plus those of every computation of the chain (additive under the derived bounds'
// assumption A1), or none (measured) when the chain holds a selection (a near tie may choose
// otherwise). What counts as an input: float and selection components; index_scores is never
// forced (the top-k's tie band covers its noise); the caches are written from attn_in and never
// forced (their quantizer flips are in the derived bounds of their readers).
//
// THE BOUND of a row (order_variant_tolerance): float components max_rowrel (derived bound),
// row_gain, tensor_gain, tensor_bias; selections (topk, candidates, experts) tie_equivalent = 1
// (the tie rule: identical outside the tie band; the draft's own selections dspark_experts and
// dspark_token measured: no tie analysis yet); caches decoded_rowrel and decoded_block_gain
// (bytes measured: a quantizer flip is legitimate); Engram ids exact; a component exact given equal
// inputs (embed, in_stream, in_pre, ...) as bit-exact. The rows exact under every claim (NaN/Inf
// masks, present, valid cache entries) are the caller's.
//
// Example:
//   const Forcing f = chain_forcing(c, schedule, "attn_out", 0, [](const ForcingNode&) { return false; });
//   const OrderVariantTolerance t = order_variant_tolerance(c, "attn_out", "max_rowrel", &f);
//   if (t.kind == OrderVariantTolerance::kBound) std::cout << t.tolerance->bound << " " << t.tolerance->note;
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reference/ops/config.h"
#include "reports/report.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::judge {

// (component, layer); layer -1: model.*
using ForcingNode = std::pair<std::string, int>;

struct Forcing {
  bool forced = true;
  std::vector<std::string> missing;  // the direct inputs not the other side's: "attn_stream@3", "embed@model"
  // Every (component, layer) the reference computes in place of the other side's to feed this one:
  // the missing inputs and, transitively, theirs, up to values the other side gave (identities
  // resolved: a missing in_stream(l) is out_stream(l - 1)'s computation).
  std::vector<ForcingNode> chain;
  bool chain_has_selection = false;  // a top-k, candidate pool or expert choice among them
};

// The direct inputs of (component, layer) (layer -1: model.*), as (component, layer) pairs;
// empty for a component computed from the tokens alone (embed, Engram ids, layer 0's in_pre).
std::vector<ForcingNode> direct_inputs(const reference::ModelConfig& c, const std::vector<reference::LayerInfo>& schedule,
                                       const std::string& component, int layer);

// The forcing of (component, layer) when `held` says which values the other side gave (an
// identity of a held value counts: in_stream(l) is out_stream(l - 1), in_pre(l) is
// hc_ffn_pre(l - 1); layer 0's in_pre is a constant). held = nothing: the whole upstream chain.
Forcing chain_forcing(const reference::ModelConfig& c, const std::vector<reference::LayerInfo>& schedule,
                      const std::string& component, int layer, const std::function<bool(const ForcingNode&)>& held);

// The free-running bound of a component that is not teacher-forced: `own` (its derived bound, or
// nullopt for a component exact given equal inputs: then 0 of its own) plus, for every computation
// of its chain, that component's derived bound (max_rowrel) and its systematic gain (2 gamma_n(u32)
// + its chain gain), the reduction length the longest of them; the origin says so. nullopt when the
// chain holds a selection (no bound covers a near tie chosen otherwise): measured.
std::optional<DerivedBound> free_running_bound(const reference::ModelConfig& c, const std::string& component,
                                               std::optional<DerivedBound> own, const Forcing& f,
                                               Accumulation acc = Accumulation::kFp32);

// The order-variant judgment of one row: kBound (the tolerance, origin "analytic" with the
// derivation in its note), kMeasured (no bound holds: recorded, not asserted) or kExact (the
// component is exact given equal inputs: the caller's bit-exact rule for this metric).
struct OrderVariantTolerance {
  enum Kind { kBound, kMeasured, kExact } kind = kMeasured;
  std::optional<reports::Tolerance> tolerance;  // kBound only
};
// forcing: nullptr or forced = teacher-forced (the component's own derived bound); not forced:
// its free-running bound (measured when the chain holds a selection, for a selection always).
// acc: the accumulation the claim admits (derived_bounds.h); under kFp8TensorCore index_scores'
// row_gain, tensor_gain and tensor_bias are measured: the row's shared FP4 query flips elements
// often there (A5), and a flip moves the whole row coherently (an offset, a gain) where the
// statistics assume independent errors; the top-k it feeds is blind to both.
OrderVariantTolerance order_variant_tolerance(const reference::ModelConfig& c, const std::string& component,
                                              const std::string& metric, const Forcing* forcing = nullptr,
                                              Accumulation acc = Accumulation::kFp32);

// The note of a selection's tie rule ("order-variant: identical outside the tie band ... a tie").
std::string selection_tie_note(const reference::ModelConfig& c, const std::string& component,
                               Accumulation acc = Accumulation::kFp32);

}  // namespace dsv41::scenarios::judge
