// cuda/kv_pack.cu
//
// The bandwidth-bound quantize+pack of the two KV cache formats that dominate the cache bytes:
// kWindowKvFp8 (SWA KV: E4M3 codes, E8M0 scale per 32) and kCompressedKvFp4 (main KV: E2M1
// codes, E4M3 scale per 16). gpu::pack_rows (cuda/kv_quant.cu) sends these two formats here for
// fp32 storage; gpu::pack_rows_bf16 (cuda/device.h) is the same kernel on bf16 storage (the
// production format: 2 bytes per input value). BIT-EXACT against formats/qdq.h
// quantize_fp8_block / quantize_compressed_kv_block (and so pack_window_kv / pack_compressed_kv).
//
// Layout: one warp per row, two rows per pass (grid-stride over rows). Lane k of the warp loads
// 16-byte chunks k, k + 32, ... of each row (8 bf16 or 4 fp32 values; four chunks in flight per
// lane, about 64 KB of loads in flight per SM at the 4 blocks of 256 the registers allow), so every
// load and every code store of the warp is contiguous. (Four rows per pass with 3 blocks per SM,
// ~96 KB in flight, measured slower: the packers are instruction-bound, bench/RESULTS.md.) A block of 16 or 32 values spans L = block
// / values-per-chunk lanes; its amax is a max over those lanes (__shfl_xor_sync). The scale byte
// is written by the first lane of the block, the row's finite flag by lane 0 (__all_sync).
// bf16 storage works on the packed words (two values per instruction where the ISA has it): the
// amax as max.u16x2 of |bits|, the FP8 scaling as one bf16x2 multiply per pair, the FP4 compares
// as bf16x2 compares and the code bytes assembled with LOP3 bit-selects and byte permutes (issue
// 17: these kernels are instruction-bound, so the instructions per value are what counts).
//
// Exactness, block by block (amax, finite flag and scale byte are formats/qdq.h's own: the same
// integer max of |bits|, then formats::fp8_scale / compressed_kv_scale):
//   * A non-finite block (NaN or Inf inside) takes the formats statements verbatim: code =
//     encode(clamp(x / s)) with IEEE division.
//   * FP8, finite block: s = 2^(scale - 127) with scale in [104, 247] (the amax floor 1e-4 and
//     amax <= FLT_MAX bound it), so 1/s is a normal power of two and x * (1/s) rounds the same
//     real number x / s does: equal to the division. (bf16 storage multiplies in bf16x2, see
//     Fp8Window::codes: exact too, or a signed zero code either way.) The E4M3 code is the hardware
//     cvt.rn.satfinite.e4m3x2.f32; tests/cuda/kv_quant_vs_reference_test checks that conversion
//     against formats::e4m3_encode_satfinite on all 2^32 inputs (equal everywhere, NaN included).
//   * FP4, finite block: s (an E4M3 value in [2^-9, 448]) is not a power of two, and the official
//     code divides. The E2M1 code of fl(x / s) depends only on where fl(|x| / s) lies against the
//     rounding midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (RNE: a tie goes to the even code,
//     i.e. down at 0.25, 1.25, 2.5, 5 and up at 0.75, 1.75, 3.5). For a midpoint t (exactly
//     representable, even significand), with h = half the fp32 spacing just below t (h') or just
//     above t (h''):
//        fl(q) >= t  <=>  q >= t - h'     (a tie at t - h' rounds to t, the even neighbour)
//        fl(q) >  t  <=>  q >  t + h''    (a tie at t + h'' rounds to t)
//     With q = a / s (a = |x|, s > 0) these are a >= s(t - h') and a > s(t + h''), and for a float
//     a: a >= X <=> a >= RU(X), a > X <=> a > RD(X). s*t is exact (<= 7 significant bits) and
//     RU(s*t - s*h') = fma.rp(-s, h', s*t), RD(s*t + s*h'') = fma.rm(s, h'', s*t) are exact
//     directed roundings of the true bounds (s*h >= 2^-35: no underflow). So the magnitude code is
//     the number of the seven bounds |x| passes, the sign is x's sign bit (E2M1 keeps -0), and the
//     clamp to +-6 changes nothing (fl(q) > 5 already gives the top code 7). No division per
//     element: seven float compares (fp32 storage), or for bf16 storage three bf16x2 compares per
//     pair of values (a binary search over the ordered bounds, each bound truncated to bf16: exact
//     for bf16 inputs, see Fp4Main), the scale and bounds read from per-block shared tables from
//     16384 rows on.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "cuda/bf16_storage.cuh"
#include "cuda/common.cuh"
#include "cuda/kv_pack.h"
#include "cuda/device.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"

