// cuda/linear_fp8_mma.cu: the activation quantisation of the PRODUCTION fp8 linear (backend `cuda`,
// claim order-variant; the GEMM is cuda/linear_fp8_wgmma.cu) and its first GEMM, kept as a variant
// for comparison (bench/fp8_linear_bench.cc) and as the mma.sync side of the tensor-core probe
// (tests/cuda/linear_production_test.cc) ↔ reference/ops/linear.cc (the F8_E4M3 path).
//
//   act_quant per 32-block exactly as the reference (formats::quantize_fp8_block): x bf16 ->
//   E4M3 bytes + one E8M0 scale per (row, 32 of K); the weight's E4M3 values as bytes (encoded
//   once per prepared weight).
//   The mma.sync variant: y[t, o] = bf16( sum over K blocks b in order of mma32_b(t, o) *
//   (a_s[t, b] * w_s[o / 32, b]) ), mma32_b one mma.sync m16n8k32 e4m3 with C = 0 per 32-wide
//   block, promoted to an fp32 CUDA-core accumulator per block in K order (the reference's outer
//   loop). Measured on an H100 (bench/RESULTS.md): 225 TFLOP/s at 4096 x 5120 x 24576 (11% of the
//   fp8 peak), and its block dots keep every bit of the products (the probe): the wgmma kernel
//   replaced it.
//   Tiling: CTA 128 x 128 outputs, 256 threads (8 warps, 2 along M x 4 along N, warp tile 64 x 32,
//   so a warp's 32 columns share one weight scale tile); K in stages of 128 (4 scale blocks), 3
//   stages of cp.async (zero-filled outside the matrix), rows padded to 144 bytes so the fragment
//   loads are conflict free (row r, word w -> bank (4 r + w) mod 32).
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp8_async.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"

namespace dsv41::gpu {
namespace {

constexpr int kBlock = 32;        // act_quant / scale block along K
constexpr int kBM = 128, kBN = 128, kBK = 128;
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kPitch = kBK + 16;  // bytes per smem row (conflict-free fragment loads)
constexpr int kKb = kBK / kBlock; // scale blocks per stage
constexpr int kTileBytes = kBM * kPitch;
constexpr int kStageBytes = 2 * kTileBytes + (kBM * kKb + (kBN / kBlock) * kKb) * 4;
constexpr int kSmemBytes = kStages * kStageBytes;

__device__ inline bool is_bf16_value(float v) { return v != v || formats::round_to_bf16(v) == v; }

// One thread per (row, 32-block) of x [T, in]: codes [T, in] E4M3 bytes, scales [T, in/32] E8M0 values.
__global__ void act_quant_codes_kernel(const float* __restrict__ x, int64_t T, int64_t in, uint8_t* __restrict__ codes,
                                       float* __restrict__ scales, int* __restrict__ status) {
  const int64_t nkb = in / kBlock;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * nkb) return;
  const float* xb = x + k * kBlock;
  bool ok = true;
  for (int i = 0; i < kBlock; ++i) ok = ok && is_bf16_value(xb[i]);
  uint8_t scale = 0;
  alignas(16) uint8_t c[kBlock];
  ok = formats::quantize_fp8_block(xb, &scale, c) && ok;
  if (!ok) atomicExch(status, 1);
  scales[k] = formats::e8m0_decode(scale);
  uint4* dst = reinterpret_cast<uint4*>(codes + k * kBlock);
  const uint4* src = reinterpret_cast<const uint4*>(c);
  dst[0] = src[0];
  dst[1] = src[1];
}

// E4M3 values (exact) -> their codes.
__global__ void encode_e4m3_kernel(const float* __restrict__ v, int64_t n, uint8_t* __restrict__ codes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) codes[i] = static_cast<uint8_t>(formats::E4M3::encode(v[i]));
}

using fp8::cp_async16;
using fp8::cp_async4;
using fp8::cp_async_commit;
using fp8::cp_async_wait;

// d = a b (C = 0): one 16 x 8 x 32 e4m3 product, fp32 out (the tensor core's own accumulation).
__device__ inline void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

struct Smem {
  uint8_t* a;   // [kBM][kPitch] activation codes
  uint8_t* b;   // [kBN][kPitch] weight codes
  float* as;    // [kBM][kKb] activation scales
  float* ws;    // [kBN / 32][kKb] weight scales
};
__device__ inline Smem stage_at(uint8_t* base, int s) {
  uint8_t* p = base + s * kStageBytes;
  return {p, p + kTileBytes, reinterpret_cast<float*>(p + 2 * kTileBytes),
          reinterpret_cast<float*>(p + 2 * kTileBytes + kBM * kKb * 4)};
}

