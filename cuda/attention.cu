// cuda/attention.cu ↔ reference/ops/attention.cc (sparse_attn's dot products, attention_index_rows)
//
// sparse_attn runs in three device stages (CudaOps::sparse_attn, cuda/cuda_ops_mhc_attn.cc), all
// BIT-EXACT: every output is the reference's own chain of correctly rounded fp32 operations, only
// the data movement is tiled. Per query row t the two products are small GEMMs with a gathered
// operand, run as register-tiled CUDA-core GEMMs (a CTA of 128 threads owns a 64 x 128 output
// tile, each thread an 8 x 8 micro-tile; operands staged in shared memory by cp.async, two stages
// of 32 (scores) or 16 (P.V) reduction steps; every output's sum is ONE fp32 FMA chain from +0 in
// reduction order):
//   sparse_scores  CTA (t, 64 heads, 128 indices): S = Q_t . KV_rows^T over d. Each gathered KV
//                  row is read once per CTA and reused by all 64 heads. s = fl32(fma-chain_d(q[d],
//                  kv_j[d]) * scale) (__fmaf_rn = the reference's fma_dot_f32, std::fma), -inf for
//                  index -1.
//   sparse_softmax CTA of 32 (t, h) rows: reference::OnlineSoftmax block by block (the block max,
//                  rescale = libm_expf(m - m'), p_j = libm_expf(s_j - m') one lane per j, bf16(p_j);
//                  the double sum in j order rounded once, one thread per row; l = fl(l * r) + sum),
//                  then l += libm_expf(sink - m); libm_expf is glibc's expf bit for bit
//                  (cuda/libm_expf.h).
//   sparse_pv      CTA (t, 64 heads, 128 channels): per block of 64 indices pv = fma-chain_j(p_j,
//                  kv_j[d]) from +0 in j order (index -1 reads the zero row, as the reference),
//                  acc = fl(acc * rescale_b) + pv (separate __fmul_rn, __fadd_rn: the reference is
//                  built with -ffp-contract=off), out = bf16(acc / l) (__fdiv_rn). p, rescale and
//                  l come from sparse_softmax or from the reference's OnlineSoftmax on the host.
// Padding of a partial tile (heads >= H, d >= D, j >= K) is zero in both operands: the FMA chain
// then adds 0 * 0 = +0 to a sum that is never -0 (it starts at +0 and RN never yields -0 from
// x + y unless both are -0), so padded terms leave every chain's value and bits unchanged.
// attention_index_rows: integer copies, one thread per output: BIT-EXACT.
#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kBlock = 64;  // reference::kSparseAttnBlock
// GEMM tiles: TM rows (heads) x TN columns (indices for the scores, channels for P.V) per CTA,
// KC (P.V) or KS (scores) reduction steps per shared-memory stage, 8 x 8 outputs per thread
// (16 x 8 threads).
constexpr int TM = 64, TN = 128, KC = 16, KS = 32;
// Row strides of the [row][k] stages (floats): 16-byte rows, and 8 consecutive rows start in 8
// different 4-bank groups, so the 16-byte fragment loads are free of bank conflicts.
constexpr int LDK = KC + 4, LDS = KS + 4;
constexpr int LDN = TN + 4;   // row stride of the [k][channel] stage of P.V

