// cuda/indexer.cu ↔ reference/indexer.cc (index_weights, index_scores)
//
// index_weights: one thread per value: bf16(proj * scale), one fp32 multiply (the scale is the
//   reference's index_weight_scale, computed on the host): BIT-EXACT.
// index_scores (reference semantics): per head h in order, dot = bf16(fp32(double sum of q[d] * k[d]
//   in d order)), term = bf16(relu(dot) * w[h]) with relu as `dot > 0 ? dot : 0`, sum += term in
//   fp32; score = bf16(sum); -inf at and beyond the query's reach: BIT-EXACT, on two paths.
//
// The exact path (index_scores_exact): one thread per (query, key), the reference's arithmetic
//   (__dadd_rn/__dmul_rn, one rounding like dot_f64_f32). It serves every pair the fast path cannot
//   prove exact, and whole calls with heads > 32 or d > 128.
//
// The fast path (int8 tensor cores, mma.sync m16n8k32 s8 x s8 -> s32). A row (one (query, head) of
//   q, or one key) is ENCODED when all of its values are finite and, with e = the smallest exponent
//   of the lowest set bit over its nonzero values (e = 0 for an all-zero row), every value is
//   v = c * 2^e with an integer |c| <= 127, and -30 <= e <= 30 (indexer_row_encode). FP4-QDQ rows
//   (E2M1 codes x E8M0 scales, semantics.md §2.5) are encoded whenever the E8M0 scales of their
//   32-channel blocks span at most a factor 8 (2 * 6 * 8 = 96 <= 127); arbitrary bf16 rows are not.
//   For an encoded query row (codes cq, exponent eq) and key (ck, ek), d <= 128:
//   - I = sum_d cq*ck is an exact int32 (|I| <= 128 * 127^2 < 2^21), whatever the mma's order.
//   - The exact dot is I * 2^(eq+ek): every product q[d]*k[d] is exact in double and every partial
//     sum of the reference is a multiple of 2^(eq+ek) below 2^21 * 2^(eq+ek), so the double sum is
//     exact; |I| < 2^24 and -60 <= eq+ek <= 60 make it an exact, normal (or zero) fp32: the
//     reference's dot before bf16 is exactly I * 2^(eq+ek).
//   - Scaling by powers of two commutes with bf16 and fp32 rounding while every value stays normal
//     or zero. With w' = w * 2^eq (exact) and w = 0 or 2^-40 <= |w| < 2^41 (else the query row is not
//     encoded), every true value (dot in [2^-60, 2^81), term in [2^-100, 2^122), sums below 2^127
//     and, being sums of multiples of 2^-107, either zero or >= 2^-107) and every scaled one (bf16(I)
//     in [1, 2^21], bf16(I)*w' in [2^-70, 2^92]) is normal or zero, so both round alike, so term = bf16(relu(bf16(I)) * w') * 2^ek and score = bf16(sum_h in order of those
//     terms) * 2^ek, bit for bit. The kernel computes exactly that; relu may return -0 (fmaxf), and
//     a -0 term never changes an fp32 sum that starts at +0, as in the reference.
//   - A query whose 32 head rows are not all encoded, or a key that is not, sends its pairs to the
//     exact path; index_scores_last_path counts them (the tests assert none for FP4-QDQ inputs).
//   Layout: a CTA holds 128 keys (4 warps x 32 keys, the key codes as B fragments in registers) and
//   walks groups of 8 queries; a group's codes [32 heads][8 queries][128] int8 (32 KB) are staged in
//   shared memory by cp.async, double buffered, 16-byte chunks XOR-swizzled by the query so
//   ldmatrix is conflict free. A warp's mma rows are 8 queries x 8 heads (row r of m-tile i: query
//   r % 8, head 8*hg + 2i + r / 8), so each thread's accumulators are one query's 8 heads in order
//   and the fp32 head sum stays in registers across the 4 head groups.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;

constexpr int kSlotD = 128;                           // channel slots of an encoded row (d <= 128)
constexpr int kSlotHeads = 32;                        // head slots of a query (heads <= 32; w' = 0 past heads)
constexpr int kGroup = 8;                             // queries per group
constexpr int kWarps = 4;
constexpr int kWarpKeys = 32;
constexpr int kTileKeys = kWarps * kWarpKeys;         // 128 keys per CTA
constexpr int kGroupBytes = kGroup * kSlotHeads * kSlotD;  // 32 KB of query codes per group
constexpr int kEBound = 30;                           // |e| of an encoded row
constexpr int kWExpBound = 40;                        // w = 0 or 2^-40 <= |w| < 2^41