namespace dsv41::gpu {

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    DSV41_CUDA_CHECK(cudaGetDevice(&dev));
    DSV41_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms > 0 ? sms : 1;
  }();
  return n;
}

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

// One 16-byte chunk of a row: kVec values, loaded as 4 raw words (bf16: two values per word, the
// first in the low half).
template <class S>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int kVec = 4;
  __device__ static void values(const uint32_t (&w)[4], float (&v)[kVec]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = f32_from_bits(w[k]);
  }
};
template <>
struct Chunk<uint16_t> {
  static constexpr int kVec = 8;
  __device__ static void values(const uint32_t (&w)[4], float (&v)[kVec]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[2 * k] = bf16_lo(w[k]), v[2 * k + 1] = bf16_hi(w[k]);
  }
};

__device__ inline void load_words(const void* p, uint32_t (&w)[4]) {
  const uint4 a = __ldcs(reinterpret_cast<const uint4*>(p));
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
}

__device__ inline __nv_bfloat162 bf16x2_from_bits(uint32_t w) {
  __nv_bfloat162 h;
  std::memcpy(&h, &w, sizeof w);
  return h;
}

__device__ inline uint32_t bf16x2_bits(__nv_bfloat162 h) {
  uint32_t w;
  std::memcpy(&w, &h, sizeof w);
  return w;
}

// Bitwise select: the bits of a where m is set, of b elsewhere, (a & m) | (b & ~m). One LOP3 (LUT
// 0xE4 for the operands a, b, m), written as such: from the plain expression the compiler
// re-associates chains of selects with constant masks into and/or trees of more instructions.
__device__ inline uint32_t bitsel(uint32_t m, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "r"(m));
  return d;
}

// The E4M3 codes of 4 values, byte k = code of a_k: cvt.rn.satfinite.e4m3x2.f32 (the conversion of
// __nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, __NV_E4M3)) twice, the pairs joined in one 32-bit
// register (from the intrinsic's 16-bit results the compiler masks each before joining them).
__device__ inline uint32_t e4m3x4_satfinite(float a0, float a1, float a2, float a3) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
      " mov.b32 %0, {l, h};\n}"
      : "=r"(d)
      : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
  return d;
}

// Stores the N (2, 4 or 8) bytes of `w` (little endian) at p: one store when `aligned` (p % N == 0).
template <int N>
__device__ inline void store_code_bytes(uint8_t* p, bool aligned, uint64_t w) {
  if (aligned) {
    if constexpr (N == 8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(static_cast<uint32_t>(w), static_cast<uint32_t>(w >> 32));
    }
    if constexpr (N == 4) *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(w);
    if constexpr (N == 2) *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = static_cast<uint8_t>(w >> (8 * k));
  }
}

// The bound of each E2M1 rounding midpoint t in |x| units for a block scale s (file comment):
// ">" at 0.25, 1.25, 2.5, 5 (h'' = 2^-26, 2^-24, 2^-23, 2^-22), ">=" at 0.75, 1.75, 3.5 (h' = 2^-25,
// 2^-24, 2^-23). Ascending.
__device__ inline void fp4_bounds(float s, float (&g)[7]) {
  g[0] = __fmaf_rd(s, 0x1p-26f, __fmul_rn(s, 0.25f));
  g[1] = __fmaf_ru(-s, 0x1p-25f, __fmul_rn(s, 0.75f));
  g[2] = __fmaf_rd(s, 0x1p-24f, __fmul_rn(s, 1.25f));
  g[3] = __fmaf_ru(-s, 0x1p-24f, __fmul_rn(s, 1.75f));
  g[4] = __fmaf_rd(s, 0x1p-23f, __fmul_rn(s, 2.5f));
  g[5] = __fmaf_ru(-s, 0x1p-23f, __fmul_rn(s, 3.5f));
  g[6] = __fmaf_rd(s, 0x1p-22f, __fmul_rn(s, 5.0f));
}