// ---- cp.async (sm_80+): 16 or 4 bytes, the rest zero-filled when src_bytes < size ----
__device__ inline void cp_async16(float* smem, const float* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async4(float* smem, const float* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four floats row[col .. col+3] (row: len floats, nullptr = the zero row) into smem[0..3], zero
// beyond len. vec: row is 16-byte aligned and len % 4 == 0 (one 16-byte copy).
__device__ inline void load4(float* smem, const float* row, int64_t col, int64_t len, bool vec, const float* any) {
  if (vec) {
    const bool ok = row != nullptr && col < len;
    cp_async16(smem, ok ? row + col : any, ok ? 16 : 0);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool ok = row != nullptr && col + e < len;
      cp_async4(smem + e, ok ? row + col + e : any, ok ? 4 : 0);
    }
  }
}

__device__ inline float comp(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Scores: grid (T * ceil(K / TN), ceil(H / TM)), x = t * tiles + tile. A = q[t, h0 .. h0+63, :], B = the gathered KV
// rows kv[idxs[t, j0 .. j0+127], :], both staged as [row][d] (k contiguous) per 32 channels;
// kScoresSmem bytes of dynamic shared memory.
// s [T, H, K] = fl(fma-chain_d * scale), -inf for index -1.
constexpr size_t kScoresSmem = sizeof(float) * 2 * (TM + TN) * LDS;
__global__ void __launch_bounds__(kThreads, 3)
    sparse_scores_kernel(const float* __restrict__ q, const float* __restrict__ kv, const int32_t* __restrict__ idxs,
                         int64_t H, int64_t D, int64_t K, float scale, bool vec, float* __restrict__ s) {
  extern __shared__ __align__(16) float smem[];
  float* const As = smem;                  // [2][TM * LDS]
  float* const Bs = smem + 2 * TM * LDS;   // [2][TN * LDS]
  __shared__ int32_t sidx[TN];
  const int tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
  const int64_t tiles = (K + TN - 1) / TN, t = blockIdx.x / tiles;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * TM, j0 = (blockIdx.x % tiles) * TN;
  for (int n = tid; n < TN; n += kThreads) sidx[n] = j0 + n < K ? idxs[t * K + j0 + n] : -1;
  __syncthreads();
  // This thread's copies: rows tid/8 + 16 i (A: i < 4, B: i < 8) at k (tid % 8) * 4.
  constexpr int kPer = KS / 4, kRows = kThreads / kPer;
  const int lr = tid / kPer, lc = (tid % kPer) * 4;
  const float* arow[TM / kRows];
  const float* brow[TN / kRows];
#pragma unroll
  for (int i = 0; i < TM / kRows; ++i) {
    const int64_t h = h0 + lr + kRows * i;
    arow[i] = h < H ? q + (t * H + h) * D : nullptr;
  }
#pragma unroll
  for (int i = 0; i < TN / kRows; ++i) {
    const int32_t r = sidx[lr + kRows * i];
    brow[i] = r >= 0 ? kv + static_cast<int64_t>(r) * D : nullptr;
  }
  const auto stage = [&](int buf, int64_t d0) {
#pragma unroll
    for (int i = 0; i < TM / kRows; ++i)
      load4(As + buf * TM * LDS + (lr + kRows * i) * LDS + lc, arow[i], d0 + lc, D, vec, q);
#pragma unroll
    for (int i = 0; i < TN / kRows; ++i)
      load4(Bs + buf * TN * LDS + (lr + kRows * i) * LDS + lc, brow[i], d0 + lc, D, vec, kv);
    cp_async_commit();
  };
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }
  const int64_t chunks = (D + KS - 1) / KS;
  if (chunks > 0) stage(0, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const int buf = static_cast<int>(c & 1);
    if (c + 1 < chunks) {
      stage(buf ^ 1, (c + 1) * KS);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* a_s = As + buf * TM * LDS;
    const float* b_s = Bs + buf * TN * LDS;
#pragma unroll
    for (int kk = 0; kk < KS; kk += 4) {
      float4 a[8], b[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = *reinterpret_cast<const float4*>(a_s + (tm + 8 * i) * LDS + kk);
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = *reinterpret_cast<const float4*>(b_s + (tn + 16 * j) * LDS + kk);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // d = c * KS + kk + e, in order
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(comp(a[i], e), comp(b[j], e), acc[i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t h = h0 + tm + 8 * i;
    if (h >= H) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = tn + 16 * j;
      if (j0 + n >= K) continue;
      s[(t * H + h) * K + j0 + n] = sidx[n] < 0 ? -INFINITY : __fmul_rn(acc[i][j], scale);
    }
  }
}

// reference::OnlineSoftmax over rows of s, kSoftmaxRows rows (t, h) per CTA of 128 threads. Per
// block of 64 indices:
//   phase 1, one warp per row (rows w, w + 4, ...): the block max by a shuffle tree (NaN read as
//     -inf: the reference's `max(m, s) = m < s ? s : m` from -inf never takes a NaN; which of +0 and
//     -0 wins a tie can differ from the j-order scan, and no result depends on the sign of a zero
//     max: m only enters through m - m', s - m' and sink - m, where x - (+0) = x - (-0) for x != 0
//     and exp(+-0) = 1), m' = max(m, block max), r = libm_expf(m - m'), p_j = libm_expf(s_j - m')
//     one lane per j, bf16(p_j) to p, the unrounded p_j to shared memory;
//   phase 2, one thread per row: the double sum of p_j in j order rounded once, l = fl(l * r) + sum.
// Finally l += libm_expf(sink - m).
constexpr int kSoftmaxRows = 32;
__global__ void sparse_softmax_kernel(const float* __restrict__ s, const float* __restrict__ sink, int64_t rows, int64_t H,
                          int64_t K, float* __restrict__ p, float* __restrict__ rescale, float* __restrict__ l_out) {
  __shared__ float ps[kSoftmaxRows][kBlock + 1];  // +1: phase 2's column reads hit 32 banks
  __shared__ float ms[kSoftmaxRows], rs[kSoftmaxRows];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kSoftmaxRows;
  const int nrows = static_cast<int>(rows - i0 < kSoftmaxRows ? rows - i0 : kSoftmaxRows);
  const int64_t blocks = (K + kBlock - 1) / kBlock;
  if (threadIdx.x < kSoftmaxRows) ms[threadIdx.x] = -1e30f;  // reference::kSparseAttnInitMax
  float l = 0.0f;  // phase 2's row threadIdx.x (threads < kSoftmaxRows)
  __syncthreads();
  for (int64_t b0 = 0, b = 0; b0 < K; b0 += kBlock, ++b) {
    const int nb = static_cast<int>(K - b0 < kBlock ? K - b0 : kBlock);
    for (int rr = w; rr < nrows; rr += kThreads / 32) {
      const int64_t i = i0 + rr;
      const float* sr = s + i * K + b0;
      const float s0 = lane < nb ? sr[lane] : -INFINITY, s1 = lane + 32 < nb ? sr[lane + 32] : -INFINITY;
      const float x0 = s0 != s0 ? -INFINITY : s0, x1 = s1 != s1 ? -INFINITY : s1;  // NaN never wins
      float bm = (x0 < x1) ? x1 : x0;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, bm, off);
        bm = (bm < o) ? o : bm;
      }
      const float m = ms[rr];
      const float m_new = (m < bm) ? bm : m;
      const float r = libm_expf(__fsub_rn(m, m_new));
      const float p0 = libm_expf(__fsub_rn(s0, m_new)), p1 = libm_expf(__fsub_rn(s1, m_new));
      float* pr = p + i * K + b0;
      if (lane < nb) pr[lane] = formats::round_to_bf16(p0);
      if (lane + 32 < nb) pr[lane + 32] = formats::round_to_bf16(p1);
      ps[rr][lane] = p0;
      ps[rr][lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        ms[rr] = m_new;
        rs[rr] = r;
        rescale[i * blocks + b] = r;
      }
    }
    __syncthreads();
    if (threadIdx.x < nrows) {
      const int rr = threadIdx.x;
      double p_sum = 0.0;
      for (int j = 0; j < nb; ++j) p_sum = __dadd_rn(p_sum, static_cast<double>(ps[rr][j]));
      l = __fadd_rn(__fmul_rn(l, rs[rr]), __double2float_rn(p_sum));
    }
    __syncthreads();
  }
  if (threadIdx.x < nrows) {
    const int64_t i = i0 + threadIdx.x;
    l_out[i] = __fadd_rn(l, libm_expf(__fsub_rn(sink[i % H], ms[threadIdx.x])));
  }
}

// P.V: grid (T * ceil(D / TN), ceil(H / TM)), kPvSmem bytes of dynamic shared memory. A = p[t,
// h0 .. h0+63, j] staged [row][j], B = the gathered rows kv[idxs[t, j], d0 .. d0+127] staged
// [j][channel]; four stages of 16 indices make one softmax block, after which acc = fl(acc * r_b) +
// pv and pv = +0. pv lives in registers, acc in shared memory (each thread its own 8 x 8, touched
// once per block), so that three CTAs fit on an SM.
constexpr size_t kPvSmem = sizeof(float) * (2 * TM * LDK + 2 * KC * LDN + TM * TN);
__global__ void __launch_bounds__(kThreads, 3)
    sparse_pv_kernel(const float* __restrict__ kv, const int32_t* __restrict__ idxs, const float* __restrict__ p,
                     const float* __restrict__ rescale, const float* __restrict__ l, int64_t H, int64_t D,
                     int64_t K, bool vec_p, bool vec_kv, float* __restrict__ out) {
  extern __shared__ __align__(16) float smem[];
  float* const As = smem;                    // [2][TM * LDK]
  float* const Bs = smem + 2 * TM * LDK;     // [2][KC * LDN]
  float* const accs = Bs + 2 * KC * LDN;     // [TM][TN]
  const int tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
  const int64_t tiles = (D + TN - 1) / TN, t = blockIdx.x / tiles;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * TM, d0 = (blockIdx.x % tiles) * TN;
  const int64_t blocks = (K + kBlock - 1) / kBlock;
  const int32_t* idx = idxs + t * K;
  // Copies: A rows tid/4 + 32 i (i < 2) at j (tid % 4) * 4; B rows tid/32 + 4 i (i < 4) at channel (tid % 32) * 4.
  const int alr = tid / 4, alc = (tid % 4) * 4, blr = tid / 32, blc = (tid % 32) * 4;
  const float* arow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t h = h0 + alr + 32 * i;
    arow[i] = h < H ? p + (t * H + h) * K : nullptr;
  }
  const auto stage = [&](int buf, int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) load4(As + buf * TM * LDK + (alr + 32 * i) * LDK + alc, arow[i], k0 + alc, K, vec_p, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t j = k0 + blr + 4 * i;
      const int32_t r = j < K ? idx[j] : -1;
      const float* row = r >= 0 ? kv + static_cast<int64_t>(r) * D + d0 : nullptr;
      load4(Bs + buf * KC * LDN + (blr + 4 * i) * LDN + blc, row, blc, D - d0, vec_kv, kv);
    }
    cp_async_commit();
  };
  // This thread's outputs: rows tm + 8 i, channels tn * 4 + {0..3} (half 0) and 64 + tn * 4 + {0..3} (half 1).
  const auto acc_at = [&](int i, int half) {
    return reinterpret_cast<float4*>(accs + (tm + 8 * i) * TN + half * 64 + tn * 4);
  };
  float pv[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    *acc_at(i, 0) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *acc_at(i, 1) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < 8; ++j) pv[i][j] = 0.0f;
  }
  const int64_t chunks = (K + KC - 1) / KC;
  if (chunks > 0) stage(0, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const int buf = static_cast<int>(c & 1);
    if (c + 1 < chunks) {
      stage(buf ^ 1, (c + 1) * KC);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* a_s = As + buf * TM * LDK;
    const float* b_s = Bs + buf * KC * LDN;
#pragma unroll
    for (int kk = 0; kk < KC; kk += 4) {
      float4 a[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = *reinterpret_cast<const float4*>(a_s + (tm + 8 * i) * LDK + kk);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // j = c * KC + kk + e, in order
        const float4 b0 = *reinterpret_cast<const float4*>(b_s + (kk + e) * LDN + tn * 4);
        const float4 b1 = *reinterpret_cast<const float4*>(b_s + (kk + e) * LDN + 64 + tn * 4);
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) pv[i][j] = __fmaf_rn(comp(a[i], e), b[j], pv[i][j]);
        }
      }
    }
    __syncthreads();
    const int64_t kend = (c + 1) * KC;
    if (kend % kBlock == 0 || kend >= K) {  // the end of softmax block b
      const int64_t b = (kend - 1) / kBlock;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int64_t h = h0 + tm + 8 * i;
        const float r = h < H ? rescale[(t * H + h) * blocks + b] : 1.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float4 a4 = *acc_at(i, half);
          const float* v = pv[i] + 4 * half;
          a4.x = __fadd_rn(__fmul_rn(a4.x, r), v[0]);
          a4.y = __fadd_rn(__fmul_rn(a4.y, r), v[1]);
          a4.z = __fadd_rn(__fmul_rn(a4.z, r), v[2]);
          a4.w = __fadd_rn(__fmul_rn(a4.w, r), v[3]);
          *acc_at(i, half) = a4;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) pv[i][j] = 0.0f;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t h = h0 + tm + 8 * i;
    if (h >= H) continue;
    const float lh = l[t * H + h];
    float* o = out + (t * H + h) * D + d0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float4 a4 = *acc_at(i, half);
      const float v[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = half * 64 + tn * 4 + e;
        if (d0 + n < D) o[n] = formats::round_to_bf16(__fdiv_rn(v[e], lh));
      }
    }
  }
}

