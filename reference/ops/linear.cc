// reference/ops/linear.cc
//
// The four weight-dtype paths of the official `linear()` (see linear.h for the table). Every
// output element is computed by itself, in one fixed order, so threads (parallel_for over
// (row, block of outputs)) never change a bit.
#include "reference/ops/linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {
namespace {

constexpr int64_t kBlock = formats::kFp8Block;  // 32: K block of act_quant, fp8 and fp4 weights
constexpr int64_t kOutChunk = 64;               // outputs per parallel work item (no numeric effect)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_bf16_value(float v) { return std::isnan(v) || round_to_bf16(v) == v; }

// Fails unless every value of x is a bf16 value: the official fp8/fp4 act_quant and the bf16
// F.linear only ever see bf16 tensors, so an fp32 value here is a caller's missing rounding.
void check_bf16_input(const Tensor<float>& x, const LinearWeight& w) {
  const std::vector<float>& v = x.data();
  for (size_t i = 0; i < v.size(); ++i) {
    DSV41_CHECK(is_bf16_value(v[i]), "linear '", w.name, "' (", dtype_name(w.dtype),
                "): input '", x.name(), "' element [", static_cast<int64_t>(i) / w.in, ", ",
                static_cast<int64_t>(i) % w.in, "] = ", v[i], " is not a bf16 value");
  }
}

void check_input_shape(const Tensor<float>& x, const LinearWeight& w) {
  DSV41_CHECK(x.rank() == 2 && x.dim(1) == w.in, "linear '", w.name, "': input '", x.name(),
              "' must be [T, ", w.in, "], got ", shape_string(x.shape()));
  if (w.is_packed()) {
    DSV41_CHECK(w.dtype == DType::kF4 && w.w.empty() && w.out > 0 && w.in > 0 && w.in % 2 == 0 &&
                    static_cast<int64_t>(w.packed.size()) * 2 == w.out * w.in,
                "linear '", w.name, "': packed weight (", dtype_name(w.dtype), ") holds ", w.packed.size(),
                " bytes and ", w.w.size(), " values for [", w.out, ", ", w.in, "]; only F4 is held packed");
  } else {
    DSV41_CHECK(w.out > 0 && w.in > 0 && static_cast<int64_t>(w.w.size()) == w.out * w.in, "linear '", w.name,
                "': weight holds ", w.w.size(), " values for [", w.out, ", ", w.in, "]");
  }
  int64_t scales = 0;
  if (w.dtype == DType::kF8E4M3) scales = ceil_div(w.out, kBlock) * ceil_div(w.in, kBlock);
  if (w.dtype == DType::kF4) scales = w.out * (w.in / kBlock);
  DSV41_CHECK(static_cast<int64_t>(w.scale.size()) == scales, "linear '", w.name, "': ",
              dtype_name(w.dtype), " weight [", w.out, ", ", w.in, "] needs ", scales,
              " scales, holds ", w.scale.size());
}

// E8M0 weight scale of output row o and K block kb.
//   F8_E4M3: one scale per 32x32 tile, scale [ceil(out/32), ceil(in/32)].
//   F4:      one scale per (row, 32 of K), scale [out, in/32].
float weight_scale(const LinearWeight& w, int64_t o, int64_t kb) {
  if (w.dtype == DType::kF8E4M3) return w.scale[static_cast<size_t>((o / kBlock) * ceil_div(w.in, kBlock) + kb)];
  return w.scale[static_cast<size_t>(o * (w.in / kBlock) + kb)];
}

// Block-scaled GEMM of fp8/fp4 weights (kernel_cpu _block_scaled_gemm, K41 fp8_gemm/fp4_gemm):
//   x: [T, in] bf16 -> act_quant -> xq: [T, in] E4M3 values, xs: [T, in/32] E8M0 values
//   per output: acc (fp32) = 0; for kb in K-block order:
//     partial = exact sum_{32} xq*w, rounded once to fp32   (dot_exact_f32: exact for these operands)
//     acc += (partial * xs[kb]) * ws[kb]                    (fp32, left to right as torch does it)
//   y = bf16(acc)
// Outputs [o_begin, o_end) of one row: a: [in] E4M3 values, as: [in/32] E8M0 values; w: [out, in]
// code values, ws: the E8M0 weight scales (tile_scales: F8's [ceil(out/32), in/32], else F4's
// [out, in/32]) -> y: [out] bf16. The per-block partial is exact (dot_exact_f32), so the kernel is
// cloned for AVX2 at no cost in bits: a vector unit sums the 32 exact products in any order.
DSV41_SIMD_CLONES
void block_scaled_outputs(const float* __restrict a, const float* __restrict as, const float* __restrict w,
                          const float* __restrict wscale, bool tile_scales, int64_t in, int64_t o_begin,
                          int64_t o_end, float* __restrict y) {
  const int64_t nkb = in / kBlock;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const float* b = w + o * in;
    const float* ws = wscale + (tile_scales ? (o / kBlock) * nkb : o * nkb);
    float acc = 0.0f;
    for (int64_t kb = 0; kb < nkb; ++kb) {
      const float partial = dot_exact_f32(a + kb * kBlock, b + kb * kBlock, kBlock);
      const float scaled = (partial * as[kb]) * ws[kb];
      acc += scaled;
    }
    y[o] = round_to_bf16(acc);
  }
}