// For bf16 values a the seven conditions are all strict bf16 compares a > K: a > G <=> a > RZ_bf16(G)
// and a >= H <=> a > RZ_bf16(pred_f32(H)) (G, H positive floats; RZ_bf16 = the top 16 bits). K as a
// bf16x2 pair (the same bound in both halves).
__device__ inline uint32_t fp4_bf16_bound(const float (&g)[7], int k) {
  const uint32_t kb = (k % 2 == 0 ? f32_bits(g[k]) : f32_bits(g[k]) - 1u) >> 16;
  return kb | (kb << 16);
}

// Shared-memory tables of the bf16-storage FP4 packer, built by every block at its start (36.8 KB):
// the block scale of every bf16 amax bit pattern (Fp4Main::scale_of: formats::compressed_kv_scale,
// for the NaN patterns with their payload, as the integer amax has it) and, per scale byte, the
// seven bf16x2 bounds. They replace a division, an E4M3 encode and the bound arithmetic per chunk.
struct Fp4Tables {
  uint8_t scale[0x8000];  // by the amax's bf16 bits (all 2^15: Inf and NaN too, no branch)
  uint4 bounds[0x7F][2];  // by scale byte (0 .. 0x7E: satfinite codes); words 0..6 used
};

// kWindowKvFp8: 32 values -> E8M0 scale + 32 E4M3 bytes.
struct Fp8Window {
  static constexpr int kBlock = formats::kFp8Block;
  static constexpr int kCodeBits = 8;
  static constexpr bool kBf16Tables = false;
  template <bool kTables>
  __device__ static uint8_t scale(float amax, const Fp4Tables* /*tables*/) { return formats::fp8_scale(amax); }
  // Codes of one chunk (raw words w: V values of storage S). The clamp to +-448 of the formats
  // statement is left out of the finite path: satfinite already gives +-448 (0x7E / 0xFE) for every
  // |v| > 448.
  template <class S, int V, bool kTables>
  __device__ static uint64_t codes(const uint32_t (&w)[4], uint8_t scale, bool finite, const Fp4Tables* /*tables*/) {
    float x[V];
    uint64_t out = 0;
    if (finite) {
      if constexpr (std::is_same_v<S, uint16_t>) {
        // bf16 storage: q = x * 2^(127 - scale) on bf16 pairs (one HMUL2 per pair). Exact where the
        // product is a normal bf16 (>= 2^-126: bf16 shares fp32's exponent range, and multiplying
        // by a power of two changes only the exponent); below that both this and the fp32 product
        // are +-0 or a subnormal of magnitude < 2^-10, whose E4M3 code is the signed zero either
        // way (the sign survives rounding and flushing). No overflow: |x| <= amax <= 448 s.
        // 1/s = 2^(127 - scale) as bf16 bits (254 - scale) << 7 in both halves: one IMAD (no
        // borrow between the halves: scale * 0x80 <= 0x7B80 < 0x7F00).
        const __nv_bfloat162 inv = bf16x2_from_bits(0x7F007F00u - uint32_t{scale} * 0x00800080u);
        uint32_t q[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) q[p] = bf16x2_bits(__hmul2(bf16x2_from_bits(w[p]), inv));
        return uint64_t{e4m3x4_satfinite(bf16_lo(q[0]), bf16_hi(q[0]), bf16_lo(q[1]), bf16_hi(q[1]))} |
               uint64_t{e4m3x4_satfinite(bf16_lo(q[2]), bf16_hi(q[2]), bf16_lo(q[3]), bf16_hi(q[3]))} << 32;
      } else {
        Chunk<S>::values(w, x);
        const float inv = f32_from_bits((254u - scale) << 23);  // 1/s, exact (see the file comment)
#pragma unroll
        for (int i = 0; i < V; i += 2) {
          const float2 q = make_float2(__fmul_rn(x[i], inv), __fmul_rn(x[i + 1], inv));
          out |= uint64_t{__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3)} << (8 * i);
        }
        return out;
      }
    }
    Chunk<S>::values(w, x);  // formats::quantize_fp8_block's statements
    const float s = formats::e8m0_decode(scale);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      out |= uint64_t{formats::e4m3_encode_satfinite(formats::clamp_f32(x[i] / s, -448.0f, 448.0f))} << (8 * i);
    }
    return out;
  }
};

