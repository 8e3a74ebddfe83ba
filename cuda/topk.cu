// cuda/topk.cu ↔ reference/topk.cc + reference/indexer.cc (select_index_topk, candidate blocks,
// apply_candidate_mask)
//
// The reference's order is a strict total order on (value descending, index ascending) for rows
// without NaN (-0 == +0 is a tie, broken by the index). Its top-k is therefore the SET of entries
// whose rank (the number of entries that beat them) is below k, whatever the sort algorithm. Here:
//   keys       every value becomes an order-preserving uint32 key (key_of: -0 and +0 share the key
//              of +0; a NaN is flagged, and the caller re-runs the reference, which raises). 0 is
//              no key of a non-NaN float and marks "no item" (padding).
//   radix select (one CTA of 512 threads per row or per chunk of a row; 16 keys per thread in
//              registers, contiguous positions per thread): four passes of 8 bits find the k-th
//              best key K (256-bin histogram in shared memory, warp-aggregated atomics); a pass
//              stops early once its bin is taken whole. The picks are the keys > K plus the first
//              (lowest-index) `need` keys == K, need = k - #{keys > K}.
//   compaction one block-wide exclusive scan of (#better, #ties) per thread gives every pick its
//              output slot in position order: slot = better before it + min(ties before it, need).
//   long rows  a row longer than one CTA's tile (8192 keys) is cut into chunks; each chunk keeps
//              its own top-k (key, position) in position order (the row's top-k is a subset of the
//              union: whatever beats an entry in its chunk beats it in the row), and the same
//              kernel selects again over the union (several levels when needed). A row that
//              cannot shrink that way (k > chunk / 4) is read tile by tile by one CTA (O(n) per
//              pass). Scratch is stream-ordered (cudaMallocAsync); nothing synchronizes except
//              index_topk's NaN answer.
//   candidate blocks  block key = max over the block's keys, NaN skipped (std::max's (b < s) ? s :
//              b from -inf picks a value equal to the max of the non-NaN ones; -0/+0 share a key),
//              +inf for the block of the newest reachable position; the same selection keeps
//              top-min(topk_blocks, nblocks) blocks with score > -inf (flags), expanded to the mask.
//   fused      candidate_pool_topk: the candidate source's mask and its own top-k of the same
//              scores in one kernel when n <= 16384 and block_size == 8 (one CTA per row, 32
//              positions per thread, the blocks thread-local); index_topk_async with a mask is
//              apply_candidate_mask + index_topk without writing the scores.
//   mask_scores one thread per value: -inf where the mask is 0.
// All comparisons and copies: BIT-EXACT (no arithmetic).
#include <algorithm>
#include <cmath>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/ops.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 512;                  // threads per selection CTA
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
  uint32_t prefix, pmask, remaining, done;
};

// Exclusive prefix sum of one value per thread (thread order); `total` = the sum of all.
__device__ uint32_t exclusive_scan(uint32_t v, SelectShared& sh, uint32_t& total) {
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
// caller has loaded it).
template <int kN, class Load>
__device__ void find_threshold(uint32_t (&key)[kN], int ntiles, const Load& load, uint32_t k, SelectShared& sh) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) sh.prefix = 0, sh.pmask = 0, sh.remaining = k, sh.done = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix, pmask = sh.pmask;
    for (int tile = 0; tile < ntiles; ++tile) {
      if (ntiles > 1) load(tile, key);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
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
        if (lane == 0) sh.remaining = all, sh.done = 1;
      } else if (excl < rem && rem <= incl) {
        uint32_t before = excl;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (before + c[i] >= rem) {
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
    if (sh.done) break;
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

constexpr int kCandPerThread = 16;
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
  find_threshold<kCandPerThread>(ck, 1, none, k, sh);
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

// ---- sources: the keys of a row's items ----

__device__ __forceinline__ uint32_t score_key(float v, bool keep, bool& nan) {
  if (!keep) return kNegInfKey;  // apply_candidate_mask: -inf, whatever the score
  if (v != v) {
    nan = true;
    return kNanKey;
  }
  return key_of(v);
}

// Items = positions of scores [rows, n] (mask [rows, n] or nullptr: 0 -> -inf).
struct ScoreSource {
  const float* s;
  const uint8_t* mask;
  int64_t n;
  int* nan;
  template <int kN>
  __device__ void load(int64_t row, int64_t first, int64_t end, uint32_t (&key)[kN]) const {
    const float* p = s + row * n;
    const uint8_t* mp = mask != nullptr ? mask + row * n : nullptr;
    bool bad = false;
    if (first + kN <= end && ((row * n + first) & 3) == 0 && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
#pragma unroll
      for (int q = 0; q < kN / 4; ++q) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(p + first) + q);
        const float w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) key[4 * q + i] = score_key(w[i], mp == nullptr || mp[first + 4 * q + i] != 0, bad);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const int64_t i = first + j;
        key[j] = i < end ? score_key(p[i], mp == nullptr || mp[i] != 0, bad) : 0;
      }
    }
    if (bad) atomicOr(nan, 1);
  }
  __device__ uint32_t key_at(int64_t row, int64_t i) const {
    bool bad = false;
    const uint32_t k = score_key(s[row * n + i], mask == nullptr || mask[row * n + i] != 0, bad);
    if (bad) atomicOr(nan, 1);
    return k;
  }
  __device__ int64_t pos(int64_t, int64_t item) const { return item; }
};

