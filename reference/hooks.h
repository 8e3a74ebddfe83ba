// reference/hooks.h
//
// ForwardHooks: the points where the forward shows, and may replace, what it computed. A
// divergence run uses them to read every component's output, and teacher forcing uses them to
// give one side another side's values (so a component's own error is separated from the error
// it inherits). Names and shapes (T tokens of this step, L the layer):
//   tensor: "embed" [T, hc, dim] (layer -1: the embedding copied to the hc streams),
//           "in_stream" [T, hc, dim] (layer input, before Engram), "in_pre" [T, hc] fp32 (the
//           pre this layer's attention applies: the previous layer's FFN mixes; layer 0 one-hot),
//           "engram_out" [T, hc, dim],
//           "hc_attn_pre" / "hc_attn_post" [T, hc] fp32, "hc_attn_comb" [T, hc, hc] fp32,
//           "attn_in" [T, dim],
//           "index_scores" [T, N] (an index layer's scores, N = end_pos / ratio compressed
//           positions, -inf where unreachable and, after the candidate source, outside its
//           mask: what the top-k is taken from, seen just before it; every Full index source
//           and Reindex layer, not when N = 0; a replacement changes the selection),
//           "attn_out" [T, dim], "attn_stream" [T, hc, dim],
//           "hc_ffn_pre" / "hc_ffn_post" / "hc_ffn_comb", "ffn_in" [T, dim], "ffn_out" [T, dim],
//           "out_stream" [T, hc, dim]; "final_norm_out" [1, dim] (layer -1; [T, dim] with
//           Model::set_full_logits), "logits" [1, vocab] fp32 (layer -1, after the head;
//           [T, vocab] with Model::set_full_logits; a replacement changes what StepRecord holds)
//   index:  "topk" [T, k] compressed positions ascending, -1 padding (an index source's own
//           selection, before it is published), "experts" [T, k] routed experts
//   mask:   "candidates" [T, N] (the candidate source's mask, before it is published)
// Values are bf16 unless marked fp32. A hook may change values, never shapes (checked). When
// "experts" is replaced, the routing weights are recomputed from the gate scores of the new
// experts with the official rule.
#pragma once

#include <functional>
#include <string>

#include "formats/error.h"
#include "reference/tensor.h"

namespace dsv41::reference {

struct ForwardHooks {
  std::function<void(const std::string& what, int layer, Tensor<float>& value)> tensor;
  std::function<void(const std::string& what, int layer, Tensor<int32_t>& value)> index;
  std::function<void(const std::string& what, int layer, Tensor<uint8_t>& value)> mask;

  template <typename T, typename F>
  static void call(const F& fn, const char* what, int layer, Tensor<T>& v) {
    if (!fn) return;
    const std::vector<int64_t> shape = v.shape();
    fn(what, layer, v);
    DSV41_CHECK(v.shape() == shape, "forward hook changed the shape of '", what, "' at layer ", layer);
  }
  void on(const char* what, int layer, Tensor<float>& v) const { call(tensor, what, layer, v); }
  void on(const char* what, int layer, Tensor<int32_t>& v) const { call(index, what, layer, v); }
  void on(const char* what, int layer, Tensor<uint8_t>& v) const { call(mask, what, layer, v); }
};

}  // namespace dsv41::reference
