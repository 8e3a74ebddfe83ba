// scenarios/runner/layer_kinds.h
//
// One layer of each kind of the released schedule as a small model of its own
// (docs/released-dims.md): a config derived from a base (the `full` preset
// for the released dims, a small config for tests) that keeps every dimension of the base and
// rewrites only the layer lists, so that its last layer (the "target") has the kind:
//
//   kind     layers                      target                                  stands for (released)
//   swa      [0]                         0 SWA only                              0
//   full2    [2], kv/index source 0      0 Full, ratio 2                         2, 8, 14
//   full1    [1], kv/index source 0      0 Full, ratio 1, candidate source       20
//   reuse2   [2, 2], source 0            1 Reuse of 0 (compressed KV, top-k)     3-7, 9-13, 15-19
//   reuse1   [1, 1], source 0, cand. 0   1 Reuse of 0                            21-23, 25-27, ...
//   reindex  [1, 1], index 0 and 1      1 Reindex over 0's keys, candidates     24, 28, 32, 36
//   engram   [0], engram layer 0         0 SWA only + Engram                     1 (and 14's Engram)
//   dspark   [0] + 1 DSpark block        1 DSpark block (target layer 0)         40-42
//
// A Reuse or Reindex layer reads what its source published in the same step, so its source runs
// before it at the same dims (2 layers). Everything else stays the base's: vocab, dims, heads,
// experts, index heads, window, RoPE, mHC. Two changes beyond the layer lists: `engram` caps the
// Engram table (engram_vocab_size <= kEngramVocabCap, so that its rows, the sum of the bucket
// primes, fit in memory: 6.3M rows instead of 384M), and kinds without DSpark blocks or Engram
// layers have none (n_mtp_layers 0, no engram layers).
#pragma once

#include <string>
#include <vector>

#include "reference/ops/config.h"

namespace dsv41::scenarios::runner {

struct LayerKind {
  std::string name;             // "swa", "full2", ...
  std::string what;             // one line: the target layer's role
  std::string released_layers;  // the released layers of this kind
  int target = 0;               // the layer of the derived config that has the kind
  reference::LayerRole role = reference::LayerRole::kSwaOnly;
  int ratio = 0;
  bool candidate_source = false, uses_candidates = false, engram = false;
};

// The Engram bucket base of the `engram` kind: at most this (the released 16M gives 384M rows of
// 264 bytes, 101 GB per table).
inline constexpr int64_t kEngramVocabCap = 262144;

// Every kind, in the order above.
const std::vector<LayerKind>& layer_kinds();
// The kind named `name`; a dsv41::Error listing the kinds otherwise.
const LayerKind& layer_kind(const std::string& name);

// The config of `kind` derived from `base` (validated; `source` names the base in errors).
// Throws when the base cannot have the kind (e.g. no Engram heads for `engram`).
reference::ModelConfig kind_config(const reference::ModelConfig& base, const LayerKind& kind,
                                   const std::string& source);

// Checks that layer kind.target of `c` has the kind's role, ratio and flags (layer_schedule);
// a dsv41::Error naming what differs otherwise.
void check_kind(const reference::ModelConfig& c, const LayerKind& kind);

// Bytes the weights of `c` take in the checkpoint file, and held by the reference per copy
// (fp32 values; F4 as 4-bit codes when `packed_fp4`; Engram tables as bytes).
struct WeightBytes {
  double file = 0, held = 0, routed_experts_held = 0;
};
WeightBytes weight_bytes(const reference::ModelConfig& c, bool packed_fp4);

}  // namespace dsv41::scenarios::runner
