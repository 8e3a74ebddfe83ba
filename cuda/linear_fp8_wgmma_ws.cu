// cuda/linear_fp8_wgmma_ws.cu: the WARP-SPECIALIZED GEMM of the production fp8 linear (backend `cuda`,
// claim order-variant; DSV41_FP8_LINEAR_KERNEL=ws) ↔ reference/ops/linear.cc (the F8_E4M3 path);
// docs/cuda.md "Production ops".
//
// The same arithmetic as the serial kernel (cuda/linear_fp8_wgmma.cu), bit for bit:
//   y[t, o] = bf16( sum over K blocks b in order of  wgmma32_b(t, o) * (a_s[t, b] * w_s[o / 32, b]) )
//   one wgmma m64nNk32 e4m3 per block from a zero accumulator with the same tile layout and
//   descriptors, promoted by acc = fma(d, a_s w_s, acc) per block in ascending K order.
//   The scale product a_s w_s is one fp32 multiply of the same two fp32 values (the serial
//   kernel's as0 * w_s), so it has the same bits wherever it runs: here once per CTA and stage into
//   a shared table, instead of per thread and block (the serial kernel's 6 scale loads and 8
//   multiplies a block become 2 16-byte loads). tests/cuda/linear_pipelined_test.cc compares the bits.
//
// Roles (bench/RESULTS.md session 19: the consumers' issue slots bound the kernel, and every
// instruction there that is not a promotion FMA or a wgmma takes one):
//   warpgroup 0, the producer, gives its registers back (setmaxnreg 40):
//     warp 0: per K stage (128 bytes of K, 4 scale blocks), waits for the slot's empty barrier,
//       lane 0 arms full[slot] with the bytes to come and issues the TMA copies: the codes of x
//       [kBM x 128 bytes] and w [kBN x 128] in the 128-byte swizzle, and, when the scale rows are
//       16-byte strided (in / 32 % 4 == 0, the released shapes), x's scales [kBM x 4] and w's
//       [kBN / 32 x 4] fp32; otherwise the warp's 32 lanes copy the scales by cp.async, each lane's
//       arrival on full[slot] coming when its copies land (full: 1 or 33 arrivals + the bytes).
//     warps 1 and 2 (64 threads): per stage, wait full[slot], write the products
//       tab[ks][row][t] = as[row][ks] * ws[t][ks] (4 blocks x kBM rows x kBN / 32 weight tiles),
//       arrive on ready[slot] (64 arrivals). Warp 3 idles.
//   warpgroups 1 .. kCons, the consumers (setmaxnreg 232 for two, 216 for one), rows 64 c ..
//     64 c + 63 of the CTA tile: per stage, after full and ready, blocks 0 and 1 issued into two
//     result sets, then block b promoted while block b + 1 runs (the pipelined kernel's overlap,
//     cuda/linear_fp8_wgmma_pipe.cu), block 3 promoted after a full wait (the other consumer's
//     wgmmas fill that gap); then one arrival per warp on empty[slot] (4 kCons arrivals).
//     No wgmma is in flight across stages, branches or divergent code: ptxas -v then injects no
//     warpgroup.wait (C7517) and serializes nothing (C7514), which it did with the pipelined
//     kernel's cross-stage overlap here.
// After the barriers' initialisation no CTA-wide barrier: the roles meet only at the mbarriers.
// The products' writes and reads are generic-proxy shared memory, ordered by the mbarriers'
// release (arrive) and acquire (wait); the codes are read only by the wgmmas, after the consumer
// itself waited for the TMA's barrier. A barrier phase never completes twice ahead of its waiter:
// full and ready of round r + 1 need the producer past empty of round r, which needs every consumer.
//
// ptxas -v (nvcc 13.0) must report no spills, no C7517/C7512/C7514 (injected waits, serialized
// wgmmas), and the launch bound's register count (168 for 384 threads, 128 for 256 at 2 CTAs an
// SM): the setmaxnreg split gives exactly that pool out (else setmaxnreg.inc would wait forever).
// Two things made ptxas spill here: a __trap() on a consumer's wait path (hence the untimed waits
// there, below) and fully unrolled 64-bit address math in the 40-register producer.
//
// Configurations (template <kCons consumer warpgroups, kBN columns, kStages>):
//   prefill (T > 64): 2 consumers, 128 x 128 tile, 5 stages of 43 KB (one CTA an SM), M tiles fastest;
//   decode (T <= 64): 1 consumer (64 rows), 128 columns and 3 stages (2 CTAs an SM) where
//   out / 128 fills the SMs, else 64 columns and 8 stages.
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