__global__ void index_weights_kernel(const float* __restrict__ proj, int64_t n, float scale, float* __restrict__ w) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) w[k] = formats::round_to_bf16(__fmul_rn(proj[k], scale));
}

// The reference's score of (t, j), j < reach[t].
__device__ float exact_score(const float* __restrict__ q, const float* __restrict__ keys, const float* __restrict__ w,
                             int64_t t, int64_t j, int64_t heads, int64_t d) {
  const float* key = keys + j * d;
  float sum = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qr = q + (t * heads + h) * d;
    double acc = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(qr[i]), static_cast<double>(key[i])));
    }
    const float dot = formats::round_to_bf16(__double2float_rn(acc));
    sum = __fadd_rn(sum, formats::round_to_bf16(__fmul_rn(dot > 0.0f ? dot : 0.0f, w[t * heads + h])));
  }
  return formats::round_to_bf16(sum);
}

__global__ void index_scores_exact_kernel(const float* __restrict__ q, const float* __restrict__ keys,
                                          const float* __restrict__ w, const int64_t* __restrict__ reach, int64_t T,
                                          int64_t heads, int64_t d, int64_t n, float* __restrict__ scores) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n) return;
  const int64_t t = k / n, j = k % n;
  scores[k] = j >= reach[t] ? -INFINITY : exact_score(q, keys, w, t, j, heads, d);
}

// The pairs the fast path left: every key of the listed queries, then the listed keys of the other
// queries; counts = {listed queries, listed keys}.
__global__ void index_scores_rest_kernel(const float* __restrict__ q, const float* __restrict__ keys,
                                         const float* __restrict__ w, const int64_t* __restrict__ reach, int64_t T,
                                         int64_t heads, int64_t d, int64_t n, const int* __restrict__ slow_q,
                                         const int* __restrict__ slow_k, const int* __restrict__ counts,
                                         const uint8_t* __restrict__ q_fast, float* __restrict__ scores) {
  const int64_t nq = counts[0], nk = counts[1];
  const int64_t items = nq * n + T * nk;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t t, j;
    if (i < nq * n) {
      t = slow_q[i / n], j = i % n;
    } else {
      t = (i - nq * n) / nk, j = slow_k[(i - nq * n) % nk];
      if (!q_fast[t]) continue;  // done with the listed queries
    }
    if (j < reach[t]) scores[t * n + j] = exact_score(q, keys, w, t, j, heads, d);
  }
}

__device__ inline float exp2i(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }  // |e| <= 126

// Encodes one row of up to 128 values, 4 per lane (lane L holds slots 4L .. 4L+3, zero padded):
// codes[i] = v[i] / 2^e, see the top of the file. Returns whether the row is encoded (warp-uniform);
// *e_out is its exponent (0 when not encoded).
__device__ bool indexer_row_encode(const float (&v)[4], char4* codes, int* e_out) {
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

// One block (8 warps) per query slot t < T8 (a multiple of 8): codes [T8][32][128] int8, w' [T8][32]
// (0 past `heads` and for query slots >= T), q_fast [T8]; queries not encoded appended to slow_q.
__global__ void __launch_bounds__(256) index_query_encode_kernel(const float* __restrict__ q,
                                                                 const float* __restrict__ w, int64_t T, int64_t heads,
                                                                 int64_t d, int8_t* __restrict__ codes,
                                                                 float* __restrict__ w_scaled,
                                                                 uint8_t* __restrict__ q_fast, int* __restrict__ slow_q,
                                                                 int* __restrict__ counts) {
  __shared__ int slow;
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) slow = 0;
  __syncthreads();
  for (int h = warp; h < kSlotHeads; h += 8) {
    const bool live = t < T && h < heads;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = lane * 4 + i;
      v[i] = live && c < d ? q[(t * heads + h) * d + c] : 0.0f;
    }
    char4 c4;
    int e;
    bool ok = indexer_row_encode(v, &c4, &e);
    reinterpret_cast<char4*>(codes + (t * kSlotHeads + h) * kSlotD)[lane] = c4;
    if (lane == 0) {
      const float wv = live ? w[t * heads + h] : 0.0f;
      const uint32_t wb = __float_as_uint(wv) & 0x7FFFFFFFu;
      const int we = static_cast<int>(wb >> 23) - 127;
      ok = ok && (wb == 0 || (wb < 0x7F800000u && we >= -kWExpBound && we <= kWExpBound));
      w_scaled[t * kSlotHeads + h] = ok ? __fmul_rn(wv, exp2i(e)) : 0.0f;
      if (!ok) atomicOr(&slow, 1);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    q_fast[t] = slow ? 0 : 1;
    if (slow) slow_q[atomicAdd(&counts[0], 1)] = static_cast<int>(t);
  }
}