// Stage k-tile kt: rows m0.. of A, n0.. of B, their scales; zero outside the matrix.
__device__ inline void load_stage(const Smem& s, const uint8_t* __restrict__ xa, const float* __restrict__ xs,
                                  const uint8_t* __restrict__ wb, const float* __restrict__ wsc, int64_t T,
                                  int64_t out, int64_t in, int64_t m0, int64_t n0, int64_t kt) {
  const int64_t nkb = in / kBlock, k0 = kt * kBK, kb0 = kt * kKb;
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int it = 0; it < kBM * (kBK / 16) / kThreads; ++it) {  // A and B: 1024 chunks each
    const int c = it * kThreads + tid, r = c / (kBK / 16), col = (c % (kBK / 16)) * 16;
    const bool kin = k0 + col < in;
    const int64_t ta = m0 + r, ob = n0 + r;
    const bool ina = kin && ta < T, inb = kin && ob < out;
    cp_async16(s.a + r * kPitch + col, ina ? xa + ta * in + k0 + col : xa, ina ? 16 : 0);
    cp_async16(s.b + r * kPitch + col, inb ? wb + ob * in + k0 + col : wb, inb ? 16 : 0);
  }
  fp8::load_stage_scales<kBM, kBN, kKb, kBlock, kThreads>(s.as, s.ws, xs, wsc, m0, n0, kb0, nkb, T, out, tid);
}

