// cuda/index_select.cu: the PRODUCTION fused indexer (cuda/index_select.h says what it computes).
//
// Scores. A query row (t, h) is encoded as int8 codes cq with exponent eq (cuda/indexer_mma.cuh;
// FP4-QDQ rows always are when their block scales span at most a factor 8); a key entry's E2M1
// codes m (|2m| <= 12) with E8M0 block scales s_b become ck = 2m << (s_b - s_min), exponent
// s_min - 128 (s_min over the blocks holding a nonzero code), when those scales span at most a
// factor 8 (12 * 8 <= 127). Then the reference's dot
// is exactly I * 2^(eq + ek) with I = sum cq ck an int32 (|I| < 2^21) and, as cuda/indexer.cu
// proves for its fast path, term = 2^ek bf16(relu(bf16(I)) |w'|) sign(w') with w' = w 2^eq: so a
// key's score is bf16(2^ek * sum over heads of those terms). The kernel sums the heads in its own
// order (each thread 8 heads, then two shuffles): the only departure from the reference's
// arithmetic, the head sum's order (fp32, 32 terms), so the scores lie within the index_scores
// bound of docs/cuda.md and the selection is judged as a set with the tie band.
//
// Layout of one CTA (512 threads = 4 query rows x 4 warps; cluster rank s owns keys [s L, s L + L)):
//   - the row's query codes are B fragments in registers (32 heads x 128 channels: 32 registers);
//   - per chunk of 128 keys the CTA decodes the packed entries (one thread per 32-channel block)
//     into int8 rows of 144 bytes in shared memory (the 16-byte pad makes the A-fragment loads
//     conflict free) and 2^ek per key;
//   - warp w of a row takes 16-key tiles w, w + 4 of the chunk: 4 head groups x 4 channel steps of
//     mma.sync m16n8k32 (rows = 16 keys, columns = 8 heads); accumulators start at the bits of
//     1.5 * 2^23 so that each is the float 1.5 * 2^23 + I (one subtraction gives I);
//   - each (row, key) keeps only its bf16 score as a 16-bit ordered key in shared memory.
// Selection (cluster_select): per row, a two-pass 8-bit radix select whose histograms are summed
// over the cluster's CTAs through distributed shared memory, then the ties at the threshold taken
// lowest position first, and each pick's slot from scans within the CTA and counts across it.
#include "cuda/index_select.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "cuda/common.cuh"
#include "cuda/index_key_codes.h"
#include "cuda/indexer_mma.cuh"

