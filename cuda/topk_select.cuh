// cuda/topk_select.cuh: the device side of cuda/topk.cu's exact top-k (included only there).
//
// One CTA of kThreads threads selects the k best of a chunk's items by the reference's order (key
// descending, lower item first): find_threshold (radix select: four 8-bit passes over a 256-bin
// shared histogram with warp-aggregated atomics, early stop when a bin is taken whole) leaves the
// k-th key's bits and how many ties at it to take; emit_selected gives every pick its slot in item
// order with one block-wide scan; filtered_select first compacts the keys above a sampled
// threshold into shared memory and selects among them (exact, with a fallback). Items: key[j] of
// thread t is item t * kN + j of a tile (contiguous per thread, so thread order is item order).
#pragma once

#include <cstdint>

namespace dsv41::gpu::topk_detail {

constexpr int kThreads = 1024;                 // threads per selection CTA
constexpr int kItems = 16;                     // keys per thread (generic selection)
constexpr int64_t kTile = kThreads * kItems;   // keys one CTA holds at once
constexpr uint32_t kNegInfKey = 0x007FFFFFu;   // key_of(-inf)
constexpr uint32_t kPosInfKey = 0xFF800000u;   // key_of(+inf)
constexpr uint32_t kNanKey = 1;                // any non-zero key: the row is flagged anyway

// a > b (floats, no NaN) <=> key_of(a) > key_of(b); key_of(-0) == key_of(+0).
__device__ __forceinline__ uint32_t key_of(float f) {
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct SelectShared {
  uint32_t hist[256];
  uint32_t scan[kThreads / 32];
  uint32_t prefix, pmask, remaining, done, any, every;
};

// Exclusive prefix sum of one value per thread (thread order); `total` = the sum of all.
__device__ inline uint32_t exclusive_scan(uint32_t v, SelectShared& sh, uint32_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(~0u, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) sh.scan[warp] = x;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = lane < kThreads / 32 ? sh.scan[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(~0u, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kThreads / 32) sh.scan[lane] = w;
  }
  __syncthreads();
  const uint32_t base = warp > 0 ? sh.scan[warp - 1] : 0;
  total = sh.scan[kThreads / 32 - 1];
  __syncthreads();
  return base + x - v;
}

// Radix select: leaves in `sh` the k-th best key's top bits (prefix under pmask) and how many of
// the keys with those bits to take (remaining). Fewer than k items: all of them (prefix 0).
// key[j] is item threadIdx.x * kN + j of tile `tile` (load(tile, key) fills it; with one tile the
// caller has loaded it); j >= jmax holds no item. The passes cover only the bits on which the
// items differ (an OR / AND over them first): bf16 values need two 8-bit passes, not four; after
// the pass below which no bit differs, the bin is one key.
template <int kN, class Load>
__device__ void find_threshold(uint32_t (&key)[kN], int ntiles, const Load& load, uint32_t k, SelectShared& sh,
                               int jmax = kN) {
  const int lane = threadIdx.x & 31;
  uint32_t any = 0, every = ~0u;
  for (int tile = 0; tile < ntiles; ++tile) {
    if (ntiles > 1) load(tile, key);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j < jmax && key[j] != 0) any |= key[j], every &= key[j];
    }
  }
  any = __reduce_or_sync(~0u, any);
  every = __reduce_and_sync(~0u, every);
  if (threadIdx.x == 0) sh.any = 0, sh.every = ~0u, sh.remaining = k, sh.done = 0;
  __syncthreads();
  if (lane == 0) atomicOr(&sh.any, any), atomicAnd(&sh.every, every);
  __syncthreads();
  const uint32_t diff = sh.any ^ sh.every;  // no items: any 0, every ~0 -> every bit "differs"
  const int hi = diff == 0 ? -1 : 31 - __clz(diff);
  if (threadIdx.x == 0) {
    sh.pmask = hi == 31 ? 0u : ~0u << (hi + 1);  // the bits above the highest differing one
    sh.prefix = sh.every & sh.pmask;
  }
  for (int shift = hi >= 7 ? hi - 7 : 0;; shift = shift >= 8 ? shift - 8 : 0) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix, pmask = sh.pmask;
    for (int tile = 0; tile < ntiles; ++tile) {
      if (ntiles > 1) load(tile, key);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        if (j >= jmax) break;
        const bool active = key[j] != 0 && (key[j] & pmask) == prefix;
        if (__any_sync(~0u, active)) {
          const uint32_t d = active ? (key[j] >> shift) & 255u : 256u;
          const uint32_t peers = __match_any_sync(~0u, d);
          if (active && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[d], static_cast<uint32_t>(__popc(peers)));
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l holds bins 255 - 8l down to 248 - 8l (best first)
      const uint32_t rem = sh.remaining;
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = sh.hist[255 - 8 * lane - i], sum += c[i];
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(~0u, incl, o);
        if (lane >= o) incl += y;
      }
      const uint32_t all = __shfl_sync(~0u, incl, 31), excl = incl - sum;
      if (all <= rem) {  // every remaining item is taken (only at the first pass: fewer than k)
        if (lane == 0) sh.prefix = 0, sh.pmask = 0, sh.remaining = all, sh.done = 1;
      } else if (excl < rem && rem <= incl) {
        uint32_t before = excl;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (before + c[i] >= rem) {  // bits of the window already in pmask are the same in d
            sh.prefix |= static_cast<uint32_t>(255 - 8 * lane - i) << shift;
            sh.pmask |= 255u << shift;
            sh.remaining = rem - before;
            sh.done = c[i] == rem - before ? 1 : 0;
            break;
          }
          before += c[i];
        }
      }
    }
    __syncthreads();
    if (sh.done || shift == 0 || (diff & ((1u << shift) - 1)) == 0) break;
  }
}