// kCompressedKvFp4: 16 values -> E4M3 scale + 16 E2M1 nibbles (element 2k in the low nibble).
struct Fp4Main {
  static constexpr int kBlock = formats::kCompressedKvBlock;
  static constexpr int kCodeBits = 4;
  static constexpr bool kBf16Tables = true;
  // formats::compressed_kv_scale with its E4M3 encoder as the hardware cvt (equal on all 2^32
  // inputs: see Fp8Window); from the table when the kernel has one.
  __device__ static uint8_t scale_of(float amax) {
    const float floored = formats::max_f32(amax, f32_from_bits(formats::kCompressedKvAmaxFloorBits));
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(floored / 6.0f, __NV_SATFINITE, __NV_E4M3));
  }
  template <bool kTables>
  __device__ static uint8_t scale(float amax, const Fp4Tables* tables) {
    if constexpr (kTables) {
      return tables->scale[f32_bits(amax) >> 16];  // amax: a bf16 value (bf16 storage)
    } else {
      (void)tables;
      return scale_of(amax);
    }
  }
  template <class S, int V, bool kTables>
  __device__ static uint64_t codes(const uint32_t (&w)[4], uint8_t scale, bool finite, const Fp4Tables* tables) {
    float x[V];
    uint64_t out = 0;
    if (!finite) {  // formats::quantize_compressed_kv_block's statements
      Chunk<S>::values(w, x);
      const float s = formats::e4m3_decode(scale);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        out |= uint64_t{formats::e2m1_encode(formats::clamp_f32(x[i] / s, -6.0f, 6.0f)) & 0xFu} << (4 * i);
      }
      return out;
    }
    if constexpr (std::is_same_v<S, uint16_t>) {
      // bf16 storage: two values per compare against the table's bf16x2 bounds K0 < ... < K6; the
      // magnitude code m = #{k: a > Kk} by binary search on its bits (a > K3: bit 2; then K5 or
      // K1: bit 1; then K6, K4, K2 or K0: bit 0), per half with mask selects.
      uint32_t k[7];
      if constexpr (kTables) {
        const uint4 b0 = tables->bounds[scale][0], b1 = tables->bounds[scale][1];
        k[0] = b0.x, k[1] = b0.y, k[2] = b0.z, k[3] = b0.w, k[4] = b1.x, k[5] = b1.y, k[6] = b1.z;
      } else {  // a few rows (decode): the table would cost more than it saves
        float g[7];
        fp4_bounds(__half2float(__half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3))), g);  // s exact