namespace dsv41::gpu {
namespace {

namespace cg = cooperative_groups;
using namespace indexer_mma;

constexpr int kRows = 4;                     // query rows per CTA
constexpr int kTeamWarps = 4;                // warps per row
constexpr int kTeam = kTeamWarps * 32;       // threads per row
constexpr int kThreads = kRows * kTeam;      // 512
constexpr int kHeads = 32;                   // head slots (zero codes and weights past heads)
constexpr int kChunk = 128;                  // keys decoded per pass
constexpr int kRowBytes = 144;               // one decoded key in shared memory (128 codes + pad)
constexpr int kMaxCluster = 8;
constexpr int kMaxLocal = 8192;              // keys per CTA
constexpr int kKeysPerCta = 2048;            // the cluster grows until a CTA holds at most this
constexpr uint32_t kNegInfKey = 0x007Fu;     // ordered key of bf16 -inf
constexpr uint32_t kPosInfKey = 0xFF80u;     // ordered key of bf16 +inf
constexpr uint32_t kNone = 0x10000u;         // a threshold no key reaches (a row with k = 0)

// Workspace: [flag int, pad to 16][q codes T x 32 x 128][|w'| T x 32 bf16][sign(w') T x 32 fp32].
int64_t codes_offset() { return 16; }
int64_t wabs_offset(int64_t T) { return codes_offset() + T * kHeads * kSlotD; }
int64_t wsign_offset(int64_t T) { return wabs_offset(T) + T * kHeads * 2; }

struct Params {
  const int8_t* q_codes;    // [T][32][128]
  const uint32_t* w_abs;    // [T][16]: |w'| of heads 2i (low half) and 2i + 1, bf16x2
  const float* w_sign;      // [T][32]
  const uint8_t* keys;
  int64_t entry_bytes;
  int dim;
  const int64_t* reach;
  const uint8_t* pool;
  int64_t T, n, k, topk_blocks;
  int block_size;
  int L;                    // keys per CTA (a multiple of kChunk)
  int32_t* topk;
  uint8_t* mask;
  int* flag;
};

struct Shared {
  uint32_t hist[2][kRows][256];  // the two radix passes (read by the whole cluster)
  uint32_t cnt[kRows];           // this CTA's {above << 16 | ties} at the threshold (read by the cluster)
  uint32_t scan[kRows][kTeamWarps];
  uint32_t bin[kRows], before[kRows], thr[kRows], need[kRows];
  float kscale[kChunk];          // 2^ek of the chunk's keys
  int flag;
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

__device__ __forceinline__ uint32_t order_key(__nv_bfloat16 v) {  // a > b <=> key(a) > key(b); -0 == +0
  uint32_t b = __bfloat16_as_ushort(v);
  if (b == 0x8000u) b = 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

// Exclusive scan of v over the row's team (kTeam threads, in thread order); total = the team's sum.
// Every thread of the CTA calls it.
__device__ uint32_t team_scan(uint32_t v, Shared& sh, int r, int wi, int lane, uint32_t& total) {
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(~0u, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) sh.scan[r][wi] = x;
  __syncthreads();
  uint32_t base = 0, tot = 0;
#pragma unroll
  for (int i = 0; i < kTeamWarps; ++i) {
    const uint32_t s = sh.scan[r][i];
    base += i < wi ? s : 0;
    tot += s;
  }
  __syncthreads();
  total = tot;
  return base + x - v;
}

// One warp: over bins 255 .. 0, the bin at which the count from the top reaches k (1 <= k <= the
// total), summed over the cluster's histograms hist[pass][r]; writes sh.bin[r] and sh.before[r]
// (the count in the bins above it).
__device__ void find_bin(cg::cluster_group& cluster, Shared& sh, int pass, int r, uint32_t k, int lane) {
  uint32_t c[8], sum = 0;
  const unsigned ranks = cluster.num_blocks();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int bin = 255 - 8 * lane - j;
    c[j] = 0;
    for (unsigned q = 0; q < ranks; ++q) c[j] += cluster.map_shared_rank(&sh.hist[pass][r][bin], q)[0];
    sum += c[j];
  }
  uint32_t inc = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(~0u, inc, o);
    if (lane >= o) inc += y;
  }
  const unsigned hit = __ballot_sync(~0u, inc >= k);
  if (lane == __ffs(hit) - 1) {
    uint32_t cum = inc - sum;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (cum + c[j] >= k) {
        sh.bin[r] = 255 - 8 * lane - j;
        sh.before[r] = cum;
        break;
      }
      cum += c[j];
    }
  }
}

// Per row r of this CTA: the k_r best of the row's elements over the cluster (rank q holds the
// elements [q m_cap, q m_cap + m_cap), m_local of them here, ordered keys a[r * stride + i]), by
// key descending and lower element first; emit(i, slot) for each pick here, slot = its rank among
// the row's picks in element order. Every thread of the cluster calls it.
template <class Emit>
__device__ void cluster_select(cg::cluster_group& cluster, Shared& sh, const uint16_t* a, int stride, int m_local,
                               uint32_t k_r, const Emit& emit) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / kTeamWarps, wi = warp % kTeamWarps, tt = wi * 32 + lane;
  const uint16_t* row = a + static_cast<int64_t>(r) * stride;
  for (int i = static_cast<int>(threadIdx.x); i < 2 * kRows * 256; i += kThreads) (&sh.hist[0][0][0])[i] = 0;
  __syncthreads();
  for (int i = tt; i < m_local; i += kTeam) atomicAdd(&sh.hist[0][r][row[i] >> 8], 1u);
  cluster.sync();
  if (wi == 0 && k_r > 0) find_bin(cluster, sh, 0, r, k_r, lane);
  __syncthreads();
  const uint32_t b1 = sh.bin[r], above1 = sh.before[r];
  if (k_r > 0) {
    for (int i = tt; i < m_local; i += kTeam) {
      if ((row[i] >> 8) == b1) atomicAdd(&sh.hist[1][r][row[i] & 0xFFu], 1u);
    }
  }
  cluster.sync();
  if (wi == 0 && k_r > 0) find_bin(cluster, sh, 1, r, k_r - above1, lane);
  __syncthreads();
  if (tt == 0) {
    sh.thr[r] = k_r > 0 ? (b1 << 8) | sh.bin[r] : kNone;
    sh.need[r] = k_r > 0 ? k_r - above1 - sh.before[r] : 0;  // ties at the threshold to take (>= 1)
  }
  __syncthreads();
  // This thread's contiguous share of the CTA's elements (thread order = element order).
  const uint32_t thr = sh.thr[r], need = sh.need[r];
  const int per = (m_local + kTeam - 1) / kTeam, lo = min(m_local, tt * per), hi = min(m_local, lo + per);
  uint32_t above_t = 0, ties_t = 0;
  for (int i = lo; i < hi; ++i) {
    above_t += row[i] > thr;
    ties_t += row[i] == thr;
  }
  uint32_t tot;
  const uint32_t before_t = team_scan((above_t << 16) | ties_t, sh, r, wi, lane, tot);  // both < 2^16
  if (tt == 0) sh.cnt[r] = tot;
  cluster.sync();
  // Ties go to the lowest positions: CTAs of lower rank first, then threads in order.
  uint32_t ties_prev = 0, sel_prev = 0;
  for (unsigned q = 0; q < cluster.block_rank(); ++q) {
    const uint32_t c = cluster.map_shared_rank(&sh.cnt[r], q)[0];
    const uint32_t ties_q = c & 0xFFFFu, take = need > ties_prev ? min(ties_q, need - ties_prev) : 0;
    sel_prev += (c >> 16) + take;
    ties_prev += ties_q;
  }
  const uint32_t quota = need > ties_prev ? min(tot & 0xFFFFu, need - ties_prev) : 0;
  const uint32_t ties_before = before_t & 0xFFFFu;
  uint32_t allowed = quota > ties_before ? min(ties_t, quota - ties_before) : 0;
  uint32_t unused;
  uint32_t slot = sel_prev + team_scan(above_t + allowed, sh, r, wi, lane, unused);
  for (int i = lo; i < hi; ++i) {
    const uint32_t key = row[i];
    if (key > thr || (key == thr && allowed > 0)) {
      if (key == thr) --allowed;
      emit(i, slot++);
    }
  }
  cluster.sync();  // no CTA reads this one's histograms or counts any more
}

