// reference/ops/linear.h
//
// Linear layers per weight dtype, as the official `linear()` computes them (model.py, kernel.py):
//
//   weight dtype  activation path                          accumulation                       output
//   F8_E4M3       act_quant(x, 32, ue8m0): E4M3 codes +     per 32-wide K block: exact dot of   bf16
//                 one E8M0 scale per 32 of K                 code values, rounded once to fp32;
//                 (formats::quantize_fp8_block)              acc += partial * a_s * w_s (fp32,
//                                                            K blocks in order); w_s per 32x32
//   F4 (E2M1)     same act_quant                             same, w_s = E8M0 per (row, 32 of K)  bf16
//   BF16          x as is (bf16)                             double in index order -> fp32       bf16
//   F32           x as is (fp32 or bf16 values)              fp32 FMA chain in index order       fp32
//
// Exactness (measured against golden/oracle/kernels.h5 gemm/fp8 and gemm/fp4: every output
// bit-identical, 400/400 and 320/320): the fp8/fp4 per-block partials are the exact value rounded
// once (order-free), the block accumulation follows the kernel's order, so the result can differ
// from the official CPU port only where torch's fp32 matmul inside one 32-block was not exact
// (rare; <= 1 bf16 ulp). BF16/F32 products are the double sum rounded once: within the bound of
// docs/numerics.md of the true value, while torch's fp32 GEMM has its own blocking-dependent order
// (the same torch differs between shapes, oracle README finding 4), so those match to a tolerance.
//
// Inputs: the F8/F4/BF16 paths require every x value to be a bf16 value (the official code only
// feeds them bf16 tensors) and act_quant requires finite blocks; violations throw dsv41::Error
// naming the weight, the row and the element or block.
//
// Example:
//   LinearWeight wq_a = load_linear(weights, "layers.2.attn.wq_a", DType::kF8E4M3, 128, 256);
//   Tensor<float> qr = linear(x, wq_a);   // x: [T, 256] bf16 -> [T, 128] bf16
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/dtype.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

struct LinearWeight {
  std::string name;       // checkpoint prefix, e.g. "layers.2.attn.wq_a"
  DType dtype = DType::kF32;
  int64_t out = 0, in = 0;
  std::vector<float> w;      // [out, in] element values (E4M3 / E2M1 / bf16 / fp32 values)
  std::vector<float> scale;  // F8_E4M3: [ceil(out/32), ceil(in/32)] E8M0 values;
                             // F4: [out, in/32] E8M0 values; empty for BF16/F32
  // F4 held packed (load_linear with pack_fp4, reference/checkpoint/weights.h; docs/released-dims.md):
  // [out, in/2] bytes, two E2M1 codes per byte, element 2j in the low nibble (the checkpoint's own
  // bytes), and `w` is then empty: 1/8 of the memory of `w`. Every linear gives the same bits for
  // either form (the code values are decoded exactly, 32 at a time).
  std::vector<uint8_t> packed;
  bool is_packed() const { return !packed.empty(); }
  // (Loaded from a checkpoint by load_linear, reference/checkpoint/weights.h.)
};

// The E2M1 values of `n` elements of a packed F4 weight starting at flat element `first` (even):
// packed bytes -> out [n] fp32 (exact).
void unpack_f4_values(const uint8_t* packed, int64_t first, int64_t n, float* out);

// y = x W^T with the official dtype semantics above.
// x: [T, in] (bf16 values for F8/F4/BF16 weights) -> [T, out] (bf16 values, or fp32 for F32).
// Threads split (row, output) pairs only: the result does not depend on the thread count.
Tensor<float> linear(const Tensor<float>& x, const LinearWeight& w);

// y = x W^T in fp32 for any weight dtype, output not rounded to bf16: the official
// `F.linear(x.float(), weight.float())` (MoE gate) and the fp32 head. Accumulation: an fp32
// fused multiply-add chain in index order (acc = fma(x_i, w_i, acc)), which is the order of
// torch's multi-row CPU fp32 GEMM (measured: the ratio-2 compressor's wkv/wgate rows and caches
// bit-exact); torch's one-row GEMV sums differently (a few fp32 ulps). F8/F4 weights (never used this way by the official code)
// take their dequantized values code * scale (exact in fp32).
// x: [T, in] fp32 -> [T, out] fp32.
Tensor<float> linear_fp32(const Tensor<float>& x, const LinearWeight& w);

// The grouped output projection of attention (wo_a, bf16 weight): x [T, G * width] viewed as G
// groups; group g uses rows [g * r, (g + 1) * r) of w (r = w.out / G, w.in = width):
//   y[t, g*r + j] = bf16(dot_f64_f32(x[t, g*width .. (g+1)*width), w[g*r + j]))
// (the official per-group einsum; double accumulation in index order, rounded once to fp32, then
// to bf16, as F.linear above). x: [T, G * w.in] bf16 -> [T, w.out] bf16.
Tensor<float> grouped_linear(const Tensor<float>& x, const LinearWeight& w, int groups);

// The activation quantization of fp8/fp4 linears (act_quant block 32, ue8m0) of one row
// (formats::quantize_fp8_block per 32 values; bit-exact vs the oracle's x_q / x_scale).
// x: [in] bf16 values, in % 32 == 0 -> code_values: [in] E4M3 values, scales: [in/32] E8M0 values.
// Throws if a block holds NaN or Inf.
void act_quant_row(const float* x, int64_t in, float* code_values, float* scales);

}  // namespace dsv41::reference
