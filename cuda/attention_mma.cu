// cuda/attention_mma.cu: the PRODUCTION sparse attention (backend `cuda`, claim order-variant) ↔
// reference/ops/attention.cc (sparse_attn); docs/cuda.md "Production ops".
//
// The reference's semantics up to summation order, on the bf16 tensor cores (mma.sync m16n8k16,
// bf16 in, fp32 accumulate), in ONE pass per (query, 64 heads): no score matrix in memory.
//   q [T, H, D] bf16, kv [N, D] bf16 (K = V; the window rows and the compressed rows, gathered by
//   idxs [T, K], -1 = none), sink [H] fp32 -> out [T, H, D] (bf16 values, fp32 or bf16 storage).
// Per CTA: one query t, heads h0 .. h0+63 (zero rows past H), 8 warps: warp w owns head group
// hg = w % 4 (16 heads) and channel half dh = w / 4 (D/2 channels). Per block b of 64 indices
// (the reference's online-softmax blocks, so its bf16 probabilities keep their meaning):
//   1. S = Q . KV_b^T: each warp the 16 x 64 partial dot over its channel half (D/32 mma steps in
//      channel order, one fp32 accumulator each); the pair (hg, 0), (hg, 1) swaps halves through
//      shared memory so that each owns 32 indices: s = half0 + half1 (one fp32 add);
//   2. s2 = s * c2, c2 = fl(scale * log2 e) (the exponent in base 2), -inf for index -1 or past K;
//      the row max over the 64 indices (quad shuffles, the pair through shared memory);
//      m' = max(m, max_j s2_j) from m = -1e30; r = exp2(m - m'); p_j = exp2(s2_j - m') (exp2f,
//      2 ulp); l = fma(l, r, sum of the thread's p_j) per thread (the partials summed at the end);
//      P = bf16(p_j) (the reference's rounding, relative to the same running max) to shared memory;
//   3. O = O * r, then O += P . V_b: each warp 16 heads x D/2 channels, 4 mma steps of 16 indices.
// Finally l = (sum of the partials) + exp2(fl(sink * log2 e) - m), out = bf16(O * (1 / l)).
// The KV tile of block b + 1 is gathered by cp.async (16 bytes per copy, zero rows for -1) while
// block b computes; shared memory: Q, two KV stages (rows padded by 16 bytes: ldmatrix
// conflict-free), the exchanged halves, P, the row statistics: 226,816 bytes at D = 512, one CTA
// per SM. Error model and bound: scenarios/judge/sparse_attn_mma_bound.h.
#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fp8_async.cuh"
#include "cuda/kernels.h"
#include "cuda/tensor_core.cuh"