// Block key of block b of row `row`: max of the non-NaN keys, +inf for the newest reachable one.
__device__ __forceinline__ uint32_t block_key(const float* s, const int64_t* reach, int64_t row, int64_t n,
                                              int64_t bs, int64_t b) {
  const float* p = s + row * n;
  const int64_t lo = b * bs, hi = min(lo + bs, n);
  uint32_t m = kNegInfKey;
  if (bs == 8 && hi == lo + 8 && ((row * n + lo) & 3) == 0 && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
    const float4* q = reinterpret_cast<const float4*>(p + lo);
    const float4 a = __ldg(q), c = __ldg(q + 1);
    const float w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) m = w[i] == w[i] ? max(m, key_of(w[i])) : m;
  } else {
    for (int64_t j = lo; j < hi; ++j) m = p[j] == p[j] ? max(m, key_of(p[j])) : m;
  }
  const int64_t r = reach[row];
  return r >= 1 && (r - 1) / bs == b ? kPosInfKey : m;  // floor_div(reach - 1, bs); none when reach is 0
}

// Items = keys [rows, m] with their positions (an earlier level's candidates, in position order),
// or without (position nullptr: the item is the position; the candidate pool's block keys).
struct CandSource {
  const uint32_t* key;
  const int32_t* position;
  int64_t m;
  template <int kN>
  __device__ void load(int64_t row, int64_t first, int64_t end, uint32_t (&k)[kN]) const {
    const uint32_t* p = key + row * m + first;
    if (first + kN <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
      for (int q = 0; q < kN / 4; ++q) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + q);
        k[4 * q] = v.x, k[4 * q + 1] = v.y, k[4 * q + 2] = v.z, k[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kN; ++j) k[j] = first + j < end ? p[j] : 0;
    }
  }
  __device__ uint32_t key_at(int64_t row, int64_t item) const { return key[row * m + item]; }
  __device__ int64_t pos(int64_t row, int64_t item) const {
    return position != nullptr ? position[row * m + item] : item;
  }
};

// ---- sinks: where the picks go (slot < k, in position order) ----

struct TopkSink {  // out [rows, k]: the position, -1 from reach[row] on
  int32_t* out;
  const int64_t* reach;
  int64_t k;
  __device__ void begin(int64_t, int64_t) const {}
  __device__ void put(int64_t row, int64_t, uint32_t slot, int64_t pos, uint32_t) const {
    if (slot < k) out[row * k + slot] = pos < reach[row] ? static_cast<int32_t>(pos) : -1;
  }
};

struct CandSink {  // chunk c of a row -> candidates [c * k, c * k + k) of [rows, m]; unused: key 0
  uint32_t* key;
  int32_t* position;
  int64_t k, m;
  __device__ void begin(int64_t row, int64_t c) const {
    for (int64_t i = threadIdx.x; i < k; i += kThreads) key[row * m + c * k + i] = 0;
  }
  __device__ void put(int64_t row, int64_t c, uint32_t slot, int64_t pos, uint32_t kk) const {
    if (slot >= k) return;
    key[row * m + c * k + slot] = kk;
    position[row * m + c * k + slot] = static_cast<int32_t>(pos);
  }
};