// block_scaled_outputs for a packed F4 weight: each 32-code block is decoded exactly to its E2M1
// values first, then the same exact partial and the same fp32 accumulation: the same bits.
// packed: [out, in/2] bytes (two codes each, low nibble first); wscale: [out, in/32].
void block_scaled_outputs_packed(const float* a, const float* as, const uint8_t* packed, const float* wscale,
                                 int64_t in, int64_t o_begin, int64_t o_end, float* y) {
  const int64_t nkb = in / kBlock;
  float b[kBlock];
  for (int64_t o = o_begin; o < o_end; ++o) {
    const float* ws = wscale + o * nkb;
    float acc = 0.0f;
    for (int64_t kb = 0; kb < nkb; ++kb) {
      unpack_f4_values(packed, o * in + kb * kBlock, kBlock, b);
      const float partial = dot_exact_f32(a + kb * kBlock, b, kBlock);
      const float scaled = (partial * as[kb]) * ws[kb];
      acc += scaled;
    }
    y[o] = round_to_bf16(acc);
  }
}

Tensor<float> block_scaled_linear(const Tensor<float>& x, const LinearWeight& w) {
  const int64_t T = x.dim(0), in = w.in, out = w.out, nkb = in / kBlock;
  Tensor<float> xq({T, in}, w.name + ".x_q");     // E4M3 values
  Tensor<float> xs({T, nkb}, w.name + ".x_scale");  // E8M0 values
  parallel_for(T, [&](int64_t t) {
    try {
      act_quant_row(x.row(t), in, xq.row(t), xs.row(t));
    } catch (const Error& e) {
      DSV41_FAIL("linear '", w.name, "': row ", t, " of '", x.name(), "': ", e.what());
    }
  });
  Tensor<float> y({T, out}, w.name + ".y");  // bf16 values
  const int64_t chunks = ceil_div(out, kOutChunk);
  parallel_for(T * chunks, [&](int64_t item) {
    const int64_t t = item / chunks, o_begin = (item % chunks) * kOutChunk;
    if (w.is_packed()) {
      block_scaled_outputs_packed(xq.row(t), xs.row(t), w.packed.data(), w.scale.data(), in, o_begin,
                                  std::min(out, o_begin + kOutChunk), y.row(t));
    } else {
      block_scaled_outputs(xq.row(t), xs.row(t), w.w.data(), w.scale.data(), w.dtype == DType::kF8E4M3, in, o_begin,
                           std::min(out, o_begin + kOutChunk), y.row(t));
    }
  });
  return y;
}

// F.linear: y[t, o] = sum_i x[t, i] * w[o, i], double accumulation in index order, rounded
// once to fp32 (dot_f64_f32), then to bf16 when `to_bf16`; in fp32 otherwise, an fp32 FMA chain in
// index order (fma_dot_f32). `wv` holds the weight values. Four outputs run side by side, each
// with its own chain (reference/ops/numerics.h): the same bits as one at a time.
Tensor<float> plain_linear(const Tensor<float>& x, const LinearWeight& w, const std::vector<float>& wv,
                           bool to_bf16) {
  const int64_t T = x.dim(0), in = w.in, out = w.out;
  Tensor<float> y({T, out}, w.name + ".y");
  const int64_t chunks = ceil_div(out, kOutChunk);
  parallel_for(T * chunks, [&](int64_t item) {
    const int64_t t = item / chunks, o_begin = (item % chunks) * kOutChunk;
    const int64_t o_end = std::min(out, o_begin + kOutChunk);
    const float* a = x.row(t);
    float* yr = y.row(t);
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) {
      const float* rows[4] = {wv.data() + o * in, wv.data() + (o + 1) * in, wv.data() + (o + 2) * in,
                              wv.data() + (o + 3) * in};
      float v[4];
      if (to_bf16) {
        dot_f64_f32_x4(a, rows, in, v);
        for (int k = 0; k < 4; ++k) yr[o + k] = round_to_bf16(v[k]);
      } else {
        fma_dot_f32_x4(a, rows, 1, in, v);
        for (int k = 0; k < 4; ++k) yr[o + k] = v[k];
      }
    }
    for (; o < o_end; ++o) {
      const float* wr = wv.data() + o * in;
      yr[o] = to_bf16 ? round_to_bf16(dot_f64_f32(a, wr, in)) : fma_dot_f32(a, wr, 1, in);
    }
  });
  return y;
}

}  // namespace

