// cuda/indexer.cu ↔ reference/ops/indexer.cc (index_weights, index_scores)
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
//   (E2M1 codes x E8M0 scales, semantics.md §2.5: every value is m * s_b / 2 with |m| <= 12) are
//   encoded whenever the E8M0 scales s_b of their 32-channel blocks span at most a factor 8
//   (12 * 8 = 96 <= 127); arbitrary bf16 rows are not (8 significant bits). A query row also needs
//   its weight w to be a bf16 value that is 0 or 2^-40 <= |w| < 2^41. For an encoded query row
//   (codes cq, exponent eq) and key (ck, ek), d <= 128:
//   - I = sum_d cq*ck is an exact int32 in any order: |I| <= 128 * 127^2 < 2^21 (21 bits).
//   - The reference's dot is exactly I * 2^(eq+ek): every product q[d]*k[d] is exact in double (at
//     most 14 significant bits) and every partial sum of its double sum is a multiple of 2^(eq+ek)
//     below 2^21 * 2^(eq+ek), so the double sum is exact; |I| < 2^24 and -60 <= eq+ek <= 60 make it
//     an exact, normal (or zero) fp32.
//   - Multiplying by a power of two commutes with bf16 and fp32 rounding while all values stay normal
//     or zero. Let w' = w * 2^eq (exact, bf16). Every true value (dot in [2^-60, 2^81), term in
//     [2^-100, 2^122), partial sums below 32 * 2^122 = 2^127, and as sums of bf16 terms >= 2^-100
//     multiples of 2^-107, so zero or normal) and every value scaled by 2^-ek (bf16(I) in [1, 2^21],
//     bf16(I) * |w'| in [2^-70, 2^92], sums below 2^97 and zero or >= 2^-77) is normal or zero, so
//     term = bf16(relu(bf16(I)) * w') * 2^ek and score = bf16(sum over heads in order of
//     bf16(relu(bf16(I)) * w')) * 2^ek, bit for bit.
//   - The kernel computes exactly that: bf16(I) by one cvt (I is exact in fp32); bf16(relu(bf16(I))
//     * |w'|) by one bf16x2 FMA with relu (bf16(I) * |w'| is an 8-bit x 8-bit product, exact, so one
//     rounding to bf16 equals the reference's fp32 product then bf16); sum = fma(that, sign(w'), sum)
//     (exactly sum + term, one rounding); a clamped negative product is the 0 that relu gives for
//     w' >= 0, and for w' < 0 a +-0 term, which like the reference's -0 leaves an fp32 sum that
//     starts at +0 unchanged.
//   - A query with a head row not encoded, or a key not encoded, sends its pairs to the exact path;
//     index_scores_last_path counts them (the tests assert none for FP4-QDQ inputs).
//   Layout: units of 128 keys x 8 queries; persistent CTAs (as many as fit at once) take balanced
//   ranges of units. A CTA holds its 128 keys (4 warps x 32 keys, the key codes as B fragments in
//   registers, reloaded when the key tile changes); a unit's query codes [32 heads][8 queries][128]
//   int8 (32 KB) are staged in shared memory by cp.async, double buffered, 16-byte chunks
//   XOR-swizzled by the query so ldmatrix is conflict free. A warp's mma rows are 8 queries x 8 heads
//   (row r of m-tile i: query r % 8, head 8 hg + 2i + r / 8), so each thread's accumulators are one
//   query's 8 heads in head order and the fp32 head sum stays in registers across the 4 head groups.
//   An encode pre-pass (one launch) writes the codes, 2^ek and w'; a last launch runs the exact path
//   on what is left.

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/indexer_mma.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

using namespace indexer_mma;

constexpr int kThreads = 128;