using fp8::smem_addr;
using fp8::sw128_desc;
using tc::pin;
using tc::wgmma_commit;
using tc::wgmma_fence;

constexpr int kBlock = 32;         // act_quant / scale block along K
constexpr int kBK = 128;           // K bytes per stage
constexpr int kKb = kBK / kBlock;  // scale blocks per stage
constexpr int kBuilders = 64;      // producer threads writing the products (warps 1 and 2)

template <int kCons, int kBN_, int kStages_>
struct WsConfig {
  static constexpr int kBN = kBN_, kStages = kStages_;
  static constexpr int kBM = 64 * kCons;
  static constexpr int kThreads = 128 * (kCons + 1);
  static constexpr int kMinBlocks = kCons == 2 ? 1 : 2;  // CTAs an SM the registers allow
  static constexpr int kT = kBN / kBlock;                 // weight scale tiles across the columns
  // One stage slot: codes, raw scales, products (offsets in bytes from the 1024-aligned slot).
  static constexpr int kTileA = kBM * kBK;                // [kBM][128] x codes, swizzled
  static constexpr int kTileB = kBN * kBK;                // [kBN][128] w codes, swizzled
  static constexpr int kAsOff = kTileA + kTileB;          // [kBM][kKb] fp32 x scales
  static constexpr int kWsOff = kAsOff + kBM * kKb * 4;   // [kT][kKb] fp32 w scales
  static constexpr int kTabOff = kWsOff + 128;            // [kKb][kBM][kT] fp32 products
  static_assert(kWsOff == kAsOff + kBM * kKb * 4, "ws right after as (the cp.async scale loop)");
  static constexpr int kStageBytes = (kTabOff + kKb * kBM * kT * 4 + 1023) / 1024 * 1024;
  static constexpr int kScaleBytes = (kBM + kT) * kKb * 4;  // a stage's scales by TMA
  static constexpr int kBarOffset = kStages * kStageBytes;  // full, ready, empty [kStages] each
  static constexpr int kSmemBytes = kBarOffset + 3 * 8 * kStages + 1024;  // + alignment slack
  // Registers: the launch bound gives each thread kLaunchRegs (ptxas -v reports it); the producer
  // warpgroup drops to 40 and the consumers take exactly what it frees.
  static constexpr int kLaunchRegs = 65536 / (kThreads * kMinBlocks) / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kLaunchRegs + (kLaunchRegs - kProducerRegs) / kCons / 8 * 8;
  static_assert(kCons == 1 || kCons == 2, "one or two consumer warpgroups");
  static_assert(kBN == 128 || kBN == 64, "wgmma m64n128 or m64n64");
  static_assert(kConsumerRegs <= 256 && 128 * (kProducerRegs + kCons * kConsumerRegs) <= kLaunchRegs * kThreads,
                "the setmaxnreg split fits the CTA's register pool");
  static_assert(kBM % kBuilders == 0, "whole rows a builder thread");
  static_assert(kTileA % 1024 == 0 && kAsOff % 128 == 0 && kWsOff % 128 == 0 && kTabOff % 16 == 0,
                "TMA destinations aligned; wgmma tiles on whole swizzle atoms");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

// The tensor maps (x codes [T, in] box kBM x 128, w codes [out, in] box kBN x 128, both 128-byte
// swizzled; x scales [T, in / 32] box kBM x 4, w scales [ceil(out / 32), in / 32] box kBN / 32 x 4,
// fp32, unswizzled; the scale maps only when the scales go by TMA).
struct WsMaps {
  CUtensorMap a, b, as, ws;
};

// N consecutive fp32 (N = 4 or 2, 16- or 8-byte aligned) shared memory <-> registers.
template <int N>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[N]) {
  if constexpr (N == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    static_assert(N == 2, "load_vec: 4 or 2 floats");
    const float2 q = *reinterpret_cast<const float2*>(p);
    v[0] = q.x, v[1] = q.y;
  }
}
template <int N>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    static_assert(N == 2, "store_vec: 4 or 2 floats");
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  }
}

