// cuda/topk.cu ↔ reference/ops/topk.cc + reference/ops/indexer.cc (select_index_topk, candidate blocks,
// apply_candidate_mask)
//
// The reference's order is a strict total order on (value descending, index ascending) for rows
// without NaN (-0 == +0 is a tie, broken by the index). Its top-k is therefore the SET of entries
// whose rank (the number of entries that beat them) is below k, whatever the sort algorithm. Here:
//   keys       every value becomes an order-preserving uint32 key (key_of: -0 and +0 share the key
//              of +0; a NaN is flagged, and the caller re-runs the reference, which raises). 0 is
//              no key of a non-NaN float and marks "no item" (padding).
//   radix select (cuda/topk_select.cuh; one CTA of 1024 threads per row or per chunk of a row, 16
//              keys per thread in registers, contiguous positions per thread): 8-bit passes over
//              only the bits on which the keys differ (two for bf16 values) find the k-th best key
//              K (256-bin histogram in shared memory, warp-aggregated atomics); a pass stops early
//              once its bin is taken whole. The picks are the keys > K plus the first
//              (lowest-index) `need` keys == K, need = k - #{keys > K}.
//   filter     before it, the keys at or above a threshold sampled from 1024 keys (about 2k of
//              them) are compacted in position order into shared memory and selected alone; exact
//              whatever the sample (fewer than k or more than 8192 pass: the full selection).
//   compaction one block-wide exclusive scan of (#better, #ties) per thread gives every pick its
//              output slot in position order: slot = better before it + min(ties before it, need).
//   long rows  a row longer than a few tiles (16384 keys) is cut into chunks; each chunk keeps
//              its own top-k (key, position) in position order (the row's top-k is a subset of the
//              union: whatever beats an entry in its chunk beats it in the row), and the same
//              kernel selects again over the union (several levels when needed). A row that
//              cannot shrink that way (k > chunk / 4) is read tile by tile by one CTA (O(n) per
//              pass). Scratch is stream-ordered (cudaMallocAsync); nothing synchronizes except
//              index_topk's NaN answer.
//   candidate blocks  block key = max over the block's keys, NaN skipped (std::max's (b < s) ? s :
//              b from -inf picks a value equal to the max of the non-NaN ones; -0/+0 share a key),
//              +inf for the block of the newest reachable position (one coalesced kernel writes
//              them); the same selection keeps top-min(topk_blocks, nblocks) blocks with score >
//              -inf (flags), expanded to the mask.
//   fused      candidate_pool_topk: the candidate source's mask and its own top-k of the same
//              scores in one kernel when n <= 16384 and block_size == 8 (one CTA per row, 16
//              positions per thread, the blocks thread-local); index_topk_async with a mask is
//              apply_candidate_mask + index_topk without writing the scores.
//   mask_scores one thread per value: -inf where the mask is 0.
// All comparisons and copies: BIT-EXACT (no arithmetic).
#include <algorithm>
#include <cmath>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/device.h"
#include "cuda/topk_select.cuh"

namespace dsv41::gpu {
namespace {

using namespace topk_detail;  // NOLINT: the selection machinery of cuda/topk_select.cuh

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
// about 2k + 16 len / kThreads of them (r = 2 * share + 16 of kThreads samples), +-10% or so.
bool filter_fits(int64_t len, int64_t k) {
  return 4 * k <= kCand && len >= 4 * k && 2 * k + 16 * len / kThreads <= kCand * 3 / 4;
}

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

// Fused candidate source (n <= kTile, block size kP / kNB): one CTA per row, positions
// [kP t, kP t + kP) in thread t; first the block selection (the row's mask), then the top-k.
template <int kNB>
__global__ void __launch_bounds__(kThreads)
    pool_topk_kernel(const float* __restrict__ s, const int64_t* __restrict__ reach, int64_t n, int64_t k, int64_t kb,
                     uint8_t* __restrict__ mask, int32_t* __restrict__ out, int* nan) {
  constexpr int kP = kItems, kBS = kP / kNB;
  static_assert(kP == 16, "the mask is written as one 16-byte store per thread");
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x, first = static_cast<int64_t>(threadIdx.x) * kP, nb = (n + kBS - 1) / kBS;
  const ScoreSource src{s, nullptr, n, nan};
  uint32_t key[kP], bkey[kNB];
  src.load<kP>(row, first, n, key);
#pragma unroll
  for (int b = 0; b < kNB; ++b) {
    const int64_t blk = first / kBS + b;
    bkey[b] = blk < nb ? block_key(s, reach, row, n, kBS, blk) : 0;  // re-read from L1: NaN skipped
  }
  const auto nonep = [](int, uint32_t(&)[kP]) {};
  const auto noneb = [](int, uint32_t(&)[kNB]) {};
  find_threshold<kNB>(bkey, 1, noneb, static_cast<uint32_t>(min(kb, nb)), sh);
  uint32_t keep = 0;  // bit b: block b of this thread kept
  emit_selected<kNB>(bkey, 1, noneb, sh, [&](int, int j, uint32_t kk, uint32_t) {
    if (kk > kNegInfKey) keep |= 1u << j;
  });
  uint8_t* mrow = mask + row * n;
  if (first + kP <= n && ((row * n + first) & 15) == 0 && (reinterpret_cast<uintptr_t>(mask) & 15) == 0) {
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) w[q] |= ((keep >> ((4 * q + i) / kBS)) & 1u) << (8 * i);
    }
    *reinterpret_cast<uint4*>(mrow + first) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    for (int i = 0; i < kP && first + i < n; ++i) mrow[first + i] = static_cast<uint8_t>((keep >> (i / kBS)) & 1u);
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
  if (filtered_select<kP>(key, 1, n, nonep, key_at, k32, sh, filter_smem, filter_smem + kCand, put)) return;
  find_threshold<kP>(key, 1, nonep, k32, sh);
  emit_selected<kP>(key, 1, nonep, sh, [&](int, int j, uint32_t kk, uint32_t slot) { put(first + j, kk, slot); });
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
  copy_to_host(&seen, nan.get(), sizeof(int));
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
  if (block_size == 8 && n <= kTile && topk_blocks > 0 && k >= 0 && k <= n) {
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(pool_topk_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kFilterSmem)));
    pool_topk_kernel<2><<<static_cast<unsigned>(rows), kThreads, kFilterSmem>>>(scores, reach, n, k, topk_blocks,
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