namespace dsv41::gpu {
namespace {

using fp8::cp_async16;
using fp8::cp_async_commit;
using fp8::cp_async_wait;
using fp8::smem_addr;
using tc::bf16_value;
using tc::pack_bf16x2;
using tc::pair_sync;
using tc::store2;

constexpr int kThreads = 256;  // 8 warps
constexpr int kHeads = 64;     // heads per CTA
constexpr int kKeys = 64;      // indices per block (reference::kSparseAttnBlock)
constexpr float kInitMax = -1e30f;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Layout {
  static constexpr int DH = D / 2;        // channels per warp
  static constexpr int LD = D + 8;        // bf16 per shared row of Q and KV (+16 bytes)
  static constexpr int LDP = kKeys + 8;   // bf16 per shared row of P
  static constexpr int kQ = kHeads * LD * 2;
  static constexpr int kKV = kKeys * LD * 2;
  static constexpr int kSx = 8 * 4 * 32 * 16;  // per warp 4 n-tiles x 32 lanes x float4
  static constexpr int kP = kHeads * LDP * 2;
  static constexpr int kOffKV = kQ, kOffSx = kQ + 2 * kKV, kOffP = kOffSx + kSx, kOffStat = kOffP + kP;
  static constexpr int kBytes = kOffStat + (2 * kHeads + 2 * kHeads + 2 * kKeys) * 4;  // rmax, rl, sidx
};
static_assert(Layout<512>::kBytes <= 232448, "shared memory of one CTA");

__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ inline void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldsm_x4_t(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int D, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attn_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                           const int32_t* __restrict__ idxs, const float* __restrict__ sink, int64_t H, int64_t K,
                           float c2, OutT* __restrict__ out) {
  using L = Layout<D>;
  constexpr int DH = L::DH, LD = L::LD, LDP = L::LDP, kChunks = D / 8;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* const Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* const KVs = reinterpret_cast<uint16_t*>(smem + L::kOffKV);
  float4* const Sx = reinterpret_cast<float4*>(smem + L::kOffSx);
  uint16_t* const Ps = reinterpret_cast<uint16_t*>(smem + L::kOffP);
  float* const rmax = reinterpret_cast<float*>(smem + L::kOffStat);  // [2][64]
  float* const rl = rmax + 2 * kHeads;                                // [2][64]
  int32_t* const sidx = reinterpret_cast<int32_t*>(rl + 2 * kHeads);   // [2][64]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, w = tid >> 5, hg = w & 3, dh = w >> 2;
  const int g = lane >> 2, c = lane & 3;
  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kHeads;
  const int32_t* const idx = idxs + t * K;
  const int64_t nblocks = (K + kKeys - 1) / kKeys;

  for (int i = tid; i < kHeads * kChunks; i += kThreads) {  // the Q tile (zero rows past H)
    const int r = i / kChunks, ch = i % kChunks;
    const bool ok = h0 + r < H;
    cp_async16(Qs + r * LD + ch * 8, ok ? q + ((t * H + h0 + r) * D + ch * 8) : q, ok ? 16 : 0);
  }
  const auto load_kv = [&](int stage, int64_t b) {  // the gathered rows of block b (zero rows for -1)
    uint16_t* const dst = KVs + stage * kKeys * LD;
#pragma unroll 4
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      const int64_t j = b * kKeys + r;
      const int32_t ix = j < K ? __ldg(idx + j) : -1;
      cp_async16(dst + r * LD + ch * 8, ix >= 0 ? kv + (static_cast<int64_t>(ix) * D + ch * 8) : kv, ix >= 0 ? 16 : 0);
    }
    if (tid < kKeys) {
      const int64_t j = b * kKeys + tid;
      sidx[stage * kKeys + tid] = j < K ? __ldg(idx + j) : -1;
    }
    cp_async_commit();
  };
  if (nblocks > 0) load_kv(0, 0);
  cp_async_commit();