// sum += sign(w'_h) bf16(relu(bf16(I_h)) |w'_h|) for the two heads of accumulators i0, i1 (one key).
__device__ __forceinline__ void add_heads(int i0, int i1, uint32_t wabs2, float s0, float s1, float& sum) {
  const float x0 = __fsub_rn(__int_as_float(i0), 12582912.0f), x1 = __fsub_rn(__int_as_float(i1), 12582912.0f);
  const __nv_bfloat162 b = __floats2bfloat162_rn(x0, x1);  // low half: head 2i
  __nv_bfloat162 w2, zero;
  const uint32_t zbits = 0;
  memcpy(&w2, &wabs2, 4);
  memcpy(&zero, &zbits, 4);
  const __nv_bfloat162 p = __hfma2_relu(b, w2, zero);  // exact 8 x 8-bit products, one rounding each
  uint32_t u;
  memcpy(&u, &p, 4);
  sum = __fmaf_rn(__uint_as_float(u << 16), s0, sum);
  sum = __fmaf_rn(__uint_as_float(u & 0xFFFF0000u), s1, sum);
}

// One warp per (query, head slot): codes, |w'| and sign(w') (cuda/indexer.cu's index_encode_kernel
// rules); a live row it cannot encode sets *flag.
__global__ void __launch_bounds__(256) encode_queries_kernel(const float* __restrict__ q, const float* __restrict__ w,
                                                             int64_t T, int64_t heads, int64_t d,
                                                             int8_t* __restrict__ q_codes,
                                                             uint16_t* __restrict__ w_abs, float* __restrict__ w_sign,
                                                             int* __restrict__ flag) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= T * kHeads) return;
  const int64_t t = row / kHeads, h = row % kHeads;
  const bool live = h < heads;
  float v[4];
  load_row(q + (t * heads + h) * d, live, d, lane, v);
  char4 c4;
  int e;
  bool ok = indexer_row_encode(v, &c4, &e);
  reinterpret_cast<char4*>(q_codes + row * kSlotD)[lane] = c4;
  if (lane == 0) {
    const uint32_t hi = indexer_weight_code(live ? w[t * heads + h] : 0.0f, e, &ok);  // w' = w 2^e, exact
    w_abs[row] = static_cast<uint16_t>(hi & 0x7FFFu);
    w_sign[row] = (hi & 0x8000u) != 0 ? -1.0f : 1.0f;
    if (!ok) atomicOr(flag, 1);
  }
}

