// reference/ops/embedding.h
//
// The token embedding as the official Transformer.forward starts: h = embed(input_ids), then
// h.unsqueeze(2).repeat(1, 1, hc_mult, 1): every token's bf16 row copied to the hc residual
// streams of mHC (reference/ops/mhc.h). Exact (a copy).
//
// Example:
//   Tensor<float> stream = embed(tokens, weights.embed, config.hc_mult);   // [T, hc, dim] bf16
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/tensor.h"

namespace dsv41::reference {

// tokens: [T] ids in [0, vocab), table: [vocab, dim] bf16 -> [T, hc, dim] bf16.
Tensor<float> embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc);

}  // namespace dsv41::reference