  float o[DH / 8][4];
#pragma unroll
  for (int n = 0; n < DH / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {kInitMax, kInitMax};  // rows g, g + 8 of the head group (base-2 exponents)
  float l_run[2] = {0.0f, 0.0f};          // this thread's partial denominators
  const unsigned qs = smem_addr(Qs), kvs0 = smem_addr(KVs), ps = smem_addr(Ps);
  // ldmatrix row addresses: A (Q, P) and the transposed B (V): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15);
  // B of the scores (K rows): (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 8;
  const int prow0 = hg * 16 + g;  // this thread's first head row in the CTA

  for (int64_t b = 0; b < nblocks; ++b) {
    const int st = static_cast<int>(b & 1);
    cp_async_wait<0>();
    __syncthreads();  // stage st (and Q) landed; every warp is done with stage st ^ 1, Sx, P, rmax
    if (b + 1 < nblocks) load_kv(st ^ 1, b + 1);
    const unsigned kvs = kvs0 + static_cast<unsigned>(st * kKeys * LD * 2);

    // 1. the partial scores over this warp's channel half: 16 heads x 64 indices
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < DH / 16; ++ks) {
      const int d0 = dh * DH + ks * 16;
      uint32_t a[4];
      ldsm_x4(a, qs + static_cast<unsigned>(((hg * 16 + a_row) * LD + d0 + a_col) * 2));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bb[4];
        ldsm_x4(bb, kvs + static_cast<unsigned>(((np * 16 + b_row) * LD + d0 + b_col) * 2));
        mma_bf16(s[2 * np], a, bb[0], bb[1]);
        mma_bf16(s[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    // swap halves: warp dh keeps n-tiles 4 dh .. 4 dh + 3 (indices 32 dh .. 32 dh + 31)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      Sx[(w * 4 + i) * 32 + lane] = dh == 0 ? make_float4(s[4 + i][0], s[4 + i][1], s[4 + i][2], s[4 + i][3])
                                            : make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    }
    pair_sync(hg);
    float x[4][4];
    const int* const sid = sidx + st * kKeys + dh * 32;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 pv = Sx[((w ^ 4) * 4 + i) * 32 + lane];
      const float other[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float own = dh == 0 ? s[i][e] : s[4 + i][e];
        const float sum = dh == 0 ? __fadd_rn(own, other[e]) : __fadd_rn(other[e], own);  // half0 + half1
        x[i][e] = sid[i * 8 + 2 * c + (e & 1)] < 0 ? -INFINITY : __fmul_rn(sum, c2);
      }
    }
    // 2. the online softmax of block b (rows g and g + 8)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mx[0] = fmaxf(mx[0], fmaxf(x[i][0], x[i][1]));
      mx[1] = fmaxf(mx[1], fmaxf(x[i][2], x[i][3]));
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
    }
    if (c == 0) {
      rmax[dh * kHeads + prow0] = mx[0];
      rmax[dh * kHeads + prow0 + 8] = mx[1];
    }
    pair_sync(hg);
    float r[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float m_new = fmaxf(m_run[k], fmaxf(mx[k], rmax[(dh ^ 1) * kHeads + prow0 + 8 * k]));
      r[k] = exp2f(__fsub_rn(m_run[k], m_new));
      m_run[k] = m_new;
    }
    float psum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = exp2f(__fsub_rn(x[i][e], m_run[e >> 1]));
        psum[e >> 1] = __fadd_rn(psum[e >> 1], p[e]);
      }
      const int key = dh * 32 + i * 8 + 2 * c;
      *reinterpret_cast<uint32_t*>(Ps + prow0 * LDP + key) = pack_bf16x2(p[0], p[1]);
      *reinterpret_cast<uint32_t*>(Ps + (prow0 + 8) * LDP + key) = pack_bf16x2(p[2], p[3]);
    }
    l_run[0] = __fmaf_rn(l_run[0], r[0], psum[0]);
    l_run[1] = __fmaf_rn(l_run[1], r[1], psum[1]);
    pair_sync(hg);
    // 3. O = O * r + P . V
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] = __fmul_rn(o[n][0], r[0]);
      o[n][1] = __fmul_rn(o[n][1], r[0]);
      o[n][2] = __fmul_rn(o[n][2], r[1]);
      o[n][3] = __fmul_rn(o[n][3], r[1]);
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, ps + static_cast<unsigned>(((hg * 16 + a_row) * LDP + kk * 16 + a_col) * 2));
#pragma unroll
      for (int np = 0; np < DH / 16; ++np) {
        uint32_t bb[4];
        ldsm_x4_t(bb, kvs + static_cast<unsigned>(((kk * 16 + a_row) * LD + dh * DH + np * 16 + a_col) * 2));
        mma_bf16(o[2 * np], a, bb[0], bb[1]);
        mma_bf16(o[2 * np + 1], a, bb[2], bb[3]);
      }
    }
  }
  // the denominators: the quad's and the pair's partials, then the sink
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l_run[k] = __fadd_rn(l_run[k], __shfl_xor_sync(0xffffffffu, l_run[k], 1));
    l_run[k] = __fadd_rn(l_run[k], __shfl_xor_sync(0xffffffffu, l_run[k], 2));
  }
  __syncthreads();  // rl is fresh shared memory; no warp still reads rmax/Sx of the last block
  if (c == 0) {
    rl[dh * kHeads + prow0] = l_run[0];
    rl[dh * kHeads + prow0 + 8] = l_run[1];
  }
  pair_sync(hg);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = prow0 + 8 * k;
    const int64_t h = h0 + row;
    if (h >= H) continue;
    const float other = rl[(dh ^ 1) * kHeads + row];
    float l = dh == 0 ? __fadd_rn(l_run[k], other) : __fadd_rn(other, l_run[k]);
    l = __fadd_rn(l, exp2f(__fsub_rn(__fmul_rn(sink[h], kLog2e), m_run[k])));
    const float inv = __frcp_rn(l);
    OutT* const orow = out + (t * H + h) * D + dh * DH + 2 * c;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      store2(orow + n * 8, bf16_value(__fmul_rn(o[n][2 * k], inv)), bf16_value(__fmul_rn(o[n][2 * k + 1], inv)));
    }
  }
}