// Decodes keys [key0, key0 + kChunk) into codes (rows of kRowBytes) and sh.kscale: thread 4 j + b
// takes 32-channel block b of key j (kThreads = 4 kChunk). The key's exponent is its smallest E8M0
// scale over the blocks holding a nonzero code (an all-zero block contributes 0 at any scale); a key
// it cannot encode (scales spanning more than x8, a NaN scale, |exponent| > kEBound) sets sh.flag.
// Keys >= n and channels >= dim are zero.
__device__ void decode_chunk(const Params& p, int64_t key0, int8_t* codes, Shared& sh) {
  static_assert(kThreads == 4 * kChunk, "one thread per (key, block) of a chunk");
  const int j = static_cast<int>(threadIdx.x) / 4, b = static_cast<int>(threadIdx.x) % 4;
  const int64_t key = key0 + j;
  const bool live = key < p.n && b < p.dim / 32;
  uint32_t w[4] = {0, 0, 0, 0};
  int s = 0;
  if (live) {
    const uint8_t* e = p.keys + key * p.entry_bytes;
    const uint8_t* nib = e + b * 16;  // the block's 16 nibble bytes
    if ((reinterpret_cast<uintptr_t>(nib) & 3u) == 0) {  // entry_bytes % 4 == 0 (Di 128: 68 bytes)
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const uint32_t*>(nib + i * 4);
    } else {  // Di 32, 64, 96: 17, 34, 51-byte entries, not 4-byte aligned: byte loads
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i / 4] |= static_cast<uint32_t>(nib[i]) << (8 * (i % 4));
    }
    s = e[p.dim / 2 + b];
  }
  const bool nonzero = index_key_codes::block_nonzero(w);
  int smin = nonzero ? s : 255, smax = nonzero ? s : 0, nan = live && s == 255;
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {  // over the key's 4 lanes
    smin = min(smin, __shfl_xor_sync(~0u, smin, o));
    smax = max(smax, __shfl_xor_sync(~0u, smax, o));
    nan |= __shfl_xor_sync(~0u, nan, o);
  }
  if (!index_key_codes::key_encodable(smin, smax, nan != 0) && key < p.n) sh.flag = 1;
  uint32_t out[8];
  index_key_codes::expand_block(w, nonzero ? min(3, max(0, s - smin)) : 0, out);
  uint4* dst = reinterpret_cast<uint4*>(codes + j * kRowBytes + b * 32);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  if (b == 0) sh.kscale[j] = key < p.n ? exp2i(smin - 128) : 0.0f;
}

