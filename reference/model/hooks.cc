#include "reference/model/hooks.h"

namespace dsv41::reference::model {
namespace {

using K = ComponentKind;
using Y = ComponentType;

// One row per component; docs/architecture.md prints the same table.
const std::vector<ComponentInfo> kTable = {
    {Component::kEmbed, "embed", K::kTensor, Y::kBf16, "[T, hc, dim]", "embed (copied to the hc streams)"},
    {Component::kInStream, "in_stream", K::kTensor, Y::kBf16, "[T, hc, dim]", "layers.N input (before Engram)"},
    {Component::kInPre, "in_pre", K::kTensor, Y::kFp32, "[T, hc]",
     "the pre this layer's attention applies (layers.N-1.hc_ffn; layer 0 one-hot)"},
    {Component::kEngramIds, "engram_ids", K::kIds, Y::kInt64, "[T, n_cols]", "layers.N.engram hash ids"},
    {Component::kEngramOut, "engram_out", K::kTensor, Y::kBf16, "[T, hc, dim]", "layers.N.engram"},
    {Component::kHcAttnPre, "hc_attn_pre", K::kTensor, Y::kFp32, "[T, hc]", "layers.N.hc_attn (pre)"},
    {Component::kHcAttnPost, "hc_attn_post", K::kTensor, Y::kFp32, "[T, hc]", "layers.N.hc_attn (post)"},
    {Component::kHcAttnComb, "hc_attn_comb", K::kTensor, Y::kFp32, "[T, hc, hc]", "layers.N.hc_attn (comb)"},
    {Component::kAttnIn, "attn_in", K::kTensor, Y::kBf16, "[T, dim]", "layers.N.attn_norm"},
    {Component::kIndexScores, "index_scores", K::kTensor, Y::kBf16, "[T, N]",
     "layers.N.attn.indexer scores (-inf unreachable or outside the candidates)"},
    {Component::kCandidates, "candidates", K::kMask, Y::kUint8, "[T, N]",
     "layers.N.attn.indexer candidate mask (the candidate source)"},
    {Component::kTopk, "topk", K::kIndex, Y::kInt32, "[T, k]", "layers.N.attn.indexer top-k (positions, -1 pad)"},
    {Component::kAttnOut, "attn_out", K::kTensor, Y::kBf16, "[T, dim]", "layers.N.attn"},
    {Component::kAttnStream, "attn_stream", K::kTensor, Y::kBf16, "[T, hc, dim]", "layers.N hc_post after attn"},
    {Component::kHcFfnPre, "hc_ffn_pre", K::kTensor, Y::kFp32, "[T, hc]", "layers.N.hc_ffn (pre)"},
    {Component::kHcFfnPost, "hc_ffn_post", K::kTensor, Y::kFp32, "[T, hc]", "layers.N.hc_ffn (post)"},
    {Component::kHcFfnComb, "hc_ffn_comb", K::kTensor, Y::kFp32, "[T, hc, hc]", "layers.N.hc_ffn (comb)"},
    {Component::kFfnIn, "ffn_in", K::kTensor, Y::kBf16, "[T, dim]", "layers.N.ffn_norm"},
    {Component::kExperts, "experts", K::kIndex, Y::kInt32, "[T, k]", "layers.N.ffn.gate (routed experts)"},
    {Component::kFfnOut, "ffn_out", K::kTensor, Y::kBf16, "[T, dim]", "layers.N.ffn"},
    {Component::kOutStream, "out_stream", K::kTensor, Y::kBf16, "[T, hc, dim]", "layers.N output"},
    {Component::kFinalNormOut, "final_norm_out", K::kTensor, Y::kBf16, "[1 or T, dim]", "norm (after hc_pre)"},
    {Component::kLogits, "logits", K::kTensor, Y::kFp32, "[1 or T, vocab]", "head"},
    {Component::kDSparkMainX, "dspark_main_x", K::kTensor, Y::kBf16, "[T, dim]",
     "mtp.0 main_norm(main_proj(main_hidden)) (a forward step, every position)"},
    {Component::kDSparkMainKv, "dspark_main_kv", K::kTensor, Y::kBf16, "[T, head_dim]",
     "mtp.i.attn main KV: the ring rows the step writes (after RoPE and the window_kv QDQ)"},
    {Component::kDSparkEmbed, "dspark_embed", K::kTensor, Y::kBf16, "[block, hc, dim]",
     "mtp.0 forward_embed: [last token, noise...] embedded, copied to the hc streams"},
    {Component::kDSparkInStream, "dspark_in_stream", K::kTensor, Y::kBf16, "[block, hc, dim]", "mtp.i input"},
    {Component::kDSparkHcAttnPre, "dspark_hc_attn_pre", K::kTensor, Y::kFp32, "[block, hc]", "mtp.i.hc_attn (pre)"},
    {Component::kDSparkHcAttnPost, "dspark_hc_attn_post", K::kTensor, Y::kFp32, "[block, hc]", "mtp.i.hc_attn (post)"},
    {Component::kDSparkHcAttnComb, "dspark_hc_attn_comb", K::kTensor, Y::kFp32, "[block, hc, hc]",
     "mtp.i.hc_attn (comb)"},
    {Component::kDSparkAttnIn, "dspark_attn_in", K::kTensor, Y::kBf16, "[block, dim]", "mtp.i.attn_norm"},
    {Component::kDSparkAttnOut, "dspark_attn_out", K::kTensor, Y::kBf16, "[block, dim]",
     "mtp.i.attn (DSparkAttention: the ring and the whole block)"},
    {Component::kDSparkAttnStream, "dspark_attn_stream", K::kTensor, Y::kBf16, "[block, hc, dim]",
     "mtp.i hc_post after attn"},
    {Component::kDSparkHcFfnPre, "dspark_hc_ffn_pre", K::kTensor, Y::kFp32, "[block, hc]", "mtp.i.hc_ffn (pre)"},
    {Component::kDSparkHcFfnPost, "dspark_hc_ffn_post", K::kTensor, Y::kFp32, "[block, hc]", "mtp.i.hc_ffn (post)"},
    {Component::kDSparkHcFfnComb, "dspark_hc_ffn_comb", K::kTensor, Y::kFp32, "[block, hc, hc]", "mtp.i.hc_ffn (comb)"},
    {Component::kDSparkFfnIn, "dspark_ffn_in", K::kTensor, Y::kBf16, "[block, dim]", "mtp.i.ffn_norm"},
    {Component::kDSparkExperts, "dspark_experts", K::kIndex, Y::kInt32, "[block, k]",
     "mtp.i.ffn.gate (routed experts, the DSpark counts)"},
    {Component::kDSparkFfnOut, "dspark_ffn_out", K::kTensor, Y::kBf16, "[block, dim]", "mtp.i.ffn"},
    {Component::kDSparkOutStream, "dspark_out_stream", K::kTensor, Y::kBf16, "[block, hc, dim]", "mtp.i output"},
    {Component::kDSparkNormOut, "dspark_norm_out", K::kTensor, Y::kBf16, "[block, dim]",
     "mtp.last norm (after hc_pre)"},
    {Component::kDSparkHeadLogits, "dspark_head_logits", K::kTensor, Y::kFp32, "[block, vocab]",
     "head(mtp.last norm), before the Markov bias"},
    {Component::kDSparkMarkovEmbed, "dspark_markov_embed", K::kTensor, Y::kBf16, "[1, rank]",
     "mtp.last.markov_head.embed of the token feeding slot i (layer = slot)"},
    {Component::kDSparkMarkovBias, "dspark_markov_bias", K::kTensor, Y::kFp32, "[1, vocab]",
     "mtp.last.markov_head logits bias of slot i (layer = slot)"},
    {Component::kDSparkToken, "dspark_token", K::kIndex, Y::kInt32, "[1, 1]",
     "the token drawn from slot i's logits, feeding slot i + 1 (layer = slot)"},
    {Component::kDSparkLogits, "dspark_logits", K::kTensor, Y::kFp32, "[block, vocab]",
     "draft logits incl. the Markov bias (observed after the chain)"},
    {Component::kDSparkConfidence, "dspark_confidence", K::kTensor, Y::kFp32, "[block]",
     "mtp.last.confidence_head (logits; x before the norm)"},
    {Component::kAccept, "accept", K::kIds, Y::kInt64, "[2]: accepted drafts m, next token",
     "none: DeepSpec's accept rule (reference/model/speculative.h)"},
    {Component::kCacheWindowKv, "cache.window_kv", K::kCache, Y::kBytes, "[entries, entry_bytes]",
     "layers.N.attn window_kv_cache"},
    {Component::kCacheCompressedKv, "cache.compressed_kv", K::kCache, Y::kBytes, "[entries, entry_bytes]",
     "layers.N.attn compress_kv_cache"},
    {Component::kCacheIndexKeys, "cache.index_keys", K::kCache, Y::kBytes, "[entries, entry_bytes]",
     "layers.N.attn.indexer k_cache"},
    {Component::kCacheCompressor, "cache.compressor", K::kCache, Y::kBytes, "[pending, 8 * dim]: fp32 kv, score rows",
     "layers.N.attn.compressor kv_state, score_state (pending slots)"},
    {Component::kCacheDSparkWindowKv, "cache.dspark_window_kv", K::kCache, Y::kBytes, "[entries, entry_bytes]",
     "mtp.i.attn window_kv_cache (layer n_layers + i)"},
};

}  // namespace

const std::vector<ComponentInfo>& component_table() { return kTable; }

const ComponentInfo& component_info(Component c) {
  const size_t i = static_cast<size_t>(c);
  DSV41_CHECK(i < kTable.size() && kTable[i].id == c, "component table out of order at ", i);
  return kTable[i];
}

const char* name(Component c) { return component_info(c).name; }

std::optional<Component> component_from_name(const std::string& n) {
  for (const ComponentInfo& i : kTable) {
    if (n == i.name) return i.id;
  }
  return std::nullopt;
}

}  // namespace dsv41::reference::model
