// reference/model/block.cc
//
// One block (reference/model/forward.h states what it computes), shared by the backbone's layer
// loop (Model::forward_chunk) and the DSpark blocks (Model::draft): they differ only in their
// attention and in the names their values are observed under.
#include "reference/model/forward.h"

namespace dsv41::reference::model {

const BlockComponents kBackboneBlock = {
    Component::kHcAttnPre, Component::kHcAttnPost, Component::kHcAttnComb, Component::kAttnIn,
    Component::kAttnOut,   Component::kAttnStream, Component::kHcFfnPre,   Component::kHcFfnPost,
    Component::kHcFfnComb, Component::kFfnIn,      Component::kExperts,    Component::kFfnOut,
    Component::kOutStream};
const BlockComponents kDSparkBlock = {
    Component::kDSparkHcAttnPre, Component::kDSparkHcAttnPost, Component::kDSparkHcAttnComb,
    Component::kDSparkAttnIn,    Component::kDSparkAttnOut,    Component::kDSparkAttnStream,
    Component::kDSparkHcFfnPre,  Component::kDSparkHcFfnPost,  Component::kDSparkHcFfnComb,
    Component::kDSparkFfnIn,     Component::kDSparkExperts,    Component::kDSparkFfnOut,
    Component::kDSparkOutStream};

Tensor<int32_t> block_forward(const BlockContext& ctx, const BlockComponents& names, int layer, const checkpoint::BlockWeights& bw,
                              const BlockAttention& attention, Tensor<float>& stream, Tensor<float>& pre) {
  const seam::Ops& ops = ctx.ops;
  const ModelConfig& c = ctx.config;
  const Observer& observe = ctx.observe;
  const auto observe_mixes = [&](Component pre_name, Component post_name, Component comb_name, HcMixes& m) {
    observe(pre_name, layer, m.pre);
    observe(post_name, layer, m.post);
    observe(comb_name, layer, m.comb);
  };
  // Attention sublayer: its mixes come from the stream before it; it applies the previous pre.
  HcMixes am = ops.hc_mixes(stream, bw.hc_attn, c.norm_eps, c.hc_sinkhorn_iters, c.hc_eps);
  observe_mixes(names.hc_attn_pre, names.hc_attn_post, names.hc_attn_comb, am);
  Tensor<float> a_in = ops.rms_norm(ops.hc_pre(stream, pre), bw.attn_norm, c.norm_eps);  // [T, dim] bf16
  observe(names.attn_in, layer, a_in);
  Tensor<float> a_out = attention(a_in);  // [T, dim] bf16
  observe(names.attn_out, layer, a_out);
  stream = ops.hc_post(a_out, stream, am.post, am.comb);
  observe(names.attn_stream, layer, stream);
  // FFN sublayer: applies the attention's pre.
  HcMixes fm = ops.hc_mixes(stream, bw.hc_ffn, c.norm_eps, c.hc_sinkhorn_iters, c.hc_eps);
  observe_mixes(names.hc_ffn_pre, names.hc_ffn_post, names.hc_ffn_comb, fm);
  Tensor<float> f_in = ops.rms_norm(ops.hc_pre(stream, am.pre), bw.ffn_norm, c.norm_eps);  // [T, dim] bf16
  observe(names.ffn_in, layer, f_in);
  MoeRouting routing = ops.moe_gate(f_in, bw.ffn, c, layer);
  if (observe.hooks().index) {  // a replaced choice gets the official weights of its experts
    observe(names.experts, layer, routing.experts);
    ops.moe_routing_weights(routing, c);
  }
  Tensor<float> f_out = ops.moe_experts(f_in, bw.ffn, routing, c);
  observe(names.ffn_out, layer, f_out);
  stream = ops.hc_post(f_out, stream, fm.post, fm.comb);
  observe(names.out_stream, layer, stream);
  pre = std::move(fm.pre);
  return std::move(routing.experts);
}

}  // namespace dsv41::reference::model