// Producer warp 0: the stages' copies in K order into the ring (stage kt in slot kt % kStages).
template <class C>
__device__ __forceinline__ void produce(const WsMaps& maps, const float* __restrict__ xs, const float* __restrict__ wsc,
                                        uint8_t* smem, uint64_t* full, uint64_t* empty, int64_t T, int64_t out,
                                        int64_t nkb, int64_t nkt, int64_t m0, int64_t n0, bool scales_tma, int lane) {
  int slot = 0;
  uint32_t parity = 0;  // (kt / kStages) % 2, the round of the slot
  for (int64_t kt = 0; kt < nkt; ++kt) {
    if (kt >= C::kStages) tma::mbar_wait(empty + slot, parity ^ 1u);  // the slot's previous round was read
    uint8_t* st = smem + slot * C::kStageBytes;
    float* as = reinterpret_cast<float*>(st + C::kAsOff);
    float* ws = reinterpret_cast<float*>(st + C::kWsOff);
    if (lane == 0) {
      tma::mbar_arrive_expect_tx(full + slot, C::kTileA + C::kTileB + (scales_tma ? C::kScaleBytes : 0));
      const int k0 = static_cast<int>(kt * kBK), kb0 = static_cast<int>(kt * kKb);
      tma::load_2d(st, &maps.a, k0, static_cast<int>(m0), full + slot);
      tma::load_2d(st + C::kTileA, &maps.b, k0, static_cast<int>(n0), full + slot);
      if (scales_tma) {
        tma::load_2d(as, &maps.as, kb0, static_cast<int>(m0), full + slot);
        tma::load_2d(ws, &maps.ws, kb0, static_cast<int>(n0 / kBlock), full + slot);
      }
    }
    if (!scales_tma) {  // uniform: the 32 lanes' cp.async, zeros outside (fp8::load_stage_scales's values)
      const int64_t kb0 = kt * kKb;
#pragma unroll 1
      for (int i = lane; i < (C::kBM + C::kT) * kKb; i += 32) {  // as [kBM][kKb] then ws [kT][kKb], contiguous
        const bool x = i < C::kBM * kKb;
        const int r = (x ? i : i - C::kBM * kKb) / kKb, j = i % kKb;
        const int64_t row = x ? m0 + r : n0 / kBlock + r;  // x row, or weight tile row
        const bool ok = (x ? row < T : row * kBlock < out) && kb0 + j < nkb;
        const float* src = (x ? xs : wsc) + row * nkb + kb0 + j;
        fp8::cp_async4(as + i, ok ? src : xs, ok ? 4 : 0);
      }
      tma::cp_async_mbar_arrive(full + slot);
    }
    if (++slot == C::kStages) slot = 0, parity ^= 1u;
  }
}

