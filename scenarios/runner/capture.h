// scenarios/runner/capture.h
//
// StepCapture: everything one side showed of one step, in the order the forward produced it:
// every hooked component output (reference/model/hooks.h), the Engram ids, the last position's logits,
// and the caches after the step. The runner compares two captures item by item
// (scenarios/runner/compare.h); the item order is the order "first divergence" follows.
//
// Example:
//   StepCapture cap;
//   reference::model::ForwardHooks h = capture_hooks(cap, nullptr);   // record only
//   reference::model::StepRecord r = backend.step(session, tokens, {}, h, step);
//   finish_capture(cap, r, backend.caches(session));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "scenarios/judge/metrics.h"

namespace dsv41::scenarios::runner {

struct CapturedItem {
  enum Kind { kFloat, kIndex, kMask, kIds };
  int layer = -1;
  std::string component;
  Kind kind = kFloat;
  judge::ValueType type = judge::ValueType::kBf16;  // kFloat
  reference::Tensor<float> f;         // kFloat
  reference::Tensor<int32_t> i;       // kIndex: [T, k] (-1 padding)
  reference::Tensor<uint8_t> m;       // kMask: [T, N]
  std::vector<int64_t> ids;           // kIds (flattened)
  std::vector<int64_t> ids_shape;
};

struct StepCapture {
  int64_t start_pos = 0, tokens = 0;
  std::vector<CapturedItem> items;
  std::vector<float> logits;                  // [logit_rows, vocab] fp32: the last position (a step)
  int64_t logit_rows = 1;                     //   or every kept position (a speculative round)
  std::vector<reference::model::CacheView> caches;   // after the step
  const CapturedItem* find(int layer, const std::string& component) const;
};

// Every component name a capture can hold (reference/model/hooks.h's names, engram_ids, logits and
// the caches cache.window_kv / cache.compressed_kv / cache.index_keys).
const std::vector<std::string>& known_components();
bool is_known_component(const std::string& name);

// The storage type of a hook's values (fp32 for in_pre and the mHC mixes, bf16 otherwise).
judge::ValueType hook_value_type(const std::string& component);

// Values a teacher-forced side continues with: after recording its own output of a component,
// the side takes `forced`'s value of the same (layer, component), when it has one of the same
// shape (else a dsv41::Error: the sides disagree on structure). index_scores is never forced
// (it is internal to the indexer; the selection it makes is).
// The returned hooks record into `into` and, when forced != nullptr, replace the values.
// skip_index_scores: index_scores is not recorded (sampled replay at scale, docs/scale.md).
reference::model::ForwardHooks capture_hooks(StepCapture& into, const StepCapture* forced, bool skip_index_scores = false);

// Adds the StepRecord's Engram ids (before each Engram layer's "engram_out" item), the logits and
// the caches.
void finish_capture(StepCapture& cap, const reference::model::StepRecord& rec, std::vector<reference::model::CacheView> caches);

// Speculative rounds (docs/dspark.md): a round's capture holds the kept positions only, so the
// verify step of a speculative side and the one-token steps of a plain side compare row by row.
//   first_rows    the first `rows` rows of every per-token item (the verify step's kept rows);
//                 the logits and the caches are set by the caller
//   concat_rows   one-token steps as one capture of all their rows, items in the first step's
//                 order (every step must hold the same items, else a dsv41::Error); a [T, N] item
//                 whose N grows with the position is padded to the widest with the value of an
//                 unreachable entry (index_scores -inf, masks 0, selections -1)
//   align_columns a [T, N] item of a and b cut to the narrower N: the columns beyond are entries
//                 completed after the last kept row, which no kept row can reach
StepCapture first_rows(const StepCapture& cap, int64_t rows);
StepCapture concat_rows(const std::vector<StepCapture>& steps);
void align_columns(StepCapture& a, StepCapture& b);

}  // namespace dsv41::scenarios::runner
