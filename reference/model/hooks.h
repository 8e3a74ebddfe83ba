// reference/model/hooks.h
//
// Component: the one name of each thing a step produces, used by the model (hooks), captures,
// planted defects, HDF5 reports and docs (docs/architecture.md). The table below is the only
// list; component_info() gives each name, its kind, its value type, its shape and the official
// module it comes from.
//
// ForwardHooks: the points where the forward shows, and may replace, what it computed. A
// divergence run uses them to read every component's output, and teacher forcing uses them to
// give one side another side's values (so a component's own error is separated from the error
// it inherits). A hook may change values, never shapes (checked). When "experts" is replaced,
// the routing weights are recomputed from the gate scores of the new experts with the official
// rule; when "topk" or "candidates" is replaced, later layers use the replacement.
//
// The hooks see host tensors: a device backend downloads a value for its hook and uploads the
// hook's result (reference/seam/ops.h), and only when a hook is set.
//
// Example:
//   ForwardHooks h;
//   h.tensor = [](Component what, int layer, Tensor<float>& v) {
//     if (what == Component::kAttnOut && layer == 3) v.at(0, 0) = 0.0f;   // plant a defect
//   };
//   model.set_hooks(h);
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference::model {

// In step order within a layer (the order "first divergence" follows).
enum class Component : uint8_t {
  kEmbed,          // layer -1
  kInStream,
  kInPre,
  kEngramIds,      // recorded (StepRecord::engram_ids), not hooked
  kEngramOut,
  kHcAttnPre,
  kHcAttnPost,
  kHcAttnComb,
  kAttnIn,
  kIndexScores,
  kCandidates,
  kTopk,
  kAttnOut,
  kAttnStream,
  kHcFfnPre,
  kHcFfnPost,
  kHcFfnComb,
  kFfnIn,
  kExperts,
  kFfnOut,
  kOutStream,
  kFinalNormOut,   // layer -1
  kLogits,         // layer -1
  // DSpark (docs/dspark.md). Forward steps: main_x (layer -1) and each block's ring rows (layer =
  // the block's layer id n_layers + i). Model::draft: the block components at n_layers + i, the
  // head's at -1, the Markov chain's per draft slot (layer = slot i).
  kDSparkMainX,
  kDSparkMainKv,
  kDSparkEmbed,
  kDSparkInStream,
  kDSparkHcAttnPre,
  kDSparkHcAttnPost,
  kDSparkHcAttnComb,
  kDSparkAttnIn,
  kDSparkAttnOut,
  kDSparkAttnStream,
  kDSparkHcFfnPre,
  kDSparkHcFfnPost,
  kDSparkHcFfnComb,
  kDSparkFfnIn,
  kDSparkExperts,
  kDSparkFfnOut,
  kDSparkOutStream,
  kDSparkNormOut,
  kDSparkHeadLogits,
  kDSparkMarkovEmbed,
  kDSparkMarkovBias,
  kDSparkToken,
  kDSparkLogits,
  kDSparkConfidence,
  kAccept,         // layer -1: a speculative round's accept decision (recorded, not hooked)
  kCacheWindowKv,  // caches after the step (not hooked: read from the state)
  kCacheCompressedKv,
  kCacheIndexKeys,
  kCacheCompressor,  // the compressors' pending groups (kv_cache.h compressor_views)
  kCacheDSparkWindowKv,  // the DSpark blocks' rings (kv_cache.h dspark_views; layer n_layers + i)
};

enum class ComponentKind : uint8_t {
  kTensor,  // a float hook (ForwardHooks::tensor)
  kIndex,   // an int32 selection hook (ForwardHooks::index)
  kMask,    // a uint8 mask hook (ForwardHooks::mask)
  kIds,     // int64 ids recorded by the step (no hook)
  kCache,   // a cache's stored bytes after the step (no hook)
};

enum class ComponentType : uint8_t { kBf16, kFp32, kInt32, kUint8, kInt64, kBytes };

struct ComponentInfo {
  Component id;
  const char* name;      // "attn_out": in hooks, captures, mutants, reports and docs
  ComponentKind kind;
  ComponentType type;    // of the values (bf16 values are held in fp32 tensors)
  const char* shape;     // T: the step's tokens, N: compressed positions, k: selections
  const char* official;  // the official module (model.py) whose output it is
};

// Every component, in the enum's order.
const std::vector<ComponentInfo>& component_table();
const ComponentInfo& component_info(Component c);
const char* name(Component c);
// The component of a name; std::nullopt for an unknown name.
std::optional<Component> component_from_name(const std::string& name);

struct ForwardHooks {
  std::function<void(Component what, int layer, Tensor<float>& value)> tensor;
  std::function<void(Component what, int layer, Tensor<int32_t>& value)> index;
  std::function<void(Component what, int layer, Tensor<uint8_t>& value)> mask;
  // Components no hook is called for: a backend whose tensors live on a device does not move them
  // to the host for it (a sampled replay leaves index_scores out: [T, N] fp32, 17 GB at 2^20 keys).
  std::vector<Component> skipped;
  // The hooks only read (no teacher forcing): a device backend does not copy the values back.
  bool read_only = false;

  bool any() const { return tensor || index || mask; }
  bool skips(Component what) const { return std::find(skipped.begin(), skipped.end(), what) != skipped.end(); }

  template <typename T, typename F>
  static void call(const F& fn, Component what, int layer, Tensor<T>& v) {
    if (!fn) return;
    const std::vector<int64_t> shape = v.shape();
    fn(what, layer, v);
    DSV41_CHECK(v.shape() == shape, "forward hook changed the shape of '", name(what), "' at layer ", layer);
  }
  void on(Component what, int layer, Tensor<float>& v) const { call(tensor, what, layer, v); }
  void on(Component what, int layer, Tensor<int32_t>& v) const { call(index, what, layer, v); }
  void on(Component what, int layer, Tensor<uint8_t>& v) const { call(mask, what, layer, v); }
};

}  // namespace dsv41::reference::model