// Calls put(tile, j, key, slot) for every pick, slot = its rank in position order.
template <int kN, class Load, class Put>
__device__ void emit_selected(uint32_t (&key)[kN], int ntiles, const Load& load, SelectShared& sh, const Put& put) {
  const uint32_t prefix = sh.prefix, pmask = sh.pmask, need = sh.remaining;
  uint32_t better_base = 0, tie_base = 0;
  for (int tile = 0; tile < ntiles; ++tile) {
    if (ntiles > 1) load(tile, key);
    uint32_t packed = 0;  // (#better << 16) + #ties of this thread: both < 65536 per tile
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const uint32_t m = key[j] & pmask;
      if (key[j] != 0) packed += m > prefix ? 0x10000u : (m == prefix ? 1u : 0u);
    }
    uint32_t total;
    const uint32_t excl = exclusive_scan(packed, sh, total);
    uint32_t better = better_base + (excl >> 16), tie = tie_base + (excl & 0xFFFFu);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (key[j] == 0) continue;
      const uint32_t m = key[j] & pmask;
      if (m > prefix) {
        put(tile, j, key[j], better + min(tie, need));
        ++better;
      } else if (m == prefix) {
        if (tie < need) put(tile, j, key[j], better + tie);
        ++tie;
      }
    }
    better_base += total >> 16;
    tie_base += total & 0xFFFFu;
  }
}

constexpr int kCandPerThread = 8;
constexpr int kCand = kThreads * kCandPerThread;                  // filtered keys in shared memory
constexpr size_t kFilterSmem = 2 * kCand * sizeof(uint32_t);      // keys + item numbers: 64 KiB

// The sampling filter: t = the bin of the r-th best of kThreads sampled keys (r about twice the
// share of k, + 16). The keys >= t (normally between k and kCand of them) are compacted in
// position order into shared memory (ckey, citem) and the exact selection runs on them alone:
// the top-k of the chunk is among them whenever at least k reach t. Exact whatever the sample:
// fewer than k or more than kCand -> false, nothing written, and the caller selects over all.
// put(item, key, slot): item = the key's number within the chunk.
template <int kN, class Load, class KeyAt, class Put>
__device__ bool filtered_select(uint32_t (&key)[kN], int ntiles, int64_t len, const Load& load, const KeyAt& key_at,
                                uint32_t k, SelectShared& sh, uint32_t* ckey, uint32_t* citem, const Put& put) {
  if (4 * int64_t{k} > kCand || len < 4 * int64_t{k}) return false;
  uint32_t sample[1] = {key_at(static_cast<int64_t>(threadIdx.x) * len / kThreads)};
  const int64_t share = (int64_t{k} * kThreads + len - 1) / len;
  const uint32_t r = static_cast<uint32_t>(2 * share + 16 < kThreads ? 2 * share + 16 : kThreads);
  const auto none1 = [](int, uint32_t(&)[1]) {};
  find_threshold<1>(sample, 1, none1, r, sh);
  const uint32_t t = sh.prefix;  // every sampled key of the r-th one's bin is >= t
  constexpr int64_t kTileN = int64_t{kThreads} * kN;
  uint32_t total = 0;
  for (int tile = 0; tile < ntiles; ++tile) {
    if (ntiles > 1) load(tile, key);
    uint32_t c = 0;
#pragma unroll
    for (int j = 0; j < kN; ++j) c += key[j] != 0 && key[j] >= t ? 1u : 0u;
    uint32_t tile_total;
    uint32_t off = total + exclusive_scan(c, sh, tile_total);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (key[j] != 0 && key[j] >= t) {
        if (off < kCand) {
          ckey[off] = key[j];
          citem[off] = static_cast<uint32_t>(tile * kTileN + threadIdx.x * kN + j);
        }
        ++off;
      }
    }
    total += tile_total;
  }
  if (total < k || total > kCand) return false;
  __syncthreads();
  uint32_t ck[kCandPerThread];
  const auto none = [](int, uint32_t(&)[kCandPerThread]) {};
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {  // strided: the histogram work spread over all warps
    const uint32_t i = j * kThreads + threadIdx.x;
    ck[j] = i < total ? ckey[i] : 0;
  }
  find_threshold<kCandPerThread>(ck, 1, none, k, sh, static_cast<int>((total + kThreads - 1) / kThreads));
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {  // contiguous: position order for the slots
    const uint32_t i = threadIdx.x * kCandPerThread + j;
    ck[j] = i < total ? ckey[i] : 0;
  }
  emit_selected<kCandPerThread>(ck, 1, none, sh, [&](int, int j, uint32_t kk, uint32_t slot) {
    put(citem[threadIdx.x * kCandPerThread + j], kk, slot);
  });
  return true;
}

}  // namespace dsv41::gpu::topk_detail
