// cuda/linear_fp8_wgmma_pipe.cu: the PIPELINED GEMM of the production fp8 linear (backend `cuda`,
// claim order-variant) ↔ reference/ops/linear.cc (the F8_E4M3 path); docs/cuda.md "Production ops".
//
// The same arithmetic as the serial kernel (cuda/linear_fp8_wgmma.cu), bit for bit:
//   y[t, o] = bf16( sum over K blocks b in order of  wgmma32_b(t, o) * (a_s[t, b] * w_s[o / 32, b]) )
//   wgmma32_b one wgmma m64nNk32 e4m3 from a zero accumulator with the same tile layout and
//   descriptors, promoted by acc = fma(d, a_s w_s, acc) per block in ascending K order. Only the
//   schedule differs: tests/cuda/linear_pipelined_test.cc compares the two kernels' bits.
// The schedule (bench/RESULTS.md, session 14: the serial kernel idles the tensor cores while it
// promotes, the FMA pipe the busiest): two result sets per warpgroup. Block b + 1's wgmma is issued
// into one set, then wgmma.wait_group 1 (block b done, b + 1 in flight), then block b's promotion
// from the other set, so the promotion's FMAs run beside the next block's tensor-core work.
// The next block may sit in the next K stage: the stage barrier then comes before its issue, with
// one wgmma in flight (it reads the current stage, which is not the one refilled).
//
// ptxas -v must not report "wgmma.mma_async instructions are serialized" (C7514): it does when a
// path it cannot rule out reads a result set still in flight (a wgmma under a branch its wait is
// not under, or a result set copied across the K loop; hence the in-out operands and the stage
// loop without branches around a wgmma).
//
// Code tiles (kTma false) by cp.async from every thread (16-byte chunks, zero-filled outside the
// matrix), or (kTma true, `pipelined-tma`) by two bulk tensor copies a stage from thread 0 (tensor
// maps in the same 128-byte swizzle, zeros outside), completing on the stage's mbarrier
// (cuda/tma.cuh); the scales by cp.async either way. Same shared-memory bytes, so the same bits.
//
// Configurations (template <kWG warpgroups, kBN columns, kStages>): CTA kWG * 64 rows x kBN columns,
// K in stages of 128 bytes (4 scale blocks) into the 128-byte swizzle, kStages deep (kStages - 2
// stages in flight while one computes):
//   prefill (T > 64): 2 warpgroups, 128 x 128, 6 stages (211 KB), one CTA per SM, M tiles fastest;
//   decode (T <= 64): 1 warpgroup, 64 rows, so the grid has one CTA per column tile and all SMs
//   stream the weight: 128 columns, 4 stages (2 CTAs an SM) where out / 128 fills the SMs, else
//   64 columns, 8 stages (more of the weight in flight per CTA).
#include <climits>
#include <cstdint>

#include "cuda/bf16_storage.cuh"
#include "cuda/common.cuh"
#include "cuda/fp8_async.cuh"
#include "cuda/fp8_wgmma.cuh"
#include "cuda/kernels.h"
#include "cuda/tensor_core.cuh"
#include "cuda/tma.cuh"