__global__ void __launch_bounds__(kThreads, 1) index_select_kernel(const Params p) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) uint8_t smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  int8_t* codes = reinterpret_cast<int8_t*>(smem + (sizeof(Shared) + 15) / 16 * 16);  // [kChunk][kRowBytes]
  uint16_t* sc = reinterpret_cast<uint16_t*>(codes + kChunk * kRowBytes);            // [kRows][L] score keys
  const int L = p.L, Lb = p.topk_blocks > 0 ? L / p.block_size : 0;
  uint16_t* blk = sc + kRows * L;                                                     // [kRows][Lb] block keys
  uint8_t* kept = reinterpret_cast<uint8_t*>(blk + kRows * Lb);                       // [kRows][Lb]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / kTeamWarps, wi = warp % kTeamWarps, tt = wi * 32 + lane, g = lane / 4, q4 = lane % 4;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kRows + r;
  const bool live = t < p.T;
  const int64_t base = static_cast<int64_t>(cluster.block_rank()) * L;
  const int m_local = static_cast<int>(clamp64(p.n - base, 0, L));
  const int64_t reach = live ? p.reach[t] : 0;

  // The row's query codes as B fragments (column = head g of group nt, k = channels), weights.
  uint32_t bq[4][4][2], wabs[4];
  float sg[4][2];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int8_t* qrow = p.q_codes + ((live ? t : 0) * kHeads + nt * 8 + g) * kSlotD + q4 * 4;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      bq[nt][s][0] = live ? *reinterpret_cast<const uint32_t*>(qrow + s * 32) : 0u;
      bq[nt][s][1] = live ? *reinterpret_cast<const uint32_t*>(qrow + s * 32 + 16) : 0u;
    }
    wabs[nt] = live ? p.w_abs[t * (kHeads / 2) + nt * 4 + q4] : 0u;
    sg[nt][0] = live ? p.w_sign[t * kHeads + nt * 8 + 2 * q4] : 1.0f;
    sg[nt][1] = live ? p.w_sign[t * kHeads + nt * 8 + 2 * q4 + 1] : 1.0f;
  }
  if (threadIdx.x == 0) sh.flag = 0;

  for (int c0 = 0; c0 < m_local; c0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed
    decode_chunk(p, base + c0, codes, sh);
    __syncthreads();
    for (int tile = wi; tile < kChunk / 16; tile += kTeamWarps) {
      const int l0 = c0 + tile * 16;  // local index of the tile's first key
      if (l0 >= m_local) break;
      const int64_t k0 = base + l0;
      bool any = live && k0 < reach;
      if (any && p.pool != nullptr) {
        const bool in = lane < 16 && k0 + lane < reach && p.pool[t * p.n + k0 + lane] != 0;
        any = __any_sync(~0u, in);
      }
      uint32_t key_g = kNegInfKey, key_g8 = kNegInfKey;
      if (any) {
        uint32_t a[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int8_t* rg = codes + (tile * 16 + g) * kRowBytes + s * 32 + q4 * 4;
          a[s][0] = *reinterpret_cast<const uint32_t*>(rg);
          a[s][1] = *reinterpret_cast<const uint32_t*>(rg + 8 * kRowBytes);
          a[s][2] = *reinterpret_cast<const uint32_t*>(rg + 16);
          a[s][3] = *reinterpret_cast<const uint32_t*>(rg + 8 * kRowBytes + 16);
        }
        float sum0 = 0.0f, sum1 = 0.0f;  // keys g and g + 8, this thread's 8 heads
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          int acc[4];
          mma_s8_first(acc, a[0], bq[nt][0][0], bq[nt][0][1]);
#pragma unroll
          for (int s = 1; s < 4; ++s) mma_s8(acc, a[s], bq[nt][s][0], bq[nt][s][1]);
          add_heads(acc[0], acc[1], wabs[nt], sg[nt][0], sg[nt][1], sum0);
          add_heads(acc[2], acc[3], wabs[nt], sg[nt][0], sg[nt][1], sum1);
        }
        sum0 = __fadd_rn(sum0, __shfl_xor_sync(~0u, sum0, 1));
        sum1 = __fadd_rn(sum1, __shfl_xor_sync(~0u, sum1, 1));
        sum0 = __fadd_rn(sum0, __shfl_xor_sync(~0u, sum0, 2));
        sum1 = __fadd_rn(sum1, __shfl_xor_sync(~0u, sum1, 2));
        const auto keep = [&](int64_t key) {
          return key < reach && (p.pool == nullptr || p.pool[t * p.n + key] != 0);
        };
        if (keep(k0 + g)) key_g = order_key(__float2bfloat16_rn(__fmul_rn(sum0, sh.kscale[tile * 16 + g])));
        if (keep(k0 + g + 8)) key_g8 = order_key(__float2bfloat16_rn(__fmul_rn(sum1, sh.kscale[tile * 16 + g + 8])));
      }
      if (q4 == 0 && l0 + g < m_local) sc[r * L + l0 + g] = static_cast<uint16_t>(key_g);
      if (q4 == 1 && l0 + g + 8 < m_local) sc[r * L + l0 + g + 8] = static_cast<uint16_t>(key_g8);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && sh.flag) atomicOr(p.flag, 1);

  if (p.topk_blocks > 0) {  // the candidate source: block maxima, the block top-k, the mask
    const int bs = p.block_size;
    const int64_t nblocks = (p.n + bs - 1) / bs, b0 = static_cast<int64_t>(cluster.block_rank()) * Lb;
    const int mb = static_cast<int>(clamp64(nblocks - b0, 0, Lb));
    const int64_t pinned = reach > 0 ? (reach - 1) / bs : -1;  // the newest reachable block
    for (int i = tt; i < mb; i += kTeam) {
      uint32_t m = 0;
      for (int j = 0; j < bs && i * bs + j < m_local; ++j) m = max(m, static_cast<uint32_t>(sc[r * L + i * bs + j]));
      blk[r * Lb + i] = static_cast<uint16_t>(b0 + i == pinned ? kPosInfKey : m);
      kept[r * Lb + i] = 0;
    }
    __syncthreads();
    const uint32_t kb = live ? static_cast<uint32_t>(clamp64(p.topk_blocks, 0, nblocks)) : 0u;
    cluster_select(cluster, sh, blk, Lb, mb, kb, [&](int i, uint32_t) {
      if (blk[r * Lb + i] > kNegInfKey) kept[r * Lb + i] = 1;  // a -inf block picked as filler is dropped
    });
    __syncthreads();
    if (live) {
      for (int i = tt; i < m_local; i += kTeam) p.mask[t * p.n + base + i] = kept[r * Lb + i / bs];
    }
  }
  const uint32_t k = live ? static_cast<uint32_t>(p.k) : 0u;
  cluster_select(cluster, sh, sc, L, m_local, k, [&](int i, uint32_t slot) {
    const int64_t pos = base + i;
    p.topk[t * p.k + slot] = pos < reach ? static_cast<int32_t>(pos) : -1;
  });
}