#pragma unroll
        for (int i = 0; i < 7; ++i) k[i] = fp4_bf16_bound(g, i);
      }
      // The compare word P_j = pw[j] holds elements j (low half) and j + 4 (high half). Per P_j
      // three bit-selects (LOP3, constant masks) put the codes into the high nibbles of its bytes
      // 1 and 3 (bits 12..15 and 28..31: c1, c2, c4 below the sign bit, which is already there);
      // two byte permutes then gather the even elements' and the odd elements' nibbles, and one
      // shift and one select give byte k = code(2k) | code(2k + 1) << 4.
      const uint32_t pw[4] = {__byte_perm(w[0], w[2], 0x5410), __byte_perm(w[0], w[2], 0x7632),
                              __byte_perm(w[1], w[3], 0x5410), __byte_perm(w[1], w[3], 0x7632)};
      uint32_t z[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 a2 = bf16x2_from_bits(pw[j] & 0x7FFF7FFFu);  // |P_j|
        const uint32_t c4 = __hgt2_mask(a2, bf16x2_from_bits(k[3]));
        const uint32_t hi = bitsel(c4, k[6], k[2]), lo = bitsel(c4, k[4], k[0]);  // by c2 below
        const uint32_t c2 = __hgt2_mask(a2, bf16x2_from_bits(bitsel(c4, k[5], k[1])));
        const uint32_t c1 = __hgt2_mask(a2, bf16x2_from_bits(bitsel(c2, hi, lo)));
        uint32_t t = bitsel(0x10001000u, c1, c2);  // bits 12, 28: c1; 13, 29: c2
        t = bitsel(0x30003000u, t, c4);            // 14, 30: c4
        z[j] = bitsel(0x70007000u, t, pw[j]);      // 15, 31: the sign
      }
      const uint32_t even = __byte_perm(z[0], z[2], 0x7351);  // elements 0, 2, 4, 6 (high nibbles)
      const uint32_t odd = __byte_perm(z[1], z[3], 0x7351);   // elements 1, 3, 5, 7
      out = bitsel(0x0F0F0F0Fu, even >> 4, odd);
    } else {
      // fp32 storage: one float compare per bound (the value need not be bf16).
      Chunk<S>::values(w, x);
      float g[7];
      fp4_bounds(__half2float(__half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3))), g);  // s exact
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const uint32_t b = f32_bits(x[i]);
        const float a = f32_from_bits(b & 0x7FFFFFFFu);
        const uint32_t m = (a > g[0]) + (a >= g[1]) + (a > g[2]) + (a >= g[3]) + (a > g[4]) + (a >= g[5]) + (a > g[6]);
        out |= uint64_t{((b >> 28) & 0x8u) | m} << (4 * i);
      }
    }
    return out;
  }
};

__device__ void build_fp4_tables(Fp4Tables& t) {
  for (int i = static_cast<int>(threadIdx.x); i < 0x8000; i += static_cast<int>(blockDim.x)) {
    t.scale[i] = Fp4Main::scale_of(f32_from_bits(static_cast<uint32_t>(i) << 16));
  }
  for (int sc = static_cast<int>(threadIdx.x); sc < 0x7F; sc += static_cast<int>(blockDim.x)) {
    float g[7];
    fp4_bounds(formats::e4m3_decode(static_cast<uint32_t>(sc)), g);
    t.bounds[sc][0] =
        make_uint4(fp4_bf16_bound(g, 0), fp4_bf16_bound(g, 1), fp4_bf16_bound(g, 2), fp4_bf16_bound(g, 3));
    t.bounds[sc][1] = make_uint4(fp4_bf16_bound(g, 4), fp4_bf16_bound(g, 5), fp4_bf16_bound(g, 6), 0u);
  }
}