// Producer warps 1 and 2 (thread bt of 64): each stage's scale products, tab[ks][row][t] =
// as[row][ks] * ws[t][ks], the serial kernel's multiply as0 * w_s.
template <class C>
__device__ __forceinline__ void build_products(uint8_t* smem, uint64_t* full, uint64_t* ready, int64_t nkt, int bt) {
  int slot = 0;
  uint32_t parity = 0;
  for (int64_t kt = 0; kt < nkt; ++kt) {
    tma::mbar_wait(full + slot, parity);  // the stage's scales landed
    uint8_t* st = smem + slot * C::kStageBytes;
    const float* as = reinterpret_cast<const float*>(st + C::kAsOff);
    const float* ws = reinterpret_cast<const float*>(st + C::kWsOff);
    float* tab = reinterpret_cast<float*>(st + C::kTabOff);
#pragma unroll
    for (int r = bt; r < C::kBM; r += kBuilders) {
      float a[kKb];
      load_vec<kKb>(as + r * kKb, a);
#pragma unroll
      for (int ks = 0; ks < kKb; ++ks) {
        float p[C::kT];
#pragma unroll
        for (int t = 0; t < C::kT; ++t) p[t] = a[ks] * ws[t * kKb + ks];  // (a broadcast load; 40 registers)
        store_vec<C::kT>(tab + (ks * C::kBM + r) * C::kT, p);
      }
    }
    tma::mbar_arrive(ready + slot);
    if (++slot == C::kStages) slot = 0, parity ^= 1u;
  }
}