__global__ void index_rows_kernel(const int32_t* __restrict__ window, int64_t kw, const int32_t* __restrict__ topk,
                                  int64_t kt, int64_t rows, int64_t offset, int64_t width,
                                  int32_t* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cols = kw + width;
  if (k >= rows * cols) return;
  const int64_t t = k / cols, c = k % cols;
  int32_t v = -1;
  if (c < kw) {
    v = window[t * kw + c];
  } else if (c - kw < kt) {
    const int32_t x = topk[t * kt + (c - kw)];
    v = x < 0 ? -1 : static_cast<int32_t>(x + offset);
  }
  out[k] = v;
}

// (T * ceil(cols / TN), ceil(H / TM)) CTAs; throws when that exceeds the launch grid.
dim3 tile_grid(const char* what, int64_t cols, int64_t H, int64_t T) {
  const int64_t x = T * ((cols + TN - 1) / TN), y = (H + TM - 1) / TM;
  DSV41_CHECK(x <= 0x7fffffff && y <= 65535, what, ": ", T, " queries x ", H, " heads x ", cols,
              " columns exceed the launch grid");
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

}  // namespace

void sparse_attn_scores(const float* q, const float* kv, const int32_t* idxs, int64_t T, int64_t H, int64_t D,
                        int64_t K, float scale, float* s) {
  if (T * H * K == 0) return;
  const bool vec = D % 4 == 0 && aligned16(q) && aligned16(kv);
  DSV41_CUDA_CHECK(cudaFuncSetAttribute(sparse_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kScoresSmem)));
  sparse_scores_kernel<<<tile_grid("sparse_attn_scores", K, H, T), kThreads, kScoresSmem>>>(q, kv, idxs, H, D, K,
                                                                                          scale, vec, s);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void sparse_attn_softmax(const float* s, const float* sink, int64_t T, int64_t H, int64_t K, float* p,
                         float* rescale, float* l) {
  const int64_t rows = T * H;
  if (rows == 0) return;
  sparse_softmax_kernel<<<grid_for(rows, kSoftmaxRows), kThreads>>>(s, sink, rows, H, K, p, rescale, l);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void sparse_attn_pv(const float* kv, const int32_t* idxs, const float* p, const float* rescale, const float* l,
                    int64_t T, int64_t H, int64_t D, int64_t K, float* out) {
  if (T * H * D == 0) return;
  const bool vec_p = K % 4 == 0 && aligned16(p), vec_kv = D % 4 == 0 && aligned16(kv);
  DSV41_CUDA_CHECK(cudaFuncSetAttribute(sparse_pv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kPvSmem)));
  sparse_pv_kernel<<<tile_grid("sparse_attn_pv", D, H, T), kThreads, kPvSmem>>>(kv, idxs, p, rescale, l, H, D, K,
                                                                                vec_p, vec_kv, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void attention_index_rows(const int32_t* window, int64_t kw, const int32_t* topk, int64_t kt, int64_t rows,
                          int64_t offset, int64_t width, int32_t* out) {
  if (rows * (kw + width) == 0) return;
  index_rows_kernel<<<grid_for(rows * (kw + width), kThreads), kThreads>>>(window, kw, topk, kt, rows, offset,
                                                                           width, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