template <int D, typename OutT>
void launch(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T, int64_t H,
            int64_t K, float scale, OutT* out) {
  const int64_t hb = (H + kHeads - 1) / kHeads;
  DSV41_CHECK(T <= 0x7fffffff && hb <= 65535, "sparse_attn_mma: ", T, " queries x ", H, " heads exceed the grid");
  const auto kernel = sparse_attn_mma_kernel<D, OutT>;
  DSV41_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout<D>::kBytes)));
  const float c2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634074);
  kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(hb)), kThreads, Layout<D>::kBytes>>>(q, kv, idxs, sink,
                                                                                                     H, K, c2, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

template <typename OutT>
void dispatch(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T, int64_t H,
              int64_t D, int64_t K, float scale, OutT* out) {
  DSV41_CHECK(sparse_attn_mma_supported(D), "sparse_attn_mma: head dim ", D, " not supported (128, 256, 512)");
  if (T * H == 0) return;
  if (D == 512) launch<512>(q, kv, idxs, sink, T, H, K, scale, out);
  else if (D == 256) launch<256>(q, kv, idxs, sink, T, H, K, scale, out);
  else launch<128>(q, kv, idxs, sink, T, H, K, scale, out);
}

// y = the bf16 bits of x (fp32 storage); *flag = 1 when some x is not a bf16 value.
__global__ void to_bf16_bits_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ y,
                                    int* __restrict__ flag) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(x[i]);
    if ((u & 0xFFFFu) != 0) *flag = 1;
    y[i] = static_cast<uint16_t>(u >> 16);
  }
}

// One mma.sync m16n8k16 bf16 with accumulator: a [16][16], b [8][16] (k contiguous), c, d [16][8].
__global__ void bf16_mma_probe_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = static_cast<int>(threadIdx.x), g = lane >> 2, q = lane & 3;
  const auto pair = [](const uint16_t* p) { return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16); };
  const uint32_t ar[4] = {pair(a + g * 16 + 2 * q), pair(a + (g + 8) * 16 + 2 * q), pair(a + g * 16 + 2 * q + 8),
                          pair(a + (g + 8) * 16 + 2 * q + 8)};
  float acc[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
  mma_bf16(acc, ar, pair(b + g * 16 + 2 * q), pair(b + g * 16 + 2 * q + 8));
  d[g * 8 + 2 * q] = acc[0];
  d[g * 8 + 2 * q + 1] = acc[1];
  d[(g + 8) * 8 + 2 * q] = acc[2];
  d[(g + 8) * 8 + 2 * q + 1] = acc[3];
}

__global__ void exp2_probe_kernel(const float* x, int64_t n, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = exp2f(x[i]);
}

}  // namespace

bool sparse_attn_mma_supported(int64_t D) { return D == 128 || D == 256 || D == 512; }

void sparse_attn_mma(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                     int64_t H, int64_t D, int64_t K, float scale, float* out) {
  dispatch(q, kv, idxs, sink, T, H, D, K, scale, out);
}
void sparse_attn_mma_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                          int64_t H, int64_t D, int64_t K, float scale, uint16_t* out) {
  dispatch(q, kv, idxs, sink, T, H, D, K, scale, out);
}

void to_bf16_bits(const float* x, int64_t n, uint16_t* y, int* flag) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  to_bf16_bits_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256>>>(x, n, y, flag);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void bf16_mma_probe(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  bf16_mma_probe_kernel<<<1, 32>>>(a, b, c, d);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void exp2_probe(const float* x, int64_t n, float* y) {
  if (n == 0) return;
  exp2_probe_kernel<<<grid_for(n, 256), 256>>>(x, n, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