// Consumer warpgroup c (row0: this thread's rows row0 and row0 + 8 of the CTA tile): acc [kBN / 2]
// += the promoted blocks of every stage, in K order.
template <class C>
__device__ __forceinline__ void consume(uint8_t* smem, uint64_t* full, uint64_t* ready, uint64_t* empty, int64_t nkb,
                                        int64_t nkt, int c, int row0, int lane, float (&acc)[C::kBN / 2]) {
  constexpr int kN = C::kBN / 2;  // result registers a thread: kBN / 8 chunks of 4
  float d0[kN], d1[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) d0[i] = d1[i] = 0.0f;  // in-out operands, values unused
  // The descriptors: sw128_desc of the tiles' addresses as the base's + offset / 16 (the pipelined
  // kernel's; every offset a multiple of 16, shared addresses below 2^18).
  const uint64_t desc0 = sw128_desc(smem);
  const float* tab0 = reinterpret_cast<const float*>(smem + C::kTabOff) + row0 * C::kT;  // slot 0, block 0
  // Untimed waits: both phases complete once the builders' timed wait on full did (a copy that
  // never lands traps there and ends the launch).
  const auto wait_stage = [&](int slot, uint32_t parity) {
    tma::mbar_wait_untimed(full + slot, parity);   // codes (TMA) landed: the wgmmas may read them
    tma::mbar_wait_untimed(ready + slot, parity);  // products written
  };
  // This warp's reads of the slot are done: one arrival from lane 0, predicated, not branched (a
  // divergent branch with a wgmma in flight made ptxas serialize the wgmmas, C7514).
  const auto leave_stage = [&](int slot) {
    __syncwarp();
    tma::mbar_arrive_if(empty + slot, lane == 0);
  };
  const auto issue = [&](int slot, int ks, float (&d)[kN]) {
    const uint32_t a_off = static_cast<uint32_t>(slot * C::kStageBytes + c * 64 * kBK + ks * kBlock);
    const uint32_t b_off = static_cast<uint32_t>(slot * C::kStageBytes + C::kTileA + ks * kBlock);
    wgmma_fence();  // d's registers were read by the previous promotion
    fp8::wgmma_e4m3_inout<C::kBN>(d, desc0 + (a_off >> 4), desc0 + (b_off >> 4));
    wgmma_commit();
  };
  // acc += d * (a_s w_s) for block ks of the stage in slot, in the serial kernel's operation order.
  const auto promote = [&](int slot, int ks, float (&d)[kN]) {
    pin(d);  // no read of d before the wait above
    const float* tab = tab0 + slot * (C::kStageBytes / 4) + ks * C::kBM * C::kT;
    float s0[C::kT], s1[C::kT];  // a_s w_s of rows row0 and row0 + 8, per weight tile t
    load_vec<C::kT>(tab, s0);
    load_vec<C::kT>(tab + 8 * C::kT, s1);
#pragma unroll
    for (int t = 0; t < C::kT; ++t) {
#pragma unroll
      for (int j = 4 * t; j < 4 * t + 4; ++j) {  // n8 chunks j of tile t
        acc[4 * j] = __fmaf_rn(d[4 * j], s0[t], acc[4 * j]);
        acc[4 * j + 1] = __fmaf_rn(d[4 * j + 1], s0[t], acc[4 * j + 1]);
        acc[4 * j + 2] = __fmaf_rn(d[4 * j + 2], s1[t], acc[4 * j + 2]);
        acc[4 * j + 3] = __fmaf_rn(d[4 * j + 3], s1[t], acc[4 * j + 3]);
      }
    }
  };
  // A stage: its 4 blocks, block ks + 1's wgmma in flight while block ks is promoted; the last
  // block's promotion waits for the tensor cores (the other consumer warpgroup's wgmmas fill that
  // gap), so no wgmma is in flight across the K loop or a branch (ptxas injected waits, C7517,
  // with the pipelined kernel's result set in flight from one stage into the next).
  // Every stage runs the same 4 blocks, the last one too (no branch around a wgmma or a
  // promotion): the last stage's blocks past K read the TMA's zero fill, d = 0 and a_s w_s = 0
  // (zero-filled scales), so their promotions leave acc's bits unchanged (acc is never -0: it
  // starts +0, and a sum is -0 only when both terms are).
  int slot = 0;
  uint32_t parity = 0;
  for (int64_t kt = 0; kt < nkt; ++kt) {
    wait_stage(slot, parity);
    issue(slot, 0, d0);
    issue(slot, 1, d1);
    tc::wgmma_wait<1>();
    promote(slot, 0, d0);
    issue(slot, 2, d0);
    tc::wgmma_wait<1>();
    promote(slot, 1, d1);
    issue(slot, 3, d1);
    tc::wgmma_wait<1>();
    promote(slot, 2, d0);
    tc::wgmma_wait<0>();
    promote(slot, 3, d1);
    leave_stage(slot);  // (after the last stage: nobody waits for it)
    if (++slot == C::kStages) slot = 0, parity ^= 1u;
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    fp8_wgmma_ws_kernel(const __grid_constant__ WsMaps maps, const float* __restrict__ xs,
                        const float* __restrict__ wsc, int64_t T, int64_t in, int64_t out, bool scales_tma,
                        float* __restrict__ y) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarOffset);  // [kStages] codes and scales landed
  uint64_t* ready = full + C::kStages;                                  // [kStages] products written
  uint64_t* empty = ready + C::kStages;                                 // [kStages] consumers done
  // M tiles fastest: the CTAs resident together share a weight tile (the serial kernel's order).
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * C::kBM, n0 = static_cast<int64_t>(blockIdx.y) * C::kBN;
  const int64_t nkb = in / kBlock, nkt = (in + kBK - 1) / kBK;
  const int tid = static_cast<int>(threadIdx.x), wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;

  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      tma::mbar_init(full + s, scales_tma ? 1 : 1 + 32);
      tma::mbar_init(ready + s, kBuilders);
      tma::mbar_init(empty + s, 4 * (C::kThreads / 128 - 1));
    }
    tma::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // the producer warpgroup
    tc::setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 0) {
      produce<C>(maps, xs, wsc, smem, full, empty, T, out, nkb, nkt, m0, n0, scales_tma, lane);
    } else if (warp <= kBuilders / 32) {
      build_products<C>(smem, full, ready, nkt, tid - 32);
    }
    return;
  }
  tc::setmaxnreg_inc<C::kConsumerRegs>();
  const int c = wg - 1, g = lane / 4, tq = lane % 4;
  const int row0 = c * 64 + warp * 16 + g;  // this thread's rows row0 and row0 + 8 of the CTA tile
  float acc[C::kBN / 2];
