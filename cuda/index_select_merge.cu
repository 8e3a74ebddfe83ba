// cuda/index_select_merge.cu: the merge of a ranged fused-indexer selection (cuda/index_select.h,
// step 3; MergeParams in cuda/index_select_select.cuh says what the ranges wrote).
//
// A cluster of S CTAs (512 threads = 4 query rows x 4 warps, as the scoring kernel) per group of 4
// rows; a row's candidates, G ranges x kc slots in (range, slot) order = position order, are cut
// into S equal parts, part q on CTA q. Slots past a short last range's count get the key 0, below
// every score's key (-inf is 0x007F; the sums are never NaN), so they are never picked (a row has
// at least k real candidates). cluster_select then picks the row's top-k with the tie rule in
// element order, which is position order. The candidate source first merges its blocks the same
// way: a picked block of score > -inf sets its positions in the (zeroed) mask, a -inf filler is
// dropped, as in one range.
#include <algorithm>

#include "base/error.h"
#include "cuda/common.cuh"
#include "cuda/index_select_select.cuh"

namespace dsv41::gpu::index_select_detail {
namespace {

// Loads this CTA's share of row r's candidates (G ranges of `slots`, range g holding min(slots,
// count(g)) of them) as order keys into a[r * cap ..]; returns the share's size.
template <class Count>
__device__ int load_keys(const uint32_t* c, bool live, int G, int slots, int cap, uint16_t* a, const Count& count) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / kTeamWarps, tt = (warp % kTeamWarps) * 32 + lane;
  const int64_t e0 = static_cast<int64_t>(cg::this_cluster().block_rank()) * cap;
  const int m = static_cast<int>(clamp64(static_cast<int64_t>(G) * slots - e0, 0, cap));
  for (int i = tt; i < m; i += kTeam) {
    const int64_t e = e0 + i;
    const int g = static_cast<int>(e / slots), j = static_cast<int>(e % slots);
    a[r * cap + i] = live && j < min(static_cast<int64_t>(slots), count(g)) ? static_cast<uint16_t>(c[e] >> 16) : 0;
  }
  return m;
}

__global__ void __launch_bounds__(kThreads, 1) merge_kernel(const MergeParams p) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) uint8_t smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  uint16_t* a = reinterpret_cast<uint16_t*>(smem + (sizeof(Shared) + 15) / 16 * 16);  // [kRows][cap]
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int r = warp / kTeamWarps;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kRows + r;
  const bool live = t < p.T;
  const int64_t reach = live ? p.reach[t] : 0;
  const auto range_keys = [&](int g) { return min(p.n, (g + 1) * p.R) - g * p.R; };
  const int64_t rank = cluster.block_rank();  // holds elements [rank cap, rank cap + cap)

  if (p.bcand != nullptr) {  // the candidate source's blocks
    const int bs = p.block_size, cap = (p.G * p.kbc + p.S - 1) / p.S;
    const uint32_t* c = p.bcand + (live ? t : 0) * p.G * p.kbc;
    const int m = load_keys(c, live, p.G, p.kbc, cap, a, [&](int g) { return (range_keys(g) + bs - 1) / bs; });
    __syncthreads();
    const int64_t nblocks = (p.n + bs - 1) / bs;
    const uint32_t kb = live ? static_cast<uint32_t>(min(p.topk_blocks, nblocks)) : 0u;
    cluster_select<true>(cluster, sh, a, cap, m, kb, [&](int i, uint32_t) {
      const int64_t e = rank * cap + i;
      const uint32_t v = c[e];
      if ((v >> 16) <= kNegInfKey) return;  // a -inf block picked as filler is dropped
      const int64_t first = (e / p.kbc) * (p.R / bs) * bs + static_cast<int64_t>(v & 0xFFFFu) * bs;
      for (int64_t j = first; j < min(p.n, first + bs); ++j) p.mask[t * p.n + j] = 1;
    });
    __syncthreads();
  }
  const int cap = (p.G * p.kc + p.S - 1) / p.S;
  const uint32_t* c = p.cand + (live ? t : 0) * p.G * p.kc;
  const int m = load_keys(c, live, p.G, p.kc, cap, a, range_keys);
  __syncthreads();
  const uint32_t k = live ? static_cast<uint32_t>(p.k) : 0u;
  cluster_select<true>(cluster, sh, a, cap, m, k, [&](int i, uint32_t slot) {
    const int64_t e = rank * cap + i;
    const int64_t pos = (e / p.kc) * p.R + (c[e] & 0xFFFFu);
    p.topk[t * p.k + slot] = pos < reach ? static_cast<int32_t>(pos) : -1;
  });
}

}  // namespace

int merge_cluster_size(int64_t G, int64_t kc, int64_t kbc) {
  const int64_t most = G * std::max(kc, kbc);
  const int64_t S = (most + kMaxLocal - 1) / kMaxLocal;
  return S <= kMaxCluster ? static_cast<int>(std::max<int64_t>(S, 1)) : 0;
}

void launch_merge(const MergeParams& p) {
  DSV41_CHECK(p.S >= 1 && p.S <= kMaxCluster && p.G >= 2 && p.kc >= 1 && p.cand != nullptr && p.topk != nullptr &&
                  (p.bcand == nullptr || (p.kbc >= 1 && p.mask != nullptr)),
              "index_select merge: ", p.G, " ranges of ", p.kc, " and ", p.kbc, " candidates on ", p.S, " CTAs");
  const int64_t most = static_cast<int64_t>(p.G) * std::max(p.kc, p.bcand != nullptr ? p.kbc : 0);
  const int64_t cap = (most + p.S - 1) / p.S;
  DSV41_CHECK(cap <= kMaxLocal, "index_select merge: ", most, " candidates per row on ", p.S, " CTAs");
  const size_t smem = (sizeof(Shared) + 15) / 16 * 16 + static_cast<size_t>(kRows) * cap * 2;
  DSV41_CUDA_CHECK(cudaFuncSetAttribute(merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(p.S), static_cast<unsigned>((p.T + kRows - 1) / kRows), 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.S);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DSV41_CUDA_CHECK(cudaLaunchKernelEx(&cfg, merge_kernel, p));
}

}  // namespace dsv41::gpu::index_select_detail
