// cuda/index_select_select.cuh: the selection machinery the production fused indexer's two kernels
// share (cuda/index_select.cu: the scoring kernel, cuda/index_select_merge.cu: the merge of the key
// ranges' candidates): the CTA shape (4 query rows x 4 warps), the 16-bit order keys of bf16 scores,
// and cluster_select, the radix top-k over a cluster of CTAs with the tie rule (higher key first,
// lower element first among equal keys; picks numbered in element order). Device header, included
// by .cu files only; the merge's host launcher is declared at the end.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace dsv41::gpu::index_select_detail {

namespace cg = cooperative_groups;

constexpr int kRows = 4;                     // query rows per CTA
constexpr int kTeamWarps = 4;                // warps per row
constexpr int kTeam = kTeamWarps * 32;       // threads per row
constexpr int kThreads = kRows * kTeam;      // 512
constexpr int kChunk = 128;                  // keys decoded per pass
constexpr int kMaxCluster = 8;
constexpr int kMaxLocal = 8192;              // elements (keys, blocks or candidates) per CTA and row
constexpr int64_t kMaxRange = kMaxCluster * kMaxLocal;  // keys of one range (local positions fit 16 bits)
constexpr uint32_t kNegInfKey = 0x007Fu;     // ordered key of bf16 -inf
constexpr uint32_t kPosInfKey = 0xFF80u;     // ordered key of bf16 +inf
constexpr uint32_t kNone = 0x10000u;         // a threshold no key reaches (a row with k = 0)

// The selection's shared state for R rows of TW warps each (R TW 32 = kThreads): Shared, 4 rows of
// 4 warps, for the streaming kernel and the merge; the decode kernel selects 16 rows of one warp.
template <int R, int TW>
struct SelectShared {
  static constexpr int kR = R, kTW = TW;
  static_assert(R * TW * 32 == kThreads, "the CTA's threads are R rows of TW warps");
  uint32_t hist[2][R][256];  // the two radix passes (read by the whole cluster)
  uint32_t cnt[R];           // this CTA's {above << 16 | ties} at the threshold (read by the cluster)
  uint32_t scan[R][TW];
  uint32_t bin[R], before[R], thr[R], need[R];
  float kscale[2][kChunk];   // 2^ek of the chunk's keys (two buffers when the kernel prefetches)
  int flag;
};
using Shared = SelectShared<kRows, kTeamWarps>;

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

__device__ __forceinline__ uint32_t order_key(__nv_bfloat16 v) {  // a > b <=> key(a) > key(b); -0 == +0
  uint32_t b = __bfloat16_as_ushort(v);
  if (b == 0x8000u) b = 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

// Exclusive scan of v over the row's team (Sh::kTW warps, in thread order); total = the team's sum.
// Every thread of the CTA calls it.
template <class Sh>
__device__ inline uint32_t team_scan(uint32_t v, Sh& sh, int r, int wi, int lane, uint32_t& total) {
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
  for (int i = 0; i < Sh::kTW; ++i) {
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
template <class Sh>
__device__ inline void find_bin(cg::cluster_group& cluster, Sh& sh, int pass, int r, uint32_t k, int lane) {
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

// hist[bin] += 1 where `in`. kWarpHist: the lanes of a warp that hit the same bin add once together
// (__match_any_sync; scores of similar size share the first pass's bin, whose plain atomics would
// serialize); the same counts either way.
template <bool kWarpHist>
__device__ __forceinline__ void hist_add(uint32_t* hist, uint32_t bin, bool in) {
  if (!kWarpHist) {
    if (in) atomicAdd(&hist[bin], 1u);
    return;
  }
  const unsigned active = __activemask();
  const unsigned peers = __match_any_sync(active, in ? bin : 0x100u);  // 0x100: not counted
  if (in && (__ffs(peers) - 1) == static_cast<int>(threadIdx.x % 32)) atomicAdd(&hist[bin], __popc(peers));
}

// Per row r of this CTA: the k_r best of the row's elements over the cluster (rank q holds the
// elements [q m_cap, q m_cap + m_cap), m_local of them here, ordered keys a[r * stride + i]), by
// key descending and lower element first; emit(i, slot) for each pick here, slot = its rank among
// the row's picks in element order. Every thread of the cluster calls it.
template <bool kWarpHist, class Sh, class Emit>
__device__ void cluster_select(cg::cluster_group& cluster, Sh& sh, const uint16_t* a, int stride, int m_local,
                               uint32_t k_r, const Emit& emit) {
  constexpr int kTW = Sh::kTW, kTeamT = kTW * 32;  // the row's warps and threads
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / kTW, wi = warp % kTW, tt = wi * 32 + lane;
  const uint16_t* row = a + static_cast<int64_t>(r) * stride;
  for (int i = static_cast<int>(threadIdx.x); i < 2 * Sh::kR * 256; i += kThreads) (&sh.hist[0][0][0])[i] = 0;
  __syncthreads();
  for (int i = tt; i < m_local; i += kTeamT) hist_add<kWarpHist>(&sh.hist[0][r][0], row[i] >> 8, true);
  cluster.sync();
  if (wi == 0 && k_r > 0) find_bin(cluster, sh, 0, r, k_r, lane);
  __syncthreads();
  const uint32_t b1 = sh.bin[r], above1 = sh.before[r];
  if (k_r > 0) {
    for (int i = tt; i < m_local; i += kTeamT) {
      hist_add<kWarpHist>(&sh.hist[1][r][0], row[i] & 0xFFu, (row[i] >> 8) == b1);
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
  const int per = (m_local + kTeamT - 1) / kTeamT, lo = min(m_local, tt * per), hi = min(m_local, lo + per);
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

// The merge of a ranged selection (cuda/index_select_merge.cu). A range g of R keys (the last one
// may be shorter) wrote its candidates, picks in ascending position order, as {order key << 16 |
// position - g R} into cand[t][g][0 .. min(k, keys of g)) (row stride G kc) and, for the candidate
// source, its blocks as {block key << 16 | block - g R / bs} into bcand[t][g][0 .. min(topk_blocks,
// blocks of g)). Every global pick is among its range's picks (the same total order), and a row's
// candidates in (range, slot) order are in position order: the merge is cluster_select again.
struct MergeParams {
  const uint32_t* cand = nullptr;   // [T][G][kc]
  const uint32_t* bcand = nullptr;  // [T][G][kbc] (the candidate source) or null
  const int64_t* reach = nullptr;
  int64_t T = 0, n = 0, k = 0, topk_blocks = 0, R = 0;
  int G = 0, kc = 0, kbc = 0, block_size = 1;
  int S = 1;                         // merge CTAs per cluster
  int32_t* topk = nullptr;           // [T, k]
  uint8_t* mask = nullptr;           // [T, n], zeroed before (the candidate source)
};
// Merge CTAs per cluster for G ranges of kc (and kbc) candidates: 0 when more than a cluster holds.
int merge_cluster_size(int64_t G, int64_t kc, int64_t kbc);
// Launches the merge on the default stream.
void launch_merge(const MergeParams& p);

}  // namespace dsv41::gpu::index_select_detail