void unpack_f4_values(const uint8_t* packed, int64_t first, int64_t n, float* out) {
  static const float* const lut = [] {
    static float v[16];
    for (int c = 0; c < 16; ++c) v[c] = formats::e2m1_decode(static_cast<uint8_t>(c));
    return v;
  }();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = first + i;
    out[i] = lut[(packed[e >> 1] >> ((e & 1) * 4)) & 0xF];
  }
}

void act_quant_row(const float* x, int64_t in, float* code_values, float* scales) {
  DSV41_CHECK(in > 0 && in % kBlock == 0, "act_quant: row length must be a positive multiple of 32, got ", in);
  uint8_t codes[kBlock];
  for (int64_t b = 0; b < in / kBlock; ++b) {
    uint8_t scale = 0;
    const bool finite = formats::quantize_fp8_block(x + b * kBlock, &scale, codes);
    DSV41_CHECK(finite, "act_quant: block ", b, " (elements [", b * kBlock, ", ", (b + 1) * kBlock,
                ")) holds NaN or Inf; the official code has no defined result for it");
    scales[b] = formats::e8m0_decode(scale);
    for (int64_t i = 0; i < kBlock; ++i) code_values[b * kBlock + i] = formats::e4m3_decode(codes[i]);
  }
}

Tensor<float> linear(const Tensor<float>& x, const LinearWeight& w) {
  check_input_shape(x, w);
  switch (w.dtype) {
    case DType::kF8E4M3:
    case DType::kF4:
      DSV41_CHECK(w.in % kBlock == 0, "linear '", w.name, "': in=", w.in, " is not a multiple of 32");
      check_bf16_input(x, w);
      return block_scaled_linear(x, w);
    case DType::kBF16:
      check_bf16_input(x, w);
      return plain_linear(x, w, w.w, /*to_bf16=*/true);
    case DType::kF32:
      return plain_linear(x, w, w.w, /*to_bf16=*/false);
    default:
      DSV41_FAIL("linear '", w.name, "': unsupported weight dtype ", dtype_name(w.dtype));
  }
}

Tensor<float> linear_fp32(const Tensor<float>& x, const LinearWeight& w) {
  check_input_shape(x, w);
  if (w.dtype == DType::kBF16 || w.dtype == DType::kF32) return plain_linear(x, w, w.w, /*to_bf16=*/false);
  DSV41_CHECK(w.dtype == DType::kF8E4M3 || w.dtype == DType::kF4, "linear_fp32 '", w.name,
              "': unsupported weight dtype ", dtype_name(w.dtype));
  // Quantized weights: the dequantized value code * scale (exact in fp32). The official code
  // never takes this path; it is defined so that every LinearWeight has an fp32 product.
  std::vector<float> deq(static_cast<size_t>(w.out * w.in));
  if (w.is_packed()) unpack_f4_values(w.packed.data(), 0, w.out * w.in, deq.data());
  else deq = w.w;
  for (int64_t o = 0; o < w.out; ++o) {
    for (int64_t i = 0; i < w.in; ++i) deq[static_cast<size_t>(o * w.in + i)] *= weight_scale(w, o, i / kBlock);
  }
  return plain_linear(x, w, deq, /*to_bf16=*/false);
}

Tensor<float> grouped_linear(const Tensor<float>& x, const LinearWeight& w, int groups) {
  DSV41_CHECK(groups > 0 && w.out % groups == 0 && x.rank() == 2 && x.dim(1) == groups * w.in,
              "grouped_linear '", w.name, "': input '", x.name(), "' ", shape_string(x.shape()), " for ", groups,
              " groups of a [", w.out, ", ", w.in, "] weight");
  DSV41_CHECK(w.dtype == DType::kBF16, "grouped_linear '", w.name, "': a BF16 weight, got ", dtype_name(w.dtype));
  const int64_t T = x.dim(0), width = w.in, r = w.out / groups;
  Tensor<float> y({T, w.out}, w.name + ".y");
  parallel_for(T * groups, [&](int64_t item) {
    const int64_t t = item / groups, g = item % groups;
    const float* xg = x.row(t) + g * width;
    float* yr = y.row(t) + g * r;
    int64_t j = 0;
    for (; j + 4 <= r; j += 4) {  // four outputs side by side, each its own chain
      const float* wrow = w.w.data() + (g * r + j) * width;
      const float* rows[4] = {wrow, wrow + width, wrow + 2 * width, wrow + 3 * width};
      float v[4];
      dot_f64_f32_x4(xg, rows, width, v);
      for (int k = 0; k < 4; ++k) yr[j + k] = round_to_bf16(v[k]);
    }
    for (; j < r; ++j) yr[j] = round_to_bf16(dot_f64_f32(xg, w.w.data() + (g * r + j) * width, width));
  });
  return y;
}

}  // namespace dsv41::reference