constexpr int kSlotHeads = 32;                        // head slots of a query (heads <= 32; w' = 0 past heads)
constexpr int kGroup = 8;                             // queries per group
constexpr int kWarps = 4;
constexpr int kWarpKeys = 32;
constexpr int kTileKeys = kWarps * kWarpKeys;         // 128 keys per CTA
constexpr int kGroupBytes = kGroup * kSlotHeads * kSlotD;  // 32 KB of query codes per group

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
// queries; counts = {listed queries, listed keys}; zeroes next_counts (the next call's).
__global__ void index_scores_rest_kernel(const float* __restrict__ q, const float* __restrict__ keys,
                                         const float* __restrict__ w, const int64_t* __restrict__ reach, int64_t T,
                                         int64_t heads, int64_t d, int64_t n, const int* __restrict__ slow_q,
                                         const int* __restrict__ slow_k, const int* __restrict__ counts,
                                         int* __restrict__ next_counts, const uint8_t* __restrict__ q_fast,
                                         float* __restrict__ scores) {
  const int64_t nq = counts[0], nk = counts[1];
  if (blockIdx.x == 0 && threadIdx.x < 2) next_counts[threadIdx.x] = 0;
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




// Blocks [0, T8) (T8 = queries rounded up to 8): one per query slot t, 8 warps over its 32 head rows:
// q_codes [T8][32][128] int8, w_pair [T8][32] = {|w'| as bf16 twice (bf16x2 bits), sign of w' as
// +-1} (zeros past `heads` and for slots >= T), q_fast [T8]; queries not encoded go to slow_q.
// Blocks [T8, T8 + N128 / 8): one warp per key slot j < N128 (keys rounded up to 128): k_codes
// [N128][128] int8, k_scale [N128] = 2^e (0: not encoded; slots >= n are zero rows); keys not
// encoded go to slow_k. counts = {slow queries, slow keys} (zero on entry).
__global__ void __launch_bounds__(256)
    index_encode_kernel(const float* __restrict__ q, const float* __restrict__ w, const float* __restrict__ keys,
                        int64_t T, int64_t heads, int64_t d, int64_t n, int64_t t_slots, int8_t* __restrict__ q_codes,
                        float2* __restrict__ w_pair, uint8_t* __restrict__ q_fast, int8_t* __restrict__ k_codes,
                        float* __restrict__ k_scale, int* __restrict__ slow_q, int* __restrict__ slow_k,
                        int* __restrict__ counts) {
  __shared__ int slow;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (static_cast<int64_t>(blockIdx.x) >= t_slots) {  // keys
    const int64_t j = (static_cast<int64_t>(blockIdx.x) - t_slots) * 8 + warp;
    float v[4];
    load_row(keys + j * d, j < n, d, lane, v);
    char4 c4;
    int e;
    const bool ok = indexer_row_encode(v, &c4, &e);
    reinterpret_cast<char4*>(k_codes + j * kSlotD)[lane] = c4;
    if (lane == 0) {
      k_scale[j] = ok ? exp2i(e) : 0.0f;
      if (!ok) slow_k[atomicAdd(&counts[1], 1)] = static_cast<int>(j);
    }
    return;
  }
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) slow = 0;
  __syncthreads();
  for (int h = warp; h < kSlotHeads; h += 8) {
    const bool live = t < T && h < heads;
    float v[4];
    load_row(q + (t * heads + h) * d, live, d, lane, v);
    char4 c4;
    int e;
    bool ok = indexer_row_encode(v, &c4, &e);
    reinterpret_cast<char4*>(q_codes + (t * kSlotHeads + h) * kSlotD)[lane] = c4;
    if (lane == 0) {
      const uint32_t hi = indexer_weight_code(live ? w[t * heads + h] : 0.0f, e, &ok);  // w' = w 2^e, exact
      w_pair[t * kSlotHeads + h] = make_float2(__uint_as_float((hi & 0x7FFFu) | ((hi & 0x7FFFu) << 16)),
                                               (hi & 0x8000u) != 0 ? -1.0f : 1.0f);
      if (!ok) atomicOr(&slow, 1);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    q_fast[t] = slow ? 0 : 1;
    if (slow) slow_q[atomicAdd(&counts[0], 1)] = static_cast<int>(t);
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



// sum_e += term of accumulators i0, i1 (keys 2 c4, 2 c4 + 1) of one head with w_pair wp: bf16(I)
// (one cvt for both), bf16(relu(bf16(I)) * |w'|) (one bf16x2 FMA with relu: the exact product is
// rounded once, as bf16(fp32 product) is, the fp32 product being exact), then sum += sign(w') * that
// (one rounding, as sum + term is; a negative product clamps to 0, which w' >= 0 wants, and a 0
// term for w' < 0 is the -0 or +0 that leaves the sum as it is).
__device__ inline void add_terms(int i0, int i1, float2 wp, float& s0, float& s1) {
  const float x0 = __fsub_rn(__int_as_float(i0), 12582912.0f), x1 = __fsub_rn(__int_as_float(i1), 12582912.0f);
  const __nv_bfloat162 b = __floats2bfloat162_rn(x0, x1);  // .x = bf16(x0) (low half), .y = bf16(x1)
  __nv_bfloat162 w2, zero;
  const uint32_t wbits = __float_as_uint(wp.x), zbits = 0;
  memcpy(&w2, &wbits, 4);
  memcpy(&zero, &zbits, 4);
  const __nv_bfloat162 p = __hfma2_relu(b, w2, zero);
  uint32_t u;
  memcpy(&u, &p, 4);
  s0 = __fmaf_rn(__uint_as_float(u << 16), wp.y, s0);
  s1 = __fmaf_rn(__uint_as_float(u & 0xFFFF0000u), wp.y, s1);
}

__global__ void __launch_bounds__(kThreads, 3)
    index_scores_mma_kernel(const int8_t* __restrict__ q_codes, const float2* __restrict__ w_pair,
                            const uint8_t* __restrict__ q_fast, const int8_t* __restrict__ k_codes,
                            const float* __restrict__ k_scale, const int64_t* __restrict__ reach, int64_t T,
                            int64_t n, int64_t units, float* __restrict__ scores) {
  extern __shared__ __align__(128) uint8_t smem[];  // [2][32 heads][8 queries][128] int8
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c4 = lane % 4;
  const int64_t groups = (T + kGroup - 1) / kGroup;
  // Persistent CTAs: CTA c takes units [c U / C, (c + 1) U / C) of the U = tiles x groups units
  // (key tile u / groups, query group u % groups), so the last wave has no tail.
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * units / gridDim.x;
  const int64_t end = static_cast<int64_t>(blockIdx.x + 1) * units / gridDim.x;
  if (begin >= end) return;

  stage_group(smem, q_codes, begin % groups);
  uint32_t b[4][4][2];  // [n-tile][k-step][reg]: key nt*8 + g, channels 32 ks + 4 c4 (+16)
  int64_t tile = -1, key0 = 0;
  int buf = 0;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t grp = u % groups;
    if (u / groups != tile) {  // this warp's 32 keys of the new tile as B fragments
      tile = u / groups;
      key0 = tile * kTileKeys + warp * kWarpKeys;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int8_t* row = k_codes + (key0 + nt * 8 + g) * kSlotD + ks * 32 + c4 * 4;
          b[nt][ks][0] = __ldg(reinterpret_cast<const unsigned*>(row));
          b[nt][ks][1] = __ldg(reinterpret_cast<const unsigned*>(row + 16));
        }
      }
    }
    if (u + 1 < end) {
      stage_group(smem + (buf ^ 1) * kGroupBytes, q_codes, (u + 1) % groups);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const uint8_t* A = smem + buf * kGroupBytes;
    const int64_t t = grp * kGroup + g;
    const float2* wq = w_pair + t * kSlotHeads;
    float sum[4][2] = {};
#pragma unroll 1
    for (int hg = 0; hg < kSlotHeads / 8; ++hg) {
      int acc[4][4][4];
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
          for (int nt = 0; nt < 4; ++nt) {
            if (ks == 0) mma_s8_first(acc[i][nt], a[i], b[nt][ks][0], b[nt][ks][1]);
            else mma_s8(acc[i][nt], a[i], b[nt][ks][0], b[nt][ks][1]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // heads 8 hg + 2i (c0, c1) then 8 hg + 2i + 1 (c2, c3): head order
        const float2 w0 = wq[hg * 8 + 2 * i], w1 = wq[hg * 8 + 2 * i + 1];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          add_terms(acc[i][nt][0], acc[i][nt][1], w0, sum[nt][0], sum[nt][1]);
          add_terms(acc[i][nt][2], acc[i][nt][3], w1, sum[nt][0], sum[nt][1]);
        }
      }
    }
    if (t < T) {
      const int64_t r = reach[t];
      const bool qf = q_fast[t] != 0;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t j0 = key0 + nt * 8 + 2 * c4;  // even; k_scale has N128 entries
        const float2 ks2 = *reinterpret_cast<const float2*>(k_scale + j0);  // 2^ek (0: the key is not encoded)
        const __nv_bfloat162 sb = __floats2bfloat162_rn(sum[nt][0], sum[nt][1]);  // finite sums: RNE like round_to_bf16
        uint32_t sbits;
        memcpy(&sbits, &sb, 4);
        const float ks[2] = {ks2.x, ks2.y};
        float v[2] = {__uint_as_float(sbits << 16), __uint_as_float(sbits & 0xFFFF0000u)};
        bool put[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t j = j0 + e;
          v[e] = j >= r ? -INFINITY : __fmul_rn(v[e], ks[e]);
          put[e] = j < n && (j >= r || (qf && ks[e] != 0.0f));  // the rest go to the exact path
        }
        float* out = scores + t * n + j0;
        if (put[0] && put[1] && n % 2 == 0) {
          *reinterpret_cast<float2*>(out) = make_float2(v[0], v[1]);
        } else {
          if (put[0]) out[0] = v[0];
          if (put[1]) out[1] = v[1];
        }
      }
    }
    __syncthreads();  // the buffer is free for the next-but-one unit
    buf ^= 1;
  }
}