namespace dsv41::gpu {
namespace {

using fp8::cp_async16;
using fp8::cp_async_commit;
using fp8::cp_async_wait;
using fp8::smem_addr;
using fp8::sw128;
using fp8::sw128_desc;
using tc::fence_proxy_async;
using tc::pin;
using tc::wgmma_commit;
using tc::wgmma_fence;

constexpr int kBlock = 32;         // act_quant / scale block along K
constexpr int kBK = 128;           // K bytes per stage
constexpr int kKb = kBK / kBlock;  // scale blocks per stage

template <int kWG, int kBN, int kStages>
struct Config {
  static constexpr int kBM = 64 * kWG;
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kTileA = kBM * kBK;  // bytes: [kBM][128] codes
  static constexpr int kTileB = kBN * kBK;  // bytes: [kBN][128] codes
  static constexpr int kScaleBytes = (kBM * kKb + (kBN / kBlock) * kKb) * 4;
  static constexpr int kStageBytes = ((kTileA + kTileB + kScaleBytes + 1023) / 1024) * 1024;
  static constexpr int kBarOffset = kStages * kStageBytes;  // the stages' mbarriers (the TMA loads)
  static constexpr int kSmemBytes = kBarOffset + 8 * kStages + 1024;  // + alignment slack
  static_assert(kStages >= 3, "the stage barrier waits for stage kt + 1 with kStages - 3 groups pending");
  static_assert(kBM % (kThreads / 8) == 0 && kBN % (kThreads / 8) == 0 && (kThreads / 8) % 8 == 0,
                "whole rows of chunks a thread; row steps of whole 8-row swizzle groups");
  static_assert((kBN / kBlock) * kKb <= kThreads, "one thread per weight scale");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

struct Stage {
  uint8_t* a;  // [kBM][128] activation codes, swizzled
  uint8_t* b;  // [kBN][128] weight codes, swizzled
  float* as;   // [kBM][kKb] activation scales
  float* ws;   // [kBN / 32][kKb] weight scales
};
// The stage buffer slot (0 .. kStages - 1; the stage of K tile kt sits in slot kt % kStages, kept
// as a running slot in the K loop: no 64-bit division).
template <class C>
__device__ inline Stage stage_at(uint8_t* base, int slot) {
  uint8_t* p = base + slot * C::kStageBytes;
  return {p, p + C::kTileA, reinterpret_cast<float*>(p + C::kTileA + C::kTileB),
          reinterpret_cast<float*>(p + C::kTileA + C::kTileB + C::kBM * kKb * 4)};
}

// This thread's share of every stage's operand loads, fixed for the whole K loop (the chunk the
// serial kernel's load gives thread tid, c = it * kThreads + tid: row c / 8, 16-byte chunk c % 8):
// chunk ch = tid % 8 of rows r0 + it * kRowStep, r0 = tid / 8. kRowStep is a multiple of 8, so
// every such row has the same place in its swizzled 8-row group: sw128(r0 + it * kRowStep, ch) =
// sw128(r0, ch) + it * kRowStep * 128. Only the offsets move with the stage: less address work
// per cp.async than recomputing each chunk's row and column.
// The tensor maps of the TMA loads (x codes [T, in], box kBM x 128; w codes [out, in], box kBN x
// 128; both in the 128-byte swizzle); unused by the cp.async loads.
struct TmaMaps {
  CUtensorMap a, b;
};

template <class C, int kBN, bool kTma>
struct Loader {
  static constexpr int kRowStep = C::kThreads / 8;
  int64_t a_off, b_off;    // bytes: row m0 + r0 (n0 + r0) of x (w), column ch * 16
  int64_t a_rows, b_rows;  // rows from r0 on inside the matrix: T - m0 - r0, out - n0 - r0
  int64_t step;            // bytes between rows r0 + it * kRowStep: kRowStep * in
  int dst, col;            // sw128(r0, ch); ch * 16

