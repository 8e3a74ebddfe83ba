// cuda/indexer_mma.cuh: the device pieces both indexer kernels share (included by cuda/indexer.cu,
// the exact twin's index_scores, and cuda/index_select.cu, the production fused indexer): the
// exact int8 encoding of a row (v = c * 2^e, |c| <= 127; cuda/indexer.cu's header comment proves
// what it keeps exact) and the int8 mma.sync m16n8k32 steps whose accumulators start at kBias.
#pragma once

#include <climits>
#include <cstdint>

namespace dsv41::gpu::indexer_mma {

constexpr int kSlotD = 128;      // channel slots of an encoded row (d <= 128)
constexpr int kEBound = 30;      // |e| of an encoded row
constexpr int kWExpBound = 40;   // w = 0 or 2^-40 <= |w| < 2^41

__device__ inline float exp2i(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }  // |e| <= 126

// Encodes one row of up to 128 values, 4 per lane (lane L holds slots 4L .. 4L+3, zero padded):
// codes[i] = v[i] / 2^e, see the top of cuda/indexer.cu. Returns whether the row is encoded (warp-uniform);
// *e_out is its exponent (0 when not encoded).
__device__ inline bool indexer_row_encode(const float (&v)[4], char4* codes, int* e_out) {
  bool ok = true;
  int lsb[4];
  uint32_t odd[4];
  int emin = INT_MAX;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t bits = __float_as_uint(v[i]) & 0x7FFFFFFFu;
    lsb[i] = INT_MAX;
    odd[i] = 0;
    if (bits >= 0x7F800000u) {
      ok = false;
    } else if (bits != 0) {
      const uint32_t ex = bits >> 23, m = bits & 0x7FFFFFu;
      const uint32_t sig = ex != 0 ? (m | 0x800000u) : m;
      const int tz = __ffs(static_cast<int>(sig)) - 1;
      lsb[i] = (ex != 0 ? static_cast<int>(ex) - 150 : -149) + tz;
      odd[i] = sig >> tz;
      emin = min(emin, lsb[i]);
    }
  }
  emin = __reduce_min_sync(0xFFFFFFFFu, emin);
  if (emin == INT_MAX) emin = 0;  // an all-zero row
  ok = ok && emin >= -kEBound && emin <= kEBound;
  int c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    c[i] = 0;
    if (lsb[i] != INT_MAX) {
      const int sh = lsb[i] - emin;  // >= 0
      if (sh > 6 || (odd[i] << sh) > 127u) {
        ok = false;
      } else {
        const int mag = static_cast<int>(odd[i] << sh);
        c[i] = v[i] < 0.0f ? -mag : mag;
      }
    }
  }
  *codes = make_char4(static_cast<signed char>(c[0]), static_cast<signed char>(c[1]), static_cast<signed char>(c[2]),
                      static_cast<signed char>(c[3]));
  ok = __all_sync(0xFFFFFFFFu, ok);
  *e_out = ok ? emin : 0;
  return ok;
}

// The head weight of an encoded query row of exponent e: w must be a bf16 value (so bf16(I) * w' is
// exact in fp32 and one bf16 FMA rounds it alike), 0 or 2^-40 <= |w| < 2^41. Returns the top 16 bits
// of w' = w 2^e (exact; its bf16 pattern, sign in bit 15), or 0 with *ok cleared when w does not
// qualify or *ok was already false.
__device__ inline uint32_t indexer_weight_code(float wv, int e, bool* ok) {
  const uint32_t wb = __float_as_uint(wv) & 0x7FFFFFFFu;
  const int we = static_cast<int>(wb >> 23) - 127;
  *ok = *ok && (wb & 0xFFFFu) == 0 && (wb == 0 || (wb < 0x7F800000u && we >= -kWExpBound && we <= kWExpBound));
  return *ok ? __float_as_uint(__fmul_rn(wv, exp2i(e))) >> 16 : 0u;
}

// v = values 4 lane .. 4 lane + 3 of a row of d values (zeros past d, or everywhere when !live).
__device__ inline void load_row(const float* __restrict__ row, bool live, int64_t d, int lane, float (&v)[4]) {
  if (live && d == kSlotD && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const float4 x = __ldcs(reinterpret_cast<const float4*>(row) + lane);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane * 4 + i;
    v[i] = live && c < d ? row[c] : 0.0f;
  }
}

__device__ inline void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The accumulators start at the bits of 1.5 * 2^23 (kBias), so acc = those bits + I with |I| < 2^21:
// the float 1.5 * 2^23 + I exactly.
constexpr int kBias = 0x4B400000;

// c = a b + kBias (the first k-step: the bias comes in as the C operand, no initialisation).
__device__ inline void mma_s8_first(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kBias));
}

}  // namespace dsv41::gpu::indexer_mma