// Per-call scratch, kept between calls (grown as needed, one per device) so that timed calls
// allocate nothing.
struct DeviceScratch {
  void* p = nullptr;
  std::size_t bytes = 0;
  int* counts = nullptr;  // [2][2]: call parity x {slow queries, slow keys}; zeroed at allocation, and
  int parity = 0;         // each call's rest kernel zeroes the other half for the next call
  int64_t resident_ctas = 0;  // of index_scores_mma_kernel: SMs x CTAs per SM
};
struct Scratch {
  std::mutex mutex;
  std::map<int, DeviceScratch> device;
  IndexScoresPath last;
  const int* last_counts = nullptr;  // the device counts of the last fast-path call
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
  s.last_counts = nullptr;
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
  const std::size_t o_qc = 0, o_wp = o_qc + align256(static_cast<std::size_t>(t_slots) * kSlotHeads * kSlotD),
                    o_qf = o_wp + align256(static_cast<std::size_t>(t_slots) * kSlotHeads * 8),
                    o_kc = o_qf + align256(static_cast<std::size_t>(t_slots)),
                    o_ks = o_kc + align256(static_cast<std::size_t>(k_slots) * kSlotD),
                    o_sq = o_ks + align256(static_cast<std::size_t>(k_slots) * 4),
                    o_sk = o_sq + align256(static_cast<std::size_t>(T) * 4),
                    total = o_sk + align256(static_cast<std::size_t>(n) * 4);
  int device = 0;
  DSV41_CUDA_CHECK(cudaGetDevice(&device));
  DeviceScratch& ds = s.device[device];
  if (ds.counts == nullptr) {
    DSV41_CUDA_CHECK(cudaMalloc(&ds.counts, 4 * sizeof(int)));
    DSV41_CUDA_CHECK(cudaMemset(ds.counts, 0, 4 * sizeof(int)));
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(index_scores_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          2 * kGroupBytes));
    int per_sm = 0, sms = 0;
    DSV41_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, index_scores_mma_kernel, kThreads, 2 * kGroupBytes));
    DSV41_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    ds.resident_ctas = std::max(1, per_sm) * std::max(1, sms);
  }
  if (ds.bytes < total) {
    synchronize();  // earlier calls may still use the old scratch
    if (ds.p != nullptr) DSV41_CUDA_CHECK(cudaFree(ds.p));
    ds.p = nullptr;
    ds.bytes = 0;
    DSV41_CUDA_CHECK(cudaMalloc(&ds.p, total));
    ds.bytes = total;
  }
  uint8_t* base = static_cast<uint8_t*>(ds.p);
  auto* q_codes = reinterpret_cast<int8_t*>(base + o_qc);
  auto* w_pair = reinterpret_cast<float2*>(base + o_wp);
  auto* q_fast = base + o_qf;
  auto* k_codes = reinterpret_cast<int8_t*>(base + o_kc);
  auto* k_scale = reinterpret_cast<float*>(base + o_ks);
  auto* slow_q = reinterpret_cast<int*>(base + o_sq);
  auto* slow_k = reinterpret_cast<int*>(base + o_sk);
  int* counts = ds.counts + 2 * ds.parity;
  int* next_counts = ds.counts + 2 * (1 - ds.parity);
  ds.parity = 1 - ds.parity;
  index_encode_kernel<<<static_cast<unsigned>(t_slots + k_slots / 8), 256>>>(
      q, w, keys, T, heads, d, n, t_slots, q_codes, w_pair, q_fast, k_codes, k_scale, slow_q, slow_k, counts);
  DSV41_CUDA_CHECK(cudaGetLastError());
  const int64_t units = tiles * groups;  // one CTA per resident slot, each a balanced range of units
  const unsigned ctas = static_cast<unsigned>(std::min<int64_t>(units, ds.resident_ctas));
  index_scores_mma_kernel<<<ctas, kThreads, 2 * kGroupBytes>>>(q_codes, w_pair, q_fast, k_codes, k_scale, reach, T, n,
                                                               units, scores);
  DSV41_CUDA_CHECK(cudaGetLastError());
  index_scores_rest_kernel<<<264, 256>>>(q, keys, w, reach, T, heads, d, n, slow_q, slow_k, counts, next_counts,
                                         q_fast, scores);
  DSV41_CUDA_CHECK(cudaGetLastError());
  s.last.mma = true;
  s.last_counts = counts;
}

IndexScoresPath index_scores_last_path() {
  Scratch& s = scratch();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.last_counts != nullptr) {  // the counts stay valid until the call after next
    synchronize();
    int c[2];
    copy_to_host(c, s.last_counts, sizeof(c));
    s.last.slow_queries = c[0];
    s.last.slow_keys = c[1];
    s.last_counts = nullptr;
  }
  return s.last;
}

}  // namespace dsv41::gpu