// x: [rows, dim] (S storage, 16-byte aligned, dim % Q::kBlock == 0) -> out: [rows, entry] bytes
// (formats/packed.h layout), finite: [rows].
template <class S, class Q, bool kTables, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    fast_pack_kernel(const S* __restrict__ x, int64_t rows, int dim, uint8_t* __restrict__ out,
                     uint8_t* __restrict__ finite) {
  constexpr int V = Chunk<S>::kVec;
  constexpr int L = Q::kBlock / V;                  // lanes per block
  constexpr int kCodeBytes = V * Q::kCodeBits / 8;  // code bytes per chunk
  constexpr int kUnroll = 2;                        // chunks per row and pass
  constexpr int kRows = 2;                          // rows per warp and pass: 4 loads in flight
  static_assert(L >= 1 && (L & (L - 1)) == 0 && L <= 32, "a block spans a power-of-two lane group");
  const Fp4Tables* tables = nullptr;
  if constexpr (kTables) {
    static_assert(Q::kBf16Tables && std::is_same_v<S, uint16_t>, "the tables are the bf16 FP4 packer's");
    __shared__ Fp4Tables shared_tables;
    build_fp4_tables(shared_tables);
    __syncthreads();
    tables = &shared_tables;
  }
  // Index math: 64-bit row bases (advanced by a fixed stride per pass), 32-bit unsigned offsets
  // within a row (a row has < 2^31 bytes: dim is an int).
  const unsigned lane = threadIdx.x & 31u;
  const unsigned chunks = static_cast<unsigned>(dim) / V;                      // per row; a multiple of L
  const unsigned value_bytes = static_cast<unsigned>(dim) * Q::kCodeBits / 8;  // the codes part of an entry
  const int64_t entry = value_bytes + static_cast<unsigned>(dim) / Q::kBlock;
  const int64_t nwarps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  int64_t row0 = ((int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5) * kRows;
  const S* xr0 = x + row0 * dim;
  uint8_t* er0 = out + row0 * entry;
  for (; row0 < rows; row0 += nwarps * kRows, xr0 += nwarps * kRows * dim, er0 += nwarps * kRows * entry) {
    uint32_t row_amax[kRows];  // max of the blocks' amax bits: the row is finite iff < 0x7F800000
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_amax[r] = 0;
    for (unsigned j0 = 0; j0 < chunks; j0 += 32 * kUnroll) {
      uint32_t raw[kRows][kUnroll][4] = {};
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const unsigned j = j0 + 32 * u + lane;
          if (row0 + r < rows && j < chunks) load_words(xr0 + static_cast<int64_t>(r) * dim + j * V, raw[r][u]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (row0 + r >= rows) break;  // warp-uniform
        uint8_t* er = er0 + r * entry;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const unsigned j = j0 + 32 * u + lane;
          if (j0 + 32 * u >= chunks) break;  // warp-uniform
          // formats::block_amax: the max of |bits| over the block. bf16 storage: per 16-bit half
          // (max.u16x2 on |bits| words, exact: the same integer max, NaN payloads included), the
          // halves combined at the end; fp32: per value. A lane past the
          // row's chunks (whole blocks: L divides the chunks of a row) holds zeros and stores
          // nothing.
          uint32_t amax = 0;
          if constexpr (std::is_same_v<S, uint16_t>) {
            uint32_t aw[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) aw[k] = raw[r][u][k] & 0x7FFF7FFFu;
            uint32_t m2 = __vmaxu2(__vmaxu2(aw[0], aw[1]), __vmaxu2(aw[2], aw[3]));
#pragma unroll
            for (int o = 1; o < L; o <<= 1) m2 = __vmaxu2(m2, __shfl_xor_sync(kFull, m2, o));
            amax = max(m2 & 0xFFFFu, m2 >> 16) << 16;
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) amax = max(amax, raw[r][u][k] & 0x7FFFFFFFu);
#pragma unroll
            for (int o = 1; o < L; o <<= 1) amax = max(amax, __shfl_xor_sync(kFull, amax, o));
          }
          row_amax[r] = max(row_amax[r], amax);
          const bool block_finite = amax < 0x7F800000u;
          const uint8_t scale = Q::template scale<kTables>(f32_from_bits(amax), tables);
          // Every block of the warp finite (the common case): the finite code path, a warp-uniform
          // branch; otherwise each block its own path (formats statements for a non-finite one).
          const uint64_t codes = __all_sync(kFull, block_finite)
                                     ? Q::template codes<S, V, kTables>(raw[r][u], scale, true, tables)
                                     : Q::template codes<S, V, kTables>(raw[r][u], scale, block_finite, tables);
          if (j < chunks) {
            store_code_bytes<kCodeBytes>(er + j * kCodeBytes, kAligned, codes);
            if (lane % L == 0) er[value_bytes + j / L] = scale;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row0 + r >= rows) break;
      const bool row_ok = __all_sync(kFull, row_amax[r] < 0x7F800000u);
      if (lane == 0) finite[row0 + r] = row_ok ? 1 : 0;
    }
  }
}

// One launch of fast_pack_kernel<S, Q, kTables, kAligned> on `blocks` blocks.
template <class S, class Q, bool kTables>
void launch_kernel(int64_t blocks, const S* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite, void* stream) {
  constexpr int kCodeBytes = Chunk<S>::kVec * Q::kCodeBits / 8;
  const int64_t entry = int64_t{dim} * Q::kCodeBits / 8 + dim / Q::kBlock;
  // kAligned: every chunk's code bytes are aligned for one store (entries and `out` aligned).
  const bool aligned = reinterpret_cast<uintptr_t>(out) % kCodeBytes == 0 && entry % kCodeBytes == 0;
  const auto kernel = aligned ? fast_pack_kernel<S, Q, kTables, true> : fast_pack_kernel<S, Q, kTables, false>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(x, rows, dim, out, finite);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

template <class S, class Q>
void launch_fast_pack(const S* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite, void* stream) {
  DSV41_CHECK(aligned16(x), "gpu::pack_rows: x must be 16-byte aligned");
  DSV41_CHECK(dim > 0 && dim % Q::kBlock == 0, "gpu::pack_rows: dim ", dim, " is not a multiple of ", Q::kBlock);
  if (rows == 0) return;
  const int64_t rows_per_block = kThreads / 32 * 2;  // kRows
  const int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  constexpr int64_t per_sm = 16;
  if constexpr (Q::kBf16Tables && std::is_same_v<S, uint16_t>) {
    // The table variant: one resident wave of blocks (each builds its tables once), with the
    // shared-memory carveout at its maximum so that the register limit, not the 37 KB of tables,
    // decides how many blocks an SM holds. Only for enough rows to pay for the tables.
    if (rows >= 16384) {
      static const int resident = [] {
        int fewest = 0;
        for (const auto kernel : {fast_pack_kernel<S, Q, true, true>, fast_pack_kernel<S, Q, true, false>}) {
          DSV41_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                static_cast<int>(cudaSharedmemCarveoutMaxShared)));
          int n = 0;
          DSV41_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
          fewest = fewest == 0 ? n : std::min(fewest, n);
        }
        return fewest > 0 ? fewest : 1;
      }();
      launch_kernel<S, Q, true>(std::min<int64_t>(wanted, int64_t{sm_count()} * resident), x, rows, dim, out, finite,
                                stream);
      return;
    }
  }
  launch_kernel<S, Q, false>(std::min<int64_t>(wanted, int64_t{sm_count()} * per_sm), x, rows, dim, out, finite,
                             stream);
}