struct FlagSink {  // flags [rows, nb]: 1 for a kept block (picked and score > -inf), else 0
  uint8_t* flags;
  int64_t nb;
  __device__ void begin(int64_t row, int64_t) const {
    for (int64_t i = threadIdx.x; i < nb; i += kThreads) flags[row * nb + i] = 0;
  }
  __device__ void put(int64_t row, int64_t, uint32_t, int64_t pos, uint32_t kk) const {
    if (kk > kNegInfKey) flags[row * nb + pos] = 1;
  }
};

// CTA x: row x / chunks, chunk x % chunks = items [c * chunk, min(m, c * chunk + chunk)) of the
// row's m items; its top-k (all of its items when fewer) go to the sink.
template <class Source, class Sink>
__global__ void __launch_bounds__(kThreads) select_kernel(Source src, Sink sink, int64_t m, int64_t chunk,
                                                          int64_t chunks, int64_t k) {
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const int64_t begin = c * chunk, end = min(m, begin + chunk);
  const int ntiles = static_cast<int>((end - begin + kTile - 1) / kTile);
  const auto load = [&](int tile, uint32_t(&key)[kItems]) {
    src.template load<kItems>(row, begin + tile * kTile + threadIdx.x * kItems, end, key);
  };
  const auto key_at = [&](int64_t item) { return src.key_at(row, begin + item); };
  const auto put = [&](int64_t item, uint32_t kk, uint32_t slot) {
    sink.put(row, c, slot, src.pos(row, begin + item), kk);
  };
  extern __shared__ uint32_t filter_smem[];  // kFilterSmem bytes
  uint32_t key[kItems];
  load(0, key);
  sink.begin(row, c);
  const uint32_t k32 = static_cast<uint32_t>(k);
  if (filtered_select<kItems>(key, ntiles, end - begin, load, key_at, k32, sh, filter_smem, filter_smem + kCand, put)) {
    return;
  }
  find_threshold<kItems>(key, ntiles, load, k32, sh);
  emit_selected<kItems>(key, ntiles, load, sh, [&](int tile, int j, uint32_t kk, uint32_t slot) {
    put(tile * kTile + threadIdx.x * kItems + j, kk, slot);
  });
}

template <class Source, class Sink>
void launch_select(int64_t ctas, const Source& src, const Sink& sink, int64_t m, int64_t chunk, int64_t chunks,
                   int64_t k) {
  DSV41_CUDA_CHECK(cudaFuncSetAttribute(select_kernel<Source, Sink>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kFilterSmem)));
  select_kernel<<<static_cast<unsigned>(ctas), kThreads, kFilterSmem>>>(src, sink, m, chunk, chunks, k);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

// Stream-ordered scratch (cudaMallocAsync on the default stream; the pool keeps its memory).
template <typename T>
class Scratch {
 public:
  explicit Scratch(int64_t n) {
    static std::once_flag once;
    std::call_once(once, [] {
      int dev = 0;
      cudaMemPool_t pool;
      if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
    });
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
    DSV41_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, 0));
  }
  ~Scratch() { cudaFreeAsync(p_, 0); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether the sampling filter almost surely keeps between k and kCand of `len` keys: it keeps
// about 2k + len / 32 of them (r = 2 * share + 16 of 512 samples), +-10% or so.
bool filter_fits(int64_t len, int64_t k) { return 4 * k <= kCand && len >= 4 * k && 2 * k + len / 32 <= 6144; }

// Positions per CTA of the first level for rows of m items. A row of up to two tiles that the
// filter fits: one CTA (one launch, no scratch). Else the largest chunk of up to 4 tiles that the
// filter fits while at least 256 CTAs run, at least one tile; then halved while fewer than 128 CTAs
// would run and the halved chunk still shrinks its items 8-fold.
int64_t auto_chunk(int64_t rows, int64_t m, int64_t k) {
  if (m <= 2 * kTile && filter_fits(m, k)) return m;
  int64_t chunk = 4 * kTile;
  while (chunk > kTile && (!filter_fits(chunk, k) || rows * ceil_div(m, chunk) < 256)) chunk /= 2;
  while (rows * ceil_div(m, chunk) < 128 && chunk / 2 >= 8 * k && chunk / 2 >= 1024) chunk /= 2;
  return chunk;
}

// The top-k of every row's m items (k <= m) into the sink, through chunk levels while they shrink.
template <class Source, class Sink>
void select_rows(const Source& src, const Sink& sink, int64_t rows, int64_t m, int64_t k, int64_t chunk) {
  if (chunk <= 0) chunk = auto_chunk(rows, m, k);
  chunk = ceil_div(chunk, 16) * 16;  // keeps float4 loads aligned
  if (m > chunk && 4 * k <= chunk) {
    const int64_t chunks = ceil_div(m, chunk), mc = chunks * k;
    Scratch<uint32_t> key(rows * mc);
    Scratch<int32_t> pos(rows * mc);
    launch_select(rows * chunks, src, CandSink{key.get(), pos.get(), k, mc}, m, chunk, chunks, k);
    select_rows(CandSource{key.get(), pos.get(), mc}, sink, rows, mc, k, 0);
    return;
  }
  launch_select(rows, src, sink, m, m, int64_t{1}, k);
}

// keys [rows, nb] = block_key of every block (one thread per block: coalesced reads).
__global__ void block_keys_kernel(const float* __restrict__ s, const int64_t* __restrict__ reach, int64_t rows,
                                  int64_t n, int64_t bs, int64_t nb, uint32_t* __restrict__ keys) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x < rows * nb) keys[x] = block_key(s, reach, x / nb, n, bs, x % nb);
}