// One warp per key slot j < N128 (a multiple of 128): codes [N128][128] int8, k_scale [N128] = 2^e
// (0: not encoded; keys >= n are zero rows); keys not encoded appended to slow_k.
__global__ void __launch_bounds__(256) index_key_encode_kernel(const float* __restrict__ keys, int64_t n, int64_t d,
                                                               int64_t slots, int8_t* __restrict__ codes,
                                                               float* __restrict__ k_scale, int* __restrict__ slow_k,
                                                               int* __restrict__ counts) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= slots) return;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane * 4 + i;
    v[i] = j < n && c < d ? keys[j * d + c] : 0.0f;
  }
  char4 c4;
  int e;
  const bool ok = indexer_row_encode(v, &c4, &e);
  reinterpret_cast<char4*>(codes + j * kSlotD)[lane] = c4;
  if (lane == 0) {
    k_scale[j] = ok ? exp2i(e) : 0.0f;
    if (!ok) slow_k[atomicAdd(&counts[1], 1)] = static_cast<int>(j);
  }
}

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ inline void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stages group `grp`'s query codes [8 queries][32 heads][128] (global) into shared memory as
// [32 heads][8 queries][128], chunk c of (head h, query q) at chunk c ^ q.
__device__ inline void stage_group(uint8_t* smem, const int8_t* __restrict__ codes, int64_t grp) {
  const int8_t* src = codes + grp * kGroupBytes;
#pragma unroll
  for (int it = 0; it < kGroupBytes / 16 / kThreads; ++it) {
    const int ci = it * kThreads + static_cast<int>(threadIdx.x);
    const int qq = ci / (kSlotHeads * 8), h = (ci / 8) % kSlotHeads, c = ci % 8;
    cp_async16(smem + (h * kGroup + qq) * kSlotD + ((c ^ qq) * 16), src + ci * 16);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

// term = bf16(relu(bf16(I)) * w') for two accumulators (see the top of the file).
__device__ inline float2 terms(int i0, int i1, float w) {
  // |I| < 2^22: the bits of 1.5 * 2^23 plus I are the float 1.5 * 2^23 + I exactly.
  const float x0 = __fsub_rn(__int_as_float(i0 + 0x4B400000), 12582912.0f);
  const float x1 = __fsub_rn(__int_as_float(i1 + 0x4B400000), 12582912.0f);
  const float2 b = __bfloat1622float2(__floats2bfloat162_rn(x0, x1));
  const float p0 = __fmul_rn(fmaxf(b.x, 0.0f), w), p1 = __fmul_rn(fmaxf(b.y, 0.0f), w);
  return __bfloat1622float2(__floats2bfloat162_rn(p0, p1));
}

__global__ void __launch_bounds__(kThreads, 3)
    index_scores_mma_kernel(const int8_t* __restrict__ q_codes, const float* __restrict__ w_scaled,
                            const uint8_t* __restrict__ q_fast, const int8_t* __restrict__ k_codes,
                            const float* __restrict__ k_scale, const int64_t* __restrict__ reach, int64_t T,
                            int64_t n, int64_t groups_per_cta, float* __restrict__ scores) {
  extern __shared__ __align__(128) uint8_t smem[];  // [2][32 heads][8 queries][128] int8
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * kTileKeys + warp * kWarpKeys;
  const int64_t groups = (T + kGroup - 1) / kGroup;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * groups_per_cta;
  const int64_t end = min(groups, begin + groups_per_cta);
  if (begin >= end) return;

  stage_group(smem, q_codes, begin);
  uint32_t b[4][4][2];  // [n-tile][k-step][reg]: key nt*8 + g, channels 32 ks + 4 c4 (+16)
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int8_t* row = k_codes + (key0 + nt * 8 + g) * kSlotD + ks * 32 + c4 * 4;
      b[nt][ks][0] = __ldg(reinterpret_cast<const unsigned*>(row));
      b[nt][ks][1] = __ldg(reinterpret_cast<const unsigned*>(row + 16));
    }
  }
  float ksc[4][2];  // 2^ek of this thread's keys (0: not encoded or past n)
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) ksc[nt][e] = k_scale[key0 + nt * 8 + 2 * c4 + e];
  }

  int buf = 0;
  for (int64_t grp = begin; grp < end; ++grp) {
    if (grp + 1 < end) {
      stage_group(smem + (buf ^ 1) * kGroupBytes, q_codes, grp + 1);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const uint8_t* A = smem + buf * kGroupBytes;
    const int64_t t = grp * kGroup + g;
    const float* wq = w_scaled + t * kSlotHeads;
    float sum[4][2] = {};
#pragma unroll 1
    for (int hg = 0; hg < kSlotHeads / 8; ++hg) {
      int acc[4][4][4] = {};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t a[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int qq = lane & 7, h = hg * 8 + 2 * i + ((lane >> 3) & 1), ch = ks * 2 + (lane >> 4);
          ldmatrix_x4(a[i], A + (h * kGroup + qq) * kSlotD + ((ch ^ qq) * 16));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_s8(acc[i][nt], a[i], b[nt][ks][0], b[nt][ks][1]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // heads 8 hg + 2i (c0, c1) then 8 hg + 2i + 1 (c2, c3): head order
        const float w0 = wq[hg * 8 + 2 * i], w1 = wq[hg * 8 + 2 * i + 1];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float2 t0 = terms(acc[i][nt][0], acc[i][nt][1], w0);
          sum[nt][0] = __fadd_rn(sum[nt][0], t0.x);
          sum[nt][1] = __fadd_rn(sum[nt][1], t0.y);
          const float2 t1 = terms(acc[i][nt][2], acc[i][nt][3], w1);
          sum[nt][0] = __fadd_rn(sum[nt][0], t1.x);
          sum[nt][1] = __fadd_rn(sum[nt][1], t1.y);
        }
      }
    }
    if (t < T) {
      const int64_t r = reach[t];
      const bool qf = q_fast[t] != 0;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t j = key0 + nt * 8 + 2 * c4 + e;
          if (j >= n) continue;
          if (j >= r) {
            scores[t * n + j] = -INFINITY;
          } else if (qf && ksc[nt][e] != 0.0f) {
            scores[t * n + j] = __fmul_rn(formats::round_to_bf16(sum[nt][e]), ksc[nt][e]);
          }
        }
      }
    }
    __syncthreads();  // the buffer is free for the next-but-one group
    buf ^= 1;
  }
}

