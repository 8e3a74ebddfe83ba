// scenarios/conform/conform_forcing.h
//
// Which of a dump's components the teacher-forced comparison really forces (docs/conform.md
// "Thin dumps"). A component is TEACHER-FORCED when each of its direct inputs (the dataflow of
// reference/model/block.cc, model.cc, forward_attention.cc) reaches the reference as the port's
// own value: the dump holds that input (its value replaces the reference's), or the input is an
// identity of one it holds (in_stream(l) is out_stream(l - 1), in_pre(l) is hc_ffn_pre(l - 1)).
// Otherwise the reference computes that input itself, from the port's values further upstream,
// and the component's difference holds the missing input's own order noise (and any defect in
// it): under the order-variant claim it is then judged with a FREE-RUNNING bound, its own derived
// bound plus those of every computation the reference runs in place of the port's (the chain,
// additive under the derived bounds' assumption A1; judge::free_running_bound,
// scenarios/judge/order_variant.h), or measured when the chain holds a selection
// (a near tie may choose otherwise); a failure of it names the missing inputs, since the defect
// may be in them (a dump without attn_stream locates a wrong attn_out's effect at hc_ffn_pre).
//
// What counts as an input here: float and selection components (a top-k or an expert choice the
// dump lacks is the reference's own, and a near tie may choose otherwise). index_scores is never
// forced (the tie band of topk covers its noise), so a selection's inputs are those of its
// scores. The caches are written from attn_in and never forced (their quantizer flips are in the
// derived bounds of their readers).
//
// Example:
//   const ForcingMap f = teacher_forcing(dump);
//   const Forcing& x = f.at({"hc_ffn_pre", 3});
//   if (!x.forced) std::cout << "inputs not in the dump: " << join(x.missing);   // "attn_stream@3"
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reference/ops/config.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/order_variant.h"

namespace dsv41::scenarios::conform {

// The forcing of a component and the dataflow are the judge's (shared with `dsv41 run`).
using judge::Forcing;
using judge::direct_inputs;
using judge::free_running_bound;
using ForcingMap = std::map<std::pair<std::string, int>, Forcing>;

// Every (component, layer) the dump holds, with whether it is teacher-forced.
ForcingMap teacher_forcing(const PortDump& d);

// "attn_out layers 1-3 (attn_in not in the dump)"-style lines of the components not forced, for
// the report's notes and the summary; empty when every held component is forced.
std::vector<std::string> forcing_lines(const ForcingMap& f);

}  // namespace dsv41::scenarios::conform