// mask [rows, n] = flags [rows, nb] of each position's block; 16 positions per thread.
__global__ void expand_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t n, int64_t nb, int64_t bs,
                              uint8_t* __restrict__ mask) {
  const int64_t groups = (n + 15) / 16, x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= rows * groups) return;
  const int64_t row = x / groups, j0 = (x % groups) * 16;
  uint8_t* out = mask + row * n + j0;
  if (n % 16 == 0 && (reinterpret_cast<uintptr_t>(mask) & 15) == 0) {
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 4] |= static_cast<uint32_t>(flags[row * nb + (j0 + i) / bs]) << (8 * (i % 4));
    *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    for (int64_t i = 0; i < 16 && j0 + i < n; ++i) out[i] = flags[row * nb + (j0 + i) / bs];
  }
}

// Fused candidate source (n <= 32 * kThreads, block size 32 / kNB): one CTA per row, positions
// [32 t, 32 t + 32) in thread t; first the block selection (the row's mask), then the top-k.
template <int kNB>
__global__ void __launch_bounds__(kThreads)
    pool_topk_kernel(const float* __restrict__ s, const int64_t* __restrict__ reach, int64_t n, int64_t k, int64_t kb,
                     uint8_t* __restrict__ mask, int32_t* __restrict__ out, int* nan) {
  constexpr int kBS = 32 / kNB;
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x, first = static_cast<int64_t>(threadIdx.x) * 32, nb = (n + kBS - 1) / kBS;
  const ScoreSource src{s, nullptr, n, nan};
  uint32_t key[32], bkey[kNB];
  src.load<32>(row, first, n, key);
#pragma unroll
  for (int b = 0; b < kNB; ++b) {
    const int64_t blk = first / kBS + b;
    bkey[b] = blk < nb ? block_key(s, reach, row, n, kBS, blk) : 0;  // re-read from L1: NaN skipped
  }
  const auto none32 = [](int, uint32_t(&)[32]) {};
  const auto noneb = [](int, uint32_t(&)[kNB]) {};
  find_threshold<kNB>(bkey, 1, noneb, static_cast<uint32_t>(min(kb, nb)), sh);
  uint32_t keep = 0;  // bit b: block b of this thread kept
  emit_selected<kNB>(bkey, 1, noneb, sh, [&](int, int j, uint32_t kk, uint32_t) {
    if (kk > kNegInfKey) keep |= 1u << j;
  });
  uint8_t* mrow = mask + row * n;
  if (first + 32 <= n && ((row * n + first) & 15) == 0 && (reinterpret_cast<uintptr_t>(mask) & 15) == 0) {
    uint32_t w[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      w[q] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) w[q] |= ((keep >> ((4 * q + i) / kBS)) & 1u) << (8 * i);
    }
    reinterpret_cast<uint4*>(mrow + first)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(mrow + first)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
    for (int i = 0; i < 32 && first + i < n; ++i) mrow[first + i] = static_cast<uint8_t>((keep >> (i / kBS)) & 1u);
  }
  __syncthreads();
  if (k == 0) return;
  const int64_t r = reach[row];
  const auto put = [&](int64_t pos, uint32_t, uint32_t slot) {
    if (slot < k) out[row * k + slot] = pos < r ? static_cast<int32_t>(pos) : -1;
  };
  const auto key_at = [&](int64_t i) { return src.key_at(row, i); };
  extern __shared__ uint32_t filter_smem[];  // kFilterSmem bytes
  const uint32_t k32 = static_cast<uint32_t>(k);
  if (filtered_select<32>(key, 1, n, none32, key_at, k32, sh, filter_smem, filter_smem + kCand, put)) return;
  find_threshold<32>(key, 1, none32, k32, sh);
  emit_selected<32>(key, 1, none32, sh, [&](int, int j, uint32_t kk, uint32_t slot) { put(first + j, kk, slot); });
}