__global__ void __launch_bounds__(kThreads, 1)
    fp8_mma_linear_kernel(const uint8_t* __restrict__ xa, const float* __restrict__ xs, const uint8_t* __restrict__ wb,
                          const float* __restrict__ wsc, int64_t T, int64_t in, int64_t out, float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t nkb = in / kBlock, nkt = (in + kBK - 1) / kBK;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile rows wm*64.., cols wn*32..
  const int g = lane / 4, tq = lane % 4;

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) load_stage(stage_at(smem, s), xa, xs, wb, wsc, T, out, in, m0, n0, s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < nkt; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt - 1 is free to refill
    {
      const int64_t next = kt + kStages - 1;
      if (next < nkt) load_stage(stage_at(smem, static_cast<int>(next % kStages)), xa, xs, wb, wsc, T, out, in, m0, n0, next);
      cp_async_commit();
    }
    const Smem s = stage_at(smem, static_cast<int>(kt % kStages));
#pragma unroll
    for (int ks = 0; ks < kKb; ++ks) {
      if (kt * kKb + ks >= nkb) break;  // uniform: K ends inside this stage
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* p = s.a + (wm * 64 + i * 16 + g) * kPitch + ks * kBlock + tq * 4;
        a[i][0] = *reinterpret_cast<const uint32_t*>(p);
        a[i][1] = *reinterpret_cast<const uint32_t*>(p + 8 * kPitch);
        a[i][2] = *reinterpret_cast<const uint32_t*>(p + 16);
        a[i][3] = *reinterpret_cast<const uint32_t*>(p + 8 * kPitch + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t* p = s.b + (wn * 32 + j * 8 + g) * kPitch + ks * kBlock + tq * 4;
        b[j][0] = *reinterpret_cast<const uint32_t*>(p);
        b[j][1] = *reinterpret_cast<const uint32_t*>(p + 16);
      }
      // The two E8M0 scales multiply exactly (a power of two, inside fp32's normal range for any
      // real checkpoint; docs/cuda.md), so fma(d, a_s w_s, acc) = acc + (d a_s) w_s rounded once.
      const float w_s = s.ws[wn * kKb + ks];
      float sc[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[i][0] = s.as[(wm * 64 + i * 16 + g) * kKb + ks] * w_s;
        sc[i][1] = s.as[(wm * 64 + i * 16 + g + 8) * kKb + ks] * w_s;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float d[4];
          mma_e4m3(d, a[i], b[j][0], b[j][1]);
          acc[i][j][0] = __fmaf_rn(d[0], sc[i][0], acc[i][j][0]);
          acc[i][j][1] = __fmaf_rn(d[1], sc[i][0], acc[i][j][1]);
          acc[i][j][2] = __fmaf_rn(d[2], sc[i][1], acc[i][j][2]);
          acc[i][j][3] = __fmaf_rn(d[3], sc[i][1], acc[i][j][3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: bf16 values (the backend's bf16 tensors are fp32 storage).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = m0 + wm * 64 + i * 16 + g + h * 8;
      if (t >= T) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t o = n0 + wn * 32 + j * 8 + tq * 2;
        const float v0 = formats::round_to_bf16(acc[i][j][2 * h]), v1 = formats::round_to_bf16(acc[i][j][2 * h + 1]);
        float* dst = y + t * out + o;
        if (o + 1 < out && out % 2 == 0) {
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          if (o < out) dst[0] = v0;
          if (o + 1 < out) dst[1] = v1;
        }
      }
    }
  }
}

}  // namespace

void encode_e4m3(const float* values, int64_t n, uint8_t* codes) {
  if (n == 0) return;
  encode_e4m3_kernel<<<grid_for(n, 256), 256>>>(values, n, codes);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void act_quant_codes_async(const float* x, int64_t T, int64_t in, uint8_t* codes, float* scales, int* status) {
  if (T == 0) return;
  act_quant_codes_kernel<<<grid_for(T * (in / kBlock), 128), 128>>>(x, T, in, codes, scales, status);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

int act_quant_codes(const float* x, int64_t T, int64_t in, uint8_t* codes, float* scales) {
  if (T == 0) return 0;
  int* status = static_cast<int*>(device_alloc(sizeof(int)));
  DSV41_CUDA_CHECK(cudaMemsetAsync(status, 0, sizeof(int)));
  act_quant_codes_async(x, T, in, codes, scales, status);
  int r = 0;
  copy_to_host(&r, status, sizeof(int));
  device_free(status);
  return r;
}

void fp8_mma_sync_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                               const uint8_t* w_codes, const float* w_scales, int64_t out, float* y) {
  if (T == 0 || out == 0) return;
  DSV41_CHECK(in % kBlock == 0, "fp8_mma_linear: in ", in, " is not a multiple of ", kBlock);
  static bool attr = [] {
    DSV41_CUDA_CHECK(
        cudaFuncSetAttribute(fp8_mma_linear_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>((out + kBN - 1) / kBN), static_cast<unsigned>((T + kBM - 1) / kBM));
  fp8_mma_linear_kernel<<<grid, kThreads, kSmemBytes>>>(x_codes, x_scales, w_codes, w_scales, T, in, out, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

int fp8_mma_linear(const float* x, int64_t T, int64_t in, const uint8_t* w_codes, const float* w_scales, int64_t out,
                   float* y) {
  if (T == 0) return 0;
  uint8_t* codes = static_cast<uint8_t*>(device_alloc(static_cast<size_t>(T * in)));
  float* scales = static_cast<float*>(device_alloc(static_cast<size_t>(T * (in / kBlock)) * sizeof(float)));
  const int status = act_quant_codes(x, T, in, codes, scales);
  if (status == 0) fp8_mma_linear_codes(codes, scales, T, in, w_codes, w_scales, out, y);
  device_free(codes);
  device_free(scales);
  return status;
}

void fp8_mma_linear_async(const float* x, int64_t T, int64_t in, const uint8_t* w_codes, const float* w_scales,
                          int64_t out, float* y, int* status) {
  if (T == 0) return;
  uint8_t* codes = static_cast<uint8_t*>(device_alloc(static_cast<size_t>(T * in)));
  float* scales = static_cast<float*>(device_alloc(static_cast<size_t>(T * (in / kBlock)) * sizeof(float)));
  act_quant_codes_async(x, T, in, codes, scales, status);
  fp8_mma_linear_codes(codes, scales, T, in, w_codes, w_scales, out, y);
  device_free(codes);  // stream-ordered: after the GEMM
  device_free(scales);
}

// The mma.sync side of the probe of tests/cuda/linear_production_test.cc: per 16 rows of a, one
// m16n8k32 e4m3 mma with C = 0. a [64, 32], b [8, 32] E4M3 codes (K contiguous) -> d [64, 8] fp32.
__global__ void mma_sync_probe_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                                      float* __restrict__ d) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, tq = lane % 4;
  const auto word = [](const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
  };
  for (int m = 0; m < 4; ++m) {
    const uint8_t* am = a + m * 16 * 32;
    uint32_t af[4] = {word(am + g * 32 + tq * 4), word(am + (g + 8) * 32 + tq * 4), word(am + g * 32 + 16 + tq * 4),
                      word(am + (g + 8) * 32 + 16 + tq * 4)};
    float r[4];
    mma_e4m3(r, af, word(b + g * 32 + tq * 4), word(b + g * 32 + 16 + tq * 4));
    float* dm = d + m * 16 * 8;
    dm[g * 8 + tq * 2] = r[0];
    dm[g * 8 + tq * 2 + 1] = r[1];
    dm[(g + 8) * 8 + tq * 2] = r[2];
    dm[(g + 8) * 8 + tq * 2 + 1] = r[3];
  }
}

void fp8_mma_sync_probe(const uint8_t* a, const uint8_t* b, float* d) {
  mma_sync_probe_kernel<<<1, 32>>>(a, b, d);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