template <class S>
bool dispatch_fast_pack(formats::CacheFormat f, const S* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite,
                        void* stream) {
  switch (f) {
    case formats::CacheFormat::kWindowKvFp8:
      launch_fast_pack<S, Fp8Window>(x, rows, dim, out, finite, stream);
      return true;
    case formats::CacheFormat::kCompressedKvFp4:
      launch_fast_pack<S, Fp4Main>(x, rows, dim, out, finite, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace

bool pack_rows_fast(formats::CacheFormat f, const float* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite,
                    void* stream) {
  return dispatch_fast_pack<float>(f, x, rows, dim, out, finite, stream);
}

void pack_rows_bf16(formats::CacheFormat f, const uint16_t* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite,
                    void* stream) {
  DSV41_CHECK(rows >= 0, "gpu::pack_rows_bf16: rows must be >= 0, got ", rows);
  (void)formats::entry_bytes(f, dim);  // throws for a dim the format rejects
  DSV41_CHECK(dim % 8 == 0, "gpu::pack_rows_bf16: dim must be a multiple of 8, got ", dim);
  DSV41_CHECK(dispatch_fast_pack<uint16_t>(f, x, rows, dim, out, finite, stream), "gpu::pack_rows_bf16: format ",
              formats::info(f).name, " has no bf16-storage packer (kWindowKvFp8 and kCompressedKvFp4 do)");
}

namespace {
__global__ void narrow_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ y) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = static_cast<uint16_t>(formats::bf16_encode(x[i]));
  }
}
}  // namespace

void to_bf16_storage(const float* x, int64_t n, uint16_t* y, void* stream) {
  DSV41_CHECK(n >= 0, "gpu::to_bf16_storage: n must be >= 0, got ", n);
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{sm_count()} * 32);
  narrow_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(x, n, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