__global__ void mask_scores_kernel(float* __restrict__ scores, const uint8_t* __restrict__ mask, int64_t n) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x < n && mask[x] == 0) scores[x] = -INFINITY;
}

}  // namespace

void index_topk_async(const float* scores, const uint8_t* mask, const int64_t* reach, int64_t rows, int64_t n,
                      int64_t k, int32_t* out, int* nan_flag, int64_t chunk) {
  DSV41_CHECK(k >= 0 && k <= n && n < (int64_t{1} << 31), "index_topk: k ", k, " of ", n, " positions");
  if (rows * n == 0 || k == 0) return;
  select_rows(ScoreSource{scores, mask, n, nan_flag}, TopkSink{out, reach, k}, rows, n, k, chunk);
}

bool index_topk(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t k, int32_t* out) {
  if (rows * n == 0 || k == 0) return true;
  Scratch<int> nan(1);
  DSV41_CUDA_CHECK(cudaMemsetAsync(nan.get(), 0, sizeof(int), 0));
  index_topk_async(scores, nullptr, reach, rows, n, k, out, nan.get());
  int seen = 0;
  DSV41_CUDA_CHECK(cudaMemcpy(&seen, nan.get(), sizeof(int), cudaMemcpyDeviceToHost));
  return seen == 0;
}

void candidate_blocks(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t topk_blocks,
                      int64_t block_size, uint8_t* mask) {
  if (rows * n == 0) return;
  DSV41_CHECK(topk_blocks > 0 && block_size > 0 && n < (int64_t{1} << 31), "candidate_blocks: top ", topk_blocks,
              " blocks of ", block_size, " of ", n, " positions");
  const int64_t blocks = ceil_div(n, block_size), k = std::min(topk_blocks, blocks);
  Scratch<uint32_t> keys(rows * blocks);
  Scratch<uint8_t> flags(rows * blocks);
  block_keys_kernel<<<grid_for(rows * blocks, 256), 256>>>(scores, reach, rows, n, block_size, blocks, keys.get());
  DSV41_CUDA_CHECK(cudaGetLastError());
  select_rows(CandSource{keys.get(), nullptr, blocks}, FlagSink{flags.get(), blocks}, rows, blocks, k, 0);
  const int64_t groups = rows * ceil_div(n, 16);
  expand_kernel<<<grid_for(groups, 256), 256>>>(flags.get(), rows, n, blocks, block_size, mask);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void candidate_pool_topk(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t k,
                         int64_t topk_blocks, int64_t block_size, uint8_t* mask, int32_t* out, int* nan_flag) {
  if (rows * n == 0) return;
  if (block_size == 8 && n <= 32 * int64_t{kThreads} && topk_blocks > 0 && k >= 0 && k <= n) {
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(pool_topk_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kFilterSmem)));
    pool_topk_kernel<4><<<static_cast<unsigned>(rows), kThreads, kFilterSmem>>>(scores, reach, n, k, topk_blocks,
                                                                                 mask, out, nan_flag);
    DSV41_CUDA_CHECK(cudaGetLastError());
    return;
  }
  candidate_blocks(scores, reach, rows, n, topk_blocks, block_size, mask);
  index_topk_async(scores, nullptr, reach, rows, n, k, out, nan_flag);
}

void mask_scores(float* scores, const uint8_t* mask, int64_t n) {
  if (n == 0) return;
  mask_scores_kernel<<<grid_for(n, 256), 256>>>(scores, mask, n);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