  __device__ Loader(int64_t T, int64_t out, int64_t in, int64_t m0, int64_t n0) {
    const int tid = static_cast<int>(threadIdx.x), r0 = tid / (kBK / 16), ch = tid % (kBK / 16);
    col = ch * 16;
    dst = sw128(r0, ch);
    a_off = (m0 + r0) * in + col;
    b_off = (n0 + r0) * in + col;
    a_rows = T - m0 - r0;
    b_rows = out - n0 - r0;
    step = kRowStep * in;
  }
  // Stage kt's codes and scales into s (zero outside the matrices), as the serial kernel's load:
  // the codes by cp.async from every thread, or (kTma) by two bulk tensor copies from thread 0 that
  // complete on bar; the scales by cp.async.
  __device__ void load(const Stage& s, uint64_t* bar, const TmaMaps& maps, const uint8_t* __restrict__ xa,
                       const float* __restrict__ xs, const uint8_t* __restrict__ wb, const float* __restrict__ wsc,
                       int64_t T, int64_t out, int64_t in, int64_t m0, int64_t n0, int64_t kt) const {
    const int64_t k0 = kt * kBK;
    if constexpr (kTma) {
      if (threadIdx.x == 0) {
        tma::mbar_arrive_expect_tx(bar, C::kTileA + C::kTileB);
        tma::load_2d(s.a, &maps.a, static_cast<int>(k0), static_cast<int>(m0), bar);
        tma::load_2d(s.b, &maps.b, static_cast<int>(k0), static_cast<int>(n0), bar);
      }
    } else {
      const bool kin = k0 + col < in;
#pragma unroll
      for (int it = 0; it < C::kBM / kRowStep; ++it) {
        const bool ok = kin && it * kRowStep < a_rows;
        cp_async16(s.a + dst + it * kRowStep * 128, ok ? xa + a_off + it * step + k0 : xa, ok ? 16 : 0);
      }
#pragma unroll
      for (int it = 0; it < kBN / kRowStep; ++it) {
        const bool ok = kin && it * kRowStep < b_rows;
        cp_async16(s.b + dst + it * kRowStep * 128, ok ? wb + b_off + it * step + k0 : wb, ok ? 16 : 0);
      }
    }
    fp8::load_stage_scales<C::kBM, kBN, kKb, kBlock, C::kThreads>(s.as, s.ws, xs, wsc, m0, n0, kt * kKb, in / kBlock,
                                                                 T, out, static_cast<int>(threadIdx.x));
  }
};

template <int kWG, int kBN, int kStages, bool kTma>
__global__ void __launch_bounds__(128 * kWG, 1)
    fp8_wgmma_pipe_kernel(const __grid_constant__ TmaMaps maps, const uint8_t* __restrict__ xa,
                          const float* __restrict__ xs, const uint8_t* __restrict__ wb, const float* __restrict__ wsc,
                          int64_t T, int64_t in, int64_t out, float* __restrict__ y) {
  using C = Config<kWG, kBN, kStages>;
  constexpr int kN = kBN / 2;  // result registers a thread: kBN / 8 chunks of 4
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * C::kBM, n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t nkb = in / kBlock, nkt = (in + kBK - 1) / kBK;
  const int wg = static_cast<int>(threadIdx.x) / 128, warp = (static_cast<int>(threadIdx.x) / 32) % 4;
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, tq = lane % 4;
  const int row0 = wg * 64 + warp * 16 + g;  // this thread's rows row0 and row0 + 8 of the CTA tile

  float acc[kN], d0[kN], d1[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = d0[i] = d1[i] = 0.0f;  // d0, d1: in-out operands, values unused

  const Loader<C, kBN, kTma> loader(T, out, in, m0, n0);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kBarOffset);  // [kStages]: stage slot s's codes landed
  uint32_t phases = 0;  // bit s: the parity of the next wait on bars[s]
  const auto wrap = [](int slot) { return slot >= kStages ? slot - kStages : slot; };  // slot < 2 kStages
  const auto load = [&](int64_t kt, int slot) {
    loader.load(stage_at<C>(smem, slot), bars + slot, maps, xa, xs, wb, wsc, T, out, in, m0, n0, kt);
  };
  // Stage slot's codes landed (kTma; with cp.async, each thread's cp.async wait and fence do it).
  const auto wait_codes = [&](int slot) {
    if constexpr (kTma) {
      tma::mbar_wait(bars + slot, (phases >> slot) & 1u);
      phases ^= 1u << slot;
    }
  };
  // Block ks of the stage in slot into d (a fresh wgmma group).
  // The descriptors are sw128_desc of the tiles' addresses, made by adding the tile's offset / 16 to
  // the base's (the start address field holds address / 16 and every offset here is a multiple of
  // 16; shared addresses stay below 2^18, inside the field's 14 bits): the same values, fewer
  // instructions a block.
  const uint64_t desc0 = sw128_desc(smem);
  const auto issue = [&](int slot, int ks, float (&d)[kN]) {
    const uint32_t a_off = static_cast<uint32_t>(slot * C::kStageBytes + wg * 64 * kBK + ks * kBlock);
    const uint32_t b_off = static_cast<uint32_t>(slot * C::kStageBytes + C::kTileA + ks * kBlock);
    wgmma_fence();  // d's registers were read by the previous promotion
    fp8::wgmma_e4m3_inout<kBN>(d, desc0 + (a_off >> 4), desc0 + (b_off >> 4));
    wgmma_commit();
  };
  // acc += d * (a_s w_s) for block ks of stage st, in the serial kernel's operation order.
  const auto promote = [&](const Stage& st, int ks, float (&d)[kN]) {
    pin(d);  // no read of d before the wait above
    const float as0 = st.as[row0 * kKb + ks], as1 = st.as[(row0 + 8) * kKb + ks];
#pragma unroll
    for (int t = 0; t < kBN / kBlock; ++t) {  // the weight scale tiles of the kBN columns
      const float w_s = st.ws[t * kKb + ks];
      const float s0 = as0 * w_s, s1 = as1 * w_s;
#pragma unroll
      for (int j = 4 * t; j < 4 * t + 4; ++j) {  // n8 chunks j of tile t
        acc[4 * j] = __fmaf_rn(d[4 * j], s0, acc[4 * j]);
        acc[4 * j + 1] = __fmaf_rn(d[4 * j + 1], s0, acc[4 * j + 1]);
        acc[4 * j + 2] = __fmaf_rn(d[4 * j + 2], s1, acc[4 * j + 2]);
        acc[4 * j + 3] = __fmaf_rn(d[4 * j + 3], s1, acc[4 * j + 3]);
      }
    }
  };
  // Block ks of stage kt, whose wgmma is in flight in cur, when a block follows it: issue block
  // ks + 1 (of stage kt + 1 after the stage barrier when ks is the stage's last) into nxt, wait for
  // cur, promote it. ks is a constant at each (inlined) call: no branch around a wgmma.
  const auto step = [&](int ks, int64_t kt, int slot, const Stage& st, float (&cur)[kN], float (&nxt)[kN]) {
    if (ks == kKb - 1) {
      // Stage kt + 1 landed for everyone; every wgmma on stage kt - 1 is done (each warpgroup
      // waited for block ks - 1 of stage kt), so its buffer takes stage kt + kStages - 1.
      cp_async_wait<kStages - 3>();
      wait_codes(wrap(slot + 1));
      fence_proxy_async();  // this thread's cp.async bytes -> visible to the tensor cores
      __syncthreads();
      if (kt + kStages - 1 < nkt) load(kt + kStages - 1, wrap(slot + kStages - 1));
      cp_async_commit();
      issue(wrap(slot + 1), 0, nxt);
    } else {
      issue(slot, ks + 1, nxt);
    }
    tc::wgmma_wait<1>();
    promote(st, ks, cur);
  };
  // The last block: wait for cur, promote it.
  const auto finish = [&](int ks, const Stage& st, float (&cur)[kN]) {
    tc::wgmma_wait<0>();
    promote(st, ks, cur);
  };

  if (kTma && threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) tma::mbar_init(bars + s, 1);
    tma::mbar_init_fence();
  }
  if (kTma) __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) load(s, s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  if (nkt > 0) wait_codes(0);
  fence_proxy_async();
  __syncthreads();  // stage 0 landed for everyone
  if (nkt > 0) {  // else (in 0) zeros, as the serial kernel; one region, so ptxas sees every wait
    issue(0, 0, d0);
    int slot = 0;  // kt % kStages
    // The stages before the last: whole, each block has a successor.
    for (int64_t kt = 0; kt + 1 < nkt; ++kt, slot = wrap(slot + 1)) {
      const Stage st = stage_at<C>(smem, slot);
      step(0, kt, slot, st, d0, d1);
      step(1, kt, slot, st, d1, d0);
      step(2, kt, slot, st, d0, d1);
      step(3, kt, slot, st, d1, d0);  // block 0 of stage kt + 1 now in flight in d0
    }
    {  // the last stage: 1 to 4 blocks (uniform branches)
      const int64_t kt = nkt - 1, left = nkb - kt * kKb;
      const Stage st = stage_at<C>(smem, slot);
      if (left == 1) {
        finish(0, st, d0);
      } else {
        step(0, kt, slot, st, d0, d1);
        if (left == 2) {
          finish(1, st, d1);
        } else {
          step(1, kt, slot, st, d1, d0);
          if (left == 3) {
            finish(2, st, d0);
          } else {
            step(2, kt, slot, st, d0, d1);
            finish(3, st, d1);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: bf16 values (the backend's bf16 tensors are fp32 storage).
  fp8::store_bf16_fragment<kBN>(acc, y, T, out, m0 + row0, n0 + tq * 2);
}

// A 2-D tensor map of E4M3 codes [rows, in] (row-major), box box_rows x 128 bytes, 128-byte swizzle
// (the layout sw128 names), zeros outside.
CUtensorMap codes_map(const uint8_t* base, int64_t rows, int64_t in, int box_rows) {
  return tma::encode_2d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, in, box_rows, kBK, CU_TENSOR_MAP_SWIZZLE_128B,
                        "fp8_wgmma_pipelined_linear (codes)");
}

template <int kWG, int kBN, int kStages, bool kTma>
void launch(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in, const uint8_t* w_codes,
            const float* w_scales, int64_t out, float* y) {
  using C = Config<kWG, kBN, kStages>;
  static const bool attr = [] {
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(fp8_wgmma_pipe_kernel<kWG, kBN, kStages, kTma>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)attr;
  DSV41_CHECK((out + kBN - 1) / kBN <= 65535, "fp8_wgmma_pipelined_linear: out ", out, " needs more than 65535 ",
              kBN, "-column tiles");
  TmaMaps maps{};
  if (kTma) {
    maps.a = codes_map(x_codes, T, in, C::kBM);
    maps.b = codes_map(w_codes, out, in, kBN);
  }
  const dim3 grid(static_cast<unsigned>((T + C::kBM - 1) / C::kBM), static_cast<unsigned>((out + kBN - 1) / kBN));
  fp8_wgmma_pipe_kernel<kWG, kBN, kStages, kTma>
      <<<grid, C::kThreads, C::kSmemBytes>>>(maps, x_codes, x_scales, w_codes, w_scales, T, in, out, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

template <bool kTma>
void pipelined(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in, const uint8_t* w_codes,
               const float* w_scales, int64_t out, float* y) {
  if (T == 0 || out == 0) return;
  DSV41_CHECK(in % kBlock == 0, "fp8_wgmma_pipelined_linear: in ", in, " is not a multiple of ", kBlock);
  if (kTma) {  // the copy engine's coordinates are 32-bit; its global addresses 16-byte aligned
    DSV41_CHECK(T <= INT32_MAX && in <= INT32_MAX && out <= INT32_MAX, "fp8_wgmma_pipelined_linear (TMA): T ", T,
                ", in ", in, ", out ", out, " past 2^31");
    DSV41_CHECK(reinterpret_cast<uintptr_t>(x_codes) % 16 == 0 && reinterpret_cast<uintptr_t>(w_codes) % 16 == 0,
                "fp8_wgmma_pipelined_linear (TMA): codes not 16-byte aligned");
  }
  if (T > 64) {
    launch<2, 128, 6, kTma>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  } else if ((out + 127) / 128 >= int64_t{sm_count()}) {
    launch<1, 128, 4, kTma>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  } else {
    launch<1, 64, 8, kTma>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  }
}

}  // namespace

void fp8_wgmma_pipelined_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                                      const uint8_t* w_codes, const float* w_scales, int64_t out, float* y) {
  pipelined<false>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
}

void fp8_wgmma_pipelined_tma_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                                          const uint8_t* w_codes, const float* w_scales, int64_t out, float* y) {
  pipelined<true>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
}

}  // namespace dsv41::gpu