// The cluster size and the keys per CTA for n keys.
void split_keys(int64_t n, int* S, int* L) {
  *S = static_cast<int>(std::clamp<int64_t>((n + kKeysPerCta - 1) / kKeysPerCta, 1, kMaxCluster));
  const int64_t per = (n + *S - 1) / *S;
  *L = static_cast<int>((per + kChunk - 1) / kChunk * kChunk);
}

}  // namespace

bool index_select_fits(int64_t heads, int64_t dim, int64_t n, int64_t topk_blocks, int64_t block_size) {
  if (heads < 1 || heads > kHeads || dim < 32 || dim > kSlotD || dim % 32 != 0 || n < 1) return false;
  if (topk_blocks > 0 && (block_size < 1 || kChunk % block_size != 0)) return false;
  int S, L;
  split_keys(n, &S, &L);
  return L <= kMaxLocal;
}

int64_t index_select_workspace_bytes(int64_t T) { return wsign_offset(T) + T * kHeads * 4; }

void index_select(const IndexSelectArgs& a) {
  DSV41_CHECK(index_select_fits(a.heads, a.dim, a.n, a.topk_blocks, a.block_size) && a.T >= 1 && a.k >= 1 &&
                  a.k <= a.n && (a.topk_blocks <= 0 || a.mask != nullptr),
              "index_select: heads ", a.heads, ", dim ", a.dim, ", n ", a.n, ", k ", a.k, ", block_size ",
              a.block_size, " not covered");
  uint8_t* ws = a.workspace;
  int* flag = reinterpret_cast<int*>(ws);
  DSV41_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int)));
  Params p{};
  p.q_codes = reinterpret_cast<const int8_t*>(ws + codes_offset());
  p.w_abs = reinterpret_cast<const uint32_t*>(ws + wabs_offset(a.T));
  p.w_sign = reinterpret_cast<const float*>(ws + wsign_offset(a.T));
  const int64_t rows = a.T * kHeads;
  encode_queries_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256>>>(
      a.q, a.w, a.T, a.heads, a.dim, reinterpret_cast<int8_t*>(ws + codes_offset()),
      reinterpret_cast<uint16_t*>(ws + wabs_offset(a.T)), reinterpret_cast<float*>(ws + wsign_offset(a.T)), flag);
  DSV41_CUDA_CHECK(cudaGetLastError());

  p.keys = a.keys;
  p.entry_bytes = a.dim / 2 + a.dim / 32;
  p.dim = static_cast<int>(a.dim);
  p.reach = a.reach;
  p.pool = a.pool;
  p.T = a.T, p.n = a.n, p.k = a.k, p.topk_blocks = a.topk_blocks;
  p.block_size = static_cast<int>(a.topk_blocks > 0 ? a.block_size : 1);
  int S, L;
  split_keys(a.n, &S, &L);
  p.L = L;
  p.topk = a.topk;
  p.mask = a.mask;
  p.flag = flag;
  const int Lb = a.topk_blocks > 0 ? L / p.block_size : 0;
  const size_t smem = (sizeof(Shared) + 15) / 16 * 16 + kChunk * kRowBytes + static_cast<size_t>(kRows) * L * 2 +
                      static_cast<size_t>(kRows) * Lb * 3;
  DSV41_CUDA_CHECK(cudaFuncSetAttribute(index_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(S), static_cast<unsigned>((a.T + kRows - 1) / kRows), 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(S);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DSV41_CUDA_CHECK(cudaLaunchKernelEx(&cfg, index_select_kernel, p));
}

bool index_select_flagged(const uint8_t* workspace) {
  int flag = 0;
  DSV41_CUDA_CHECK(cudaMemcpy(&flag, workspace, sizeof flag, cudaMemcpyDeviceToHost));
  return flag != 0;
}

}  // namespace dsv41::gpu