#pragma unroll
  for (int i = 0; i < C::kBN / 2; ++i) acc[i] = 0.0f;
  if (nkt > 0) consume<C>(smem, full, ready, empty, nkb, nkt, c, row0, lane, acc);  // else (in 0) zeros
  // Epilogue: bf16 values (the backend's bf16 tensors are fp32 storage).
  fp8::store_bf16_fragment<C::kBN>(acc, y, T, out, m0 + row0, n0 + tq * 2);
}

template <int kCons, int kBN, int kStages>
void launch(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in, const uint8_t* w_codes,
            const float* w_scales, int64_t out, float* y) {
  using C = WsConfig<kCons, kBN, kStages>;
  static const bool attr = [] {
    DSV41_CUDA_CHECK(
        cudaFuncSetAttribute(fp8_wgmma_ws_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)attr;
  DSV41_CHECK((out + kBN - 1) / kBN <= 65535, "fp8_wgmma_ws_linear: out ", out, " needs more than 65535 ", kBN,
              "-column tiles");
  const int64_t nkb = in / kBlock;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // The scales by TMA where their rows are 16-byte strided (the map's rule), else by cp.async.
  const bool scales_tma = nkb % kKb == 0 && aligned16(x_scales) && aligned16(w_scales);
  WsMaps maps{};
  maps.a = tma::encode_2d(x_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, T, in, C::kBM, kBK, CU_TENSOR_MAP_SWIZZLE_128B,
                          "fp8_wgmma_ws_linear (x codes)");
  maps.b = tma::encode_2d(w_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, out, in, kBN, kBK, CU_TENSOR_MAP_SWIZZLE_128B,
                          "fp8_wgmma_ws_linear (w codes)");
  if (scales_tma) {
    maps.as = tma::encode_2d(x_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, T, nkb, C::kBM, kKb,
                             CU_TENSOR_MAP_SWIZZLE_NONE, "fp8_wgmma_ws_linear (x scales)");
    maps.ws = tma::encode_2d(w_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (out + kBlock - 1) / kBlock, nkb, C::kT,
                             kKb, CU_TENSOR_MAP_SWIZZLE_NONE, "fp8_wgmma_ws_linear (w scales)");
  }
  const dim3 grid(static_cast<unsigned>((T + C::kBM - 1) / C::kBM), static_cast<unsigned>((out + kBN - 1) / kBN));
  fp8_wgmma_ws_kernel<C><<<grid, C::kThreads, C::kSmemBytes>>>(maps, x_scales, w_scales, T, in, out, scales_tma, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fp8_wgmma_ws_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                               const uint8_t* w_codes, const float* w_scales, int64_t out, float* y) {
  if (T == 0 || out == 0) return;
  DSV41_CHECK(in % kBlock == 0, "fp8_wgmma_ws_linear: in ", in, " is not a multiple of ", kBlock);
  if (in == 0) {  // no K: zeros; a tensor map cannot be 0 wide
    fp8_wgmma_serial_linear_codes(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
    return;
  }
  // The copy engine's coordinates are 32-bit; its global addresses 16-byte aligned.
  DSV41_CHECK(T <= INT32_MAX && in <= INT32_MAX && out <= INT32_MAX, "fp8_wgmma_ws_linear: T ", T, ", in ", in,
              ", out ", out, " past 2^31 (TMA coordinates)");
  DSV41_CHECK(reinterpret_cast<uintptr_t>(x_codes) % 16 == 0 && reinterpret_cast<uintptr_t>(w_codes) % 16 == 0,
              "fp8_wgmma_ws_linear: codes not 16-byte aligned (TMA)");
  if (T > 64) {
    launch<2, 128, 5>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  } else if ((out + 127) / 128 >= int64_t{sm_count()}) {
    launch<1, 128, 3>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  } else {
    launch<1, 64, 8>(x_codes, x_scales, T, in, w_codes, w_scales, out, y);
  }
}

}  // namespace dsv41::gpu
