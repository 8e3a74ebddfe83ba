// scenarios/runner/keep.h
//
// Which tensors a divergence report keeps, and keeping them. A Focus names (step, layer,
// component), each part optional; `dsv41 run --save-tensors` gives one, and the runner makes one
// for the first divergence of a comparison. keep_focus copies both sides' values of every
// captured output the focus names (component outputs, Engram ids, caches as raw bytes, the
// logits) into the comparison's StoredTensor list.
//
// Contract: a comparison keeps a (step, layer, component, side) once: a failure's tensors and a
// --save-tensors focus that name the same case give one copy. Values are stored exactly (double
// holds every logical dtype: bf16, fp32, int32, uint8, int64). parse_focus throws a dsv41::Error
// naming the text for an unknown key, a value that is not a number, or an empty focus.
//
// Example:
//   Focus f = parse_focus("step=3,layer=6,component=topk");
//   if (f.matches(3, 6, "topk")) ...
//   keep_focus(comparison, f, /*step=*/3, capture_a, capture_b);  // comparison.tensors grows
#pragma once

#include <cstdint>
#include <string>

#include "reports/report.h"
#include "scenarios/runner/capture.h"

namespace dsv41::scenarios::runner {

// One (step, layer, component) whose tensors the report keeps (--save-tensors).
struct Focus {
  int64_t step = -1;       // -1: any step
  int layer = -2;          // -2: any layer (-1: embed, final_norm_out, logits)
  std::string component;   // "": any
  bool matches(int64_t s, int l, const std::string& c) const;
};
// "step=3,layer=6,component=topk" (any subset); a dsv41::Error otherwise.
Focus parse_focus(const std::string& text);

// Keeps both sides' ("a", "b") values of every item of this step the focus names: the captured
// outputs, the caches ("cache.<kind>", uint8 [entries, entry_bytes]) and the logits (fp32
// [1, vocab]).
void keep_focus(reports::Comparison& cmp, const Focus& f, int64_t step, const StepCapture& a,
                const StepCapture& b);

}  // namespace dsv41::scenarios::runner