// Per-call scratch, kept between calls (grown as needed, one per device) so that timed calls
// allocate nothing.
struct DeviceScratch {
  void* p = nullptr;
  std::size_t bytes = 0;
};
struct Scratch {
  std::mutex mutex;
  std::map<int, DeviceScratch> device;
  int* counts_host = nullptr;  // pinned: {slow queries, slow keys} of the last call
  IndexScoresPath last;
};
Scratch& scratch() {
  static Scratch s;
  return s;
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

void index_weights(const float* proj, int64_t n, float scale, float* w) {
  if (n == 0) return;
  index_weights_kernel<<<grid_for(n, kThreads), kThreads>>>(proj, n, scale, w);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void index_scores(const float* q, const float* keys, const float* w, const int64_t* reach, int64_t T, int64_t heads,
                  int64_t d, int64_t n, float* scores) {
  Scratch& s = scratch();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.last = IndexScoresPath{};
  s.last.queries = T;
  s.last.keys = n;
  if (T * n == 0) return;
  if (heads > kSlotHeads || d > kSlotD) {  // no fast path for this shape
    index_scores_exact_kernel<<<grid_for(T * n, kThreads), kThreads>>>(q, keys, w, reach, T, heads, d, n, scores);
    DSV41_CUDA_CHECK(cudaGetLastError());
    s.last.slow_queries = T;
    s.last.slow_keys = n;
    return;
  }
  const int64_t groups = (T + kGroup - 1) / kGroup, t_slots = groups * kGroup;
  const int64_t tiles = (n + kTileKeys - 1) / kTileKeys, k_slots = tiles * kTileKeys;
  const std::size_t o_qc = 0, o_ws = o_qc + align256(static_cast<std::size_t>(t_slots) * kSlotHeads * kSlotD),
                    o_qf = o_ws + align256(static_cast<std::size_t>(t_slots) * kSlotHeads * 4),
                    o_kc = o_qf + align256(static_cast<std::size_t>(t_slots)),
                    o_ks = o_kc + align256(static_cast<std::size_t>(k_slots) * kSlotD),
                    o_sq = o_ks + align256(static_cast<std::size_t>(k_slots) * 4),
                    o_sk = o_sq + align256(static_cast<std::size_t>(T) * 4),
                    o_ct = o_sk + align256(static_cast<std::size_t>(n) * 4), total = o_ct + 256;
  int device = 0;
  DSV41_CUDA_CHECK(cudaGetDevice(&device));
  DeviceScratch& ds = s.device[device];
  if (ds.bytes < total) {
    DSV41_CUDA_CHECK(cudaDeviceSynchronize());  // earlier calls may still use the old scratch
    if (ds.p != nullptr) DSV41_CUDA_CHECK(cudaFree(ds.p));
    ds.p = nullptr;
    ds.bytes = 0;
    DSV41_CUDA_CHECK(cudaMalloc(&ds.p, total));
    ds.bytes = total;
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(index_scores_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          2 * kGroupBytes));
  }
  if (s.counts_host == nullptr) {
    DSV41_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s.counts_host), 2 * sizeof(int), cudaHostAllocPortable));
  }
  uint8_t* base = static_cast<uint8_t*>(ds.p);
  auto* q_codes = reinterpret_cast<int8_t*>(base + o_qc);
  auto* w_scaled = reinterpret_cast<float*>(base + o_ws);
  auto* q_fast = base + o_qf;
  auto* k_codes = reinterpret_cast<int8_t*>(base + o_kc);
  auto* k_scale = reinterpret_cast<float*>(base + o_ks);
  auto* slow_q = reinterpret_cast<int*>(base + o_sq);
  auto* slow_k = reinterpret_cast<int*>(base + o_sk);
  auto* counts = reinterpret_cast<int*>(base + o_ct);
  DSV41_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(int)));
  index_query_encode_kernel<<<static_cast<unsigned>(t_slots), 256>>>(q, w, T, heads, d, q_codes, w_scaled, q_fast,
                                                                      slow_q, counts);
  DSV41_CUDA_CHECK(cudaGetLastError());
  index_key_encode_kernel<<<static_cast<unsigned>(k_slots / 8), 256>>>(keys, n, d, k_slots, k_codes, k_scale, slow_k,
                                                                        counts);
  DSV41_CUDA_CHECK(cudaGetLastError());
  // About 4 waves of 3 CTAs per SM on an H200 (132 SMs), at most 16 groups per CTA.
  int64_t per_cta = std::max<int64_t>(1, std::min<int64_t>(16, groups * tiles / (132 * 3 * 4)));
  per_cta = std::max<int64_t>(per_cta, (groups + 65534) / 65535);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((groups + per_cta - 1) / per_cta));
  index_scores_mma_kernel<<<grid, kThreads, 2 * kGroupBytes>>>(q_codes, w_scaled, q_fast, k_codes, k_scale, reach, T,
                                                                n, per_cta, scores);
  DSV41_CUDA_CHECK(cudaGetLastError());
  index_scores_rest_kernel<<<264, 256>>>(q, keys, w, reach, T, heads, d, n, slow_q, slow_k, counts, q_fast, scores);
  DSV41_CUDA_CHECK(cudaGetLastError());
  DSV41_CUDA_CHECK(cudaMemcpyAsync(s.counts_host, counts, 2 * sizeof(int), cudaMemcpyDeviceToHost));
  s.last.mma = true;
  s.last.slow_queries = -1;  // read back by index_scores_last_path
}

IndexScoresPath index_scores_last_path() {
  Scratch& s = scratch();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.last.slow_queries < 0) {
    DSV41_CUDA_CHECK(cudaDeviceSynchronize());
    s.last.slow_queries = s.counts_host[0];
    s.last.slow_keys = s.counts_host[1];
  }
  return s.last;
}

}  // namespace dsv41::gpu
