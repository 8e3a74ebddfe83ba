// reference/ops/dspark.h
//
// The equations of the DSpark draft head that are not ordinary components, as the official code
// computes them (model.py: Transformer.forward's capture, DSparkBlock.forward_embed / forward_head,
// DSparkAttention, DSparkMarkovHead, DSparkConfidenceHead). Everything else a draft runs is an
// ordinary component (linear, rmsnorm, rope, attention, mhc, moe, embedding, kv_quant); the model
// composes them (reference/model/model_dspark.cc, docs/dspark.md):
//
//   capture      main_hidden[t] = cat over the target layers l (ascending) of hc_mean(input of l)
//                (the stream entering block l, after its Engram)                  [T, n*dim] bf16
//   stage 0      main_x = main_norm(main_proj(main_hidden))                       [T, dim] bf16
//   ring         kv_norm(wkv(main_x)) -> RoPE at the main position -> FP8 QDQ, slot = pos % W
//   draft block  [last token, noise x (block-1)] at positions p+1 .. p+block (p: the last main
//                position), embedded and copied to the hc streams; each DSpark block is a Block
//                (mHC + DSparkAttention + MoE with the DSpark expert counts)
//   attention    q and the block's own K/V as the backbone's window attention; sparse_attn over
//                [ring slots 0 .. n-1 | the block's rows], n = min(W, p + 1): every draft row
//                sees the whole ring and the WHOLE block (bidirectional, no causal mask)
//                (dspark_index_rows); sink, inverse RoPE, grouped output as in attention.h
//   head         x = hc_pre(stream, pre); logits = head(norm(x)) [block, vocab] fp32
//   Markov chain tok_0 = last token; for i < block: e_i = markov_embed[tok_i] (bf16 [rank]),
//                bias_i = markov_head(e_i) (fp32 [vocab]); logits[i] += bias_i
//                (add_markov_bias); tok_{i+1} = sample(logits[i]) (reference/ops/sampling.h)
//   confidence   Linear_fp32(cat(x, e)) -> [block] logits; x is BEFORE the norm; sigmoid is the
//                conditional acceptance probability of slot i
//
// Exactness: hc_mean, concat_cols, concat_rows and add_markov_bias are exact by construction
// (the one bf16 rounding of hc_mean is torch's: an fp32 sum, then the division, then bf16).
//
// Example:
//   Tensor<float> part = hc_mean(stream);                     // [T, hc, dim] -> [T, dim] bf16
//   Tensor<float> main_hidden = concat_cols({p7, p8, p9});    // [T, 3 * dim] bf16
//   add_markov_bias(logits, /*slot=*/0, bias);                // logits[0] += bias (fp32)
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

// The mean over the hc stream copies, as torch's CPU mean of a bf16 tensor (h.mean(dim=2)):
//   y[t][d] = bf16(fp32(sum_i x[t][i][d]) / hc)    fp32 sum sequential over i from 0, fp32 division
// stream: [T, hc, dim] bf16 -> [T, dim] bf16.
Tensor<float> hc_mean(const Tensor<float>& stream);

// Concatenation along the last dimension (torch.cat(dim=-1)): parts [T, d_k] -> [T, sum_k d_k],
// values copied (exact). Every part must have the same T; at least one part.
Tensor<float> concat_cols(const std::vector<Tensor<float>>& parts);

// Concatenation along the first dimension (torch.stack of rows): parts [n_k, d] ->
// [sum_k n_k, d], values copied (exact). Every part must have the same d; at least one part.
Tensor<float> concat_rows(const std::vector<Tensor<float>>& parts);

// logits[slot][v] += bias[0][v] in fp32 (the official logits[:, i].add_(logits_bias)).
// logits: [block, vocab] fp32 (in place), bias: [1, vocab] fp32, 0 <= slot < block.
void add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias);

// The sparse_attn index rows of a draft block (the official get_dspark_topk_idxs, with the ring
// read as its first context_rows slots in slot order and the block's rows after them): every one
// of the `block` rows is [0, 1, ..., context_rows + block - 1]. context_rows = min(W, p + 1) > 0.
// -> [block, context_rows + block] int32.
Tensor<int32_t> dspark_index_rows(int64_t context_rows, int64_t block);

}  // namespace dsv41::reference
