// cuda/index_select.h
//
// The PRODUCTION fused indexer (backend `cuda`, claim order-variant; docs/cuda.md "Production
// ops", docs/indexer.md "The fused op"): Ops::index_select in two launches, with no [T, N] score
// matrix anywhere. Host header, no CUDA types (cuda/index_select.cu has the kernels).
//
//   1. encode: each (query, head) row of the FP4-QDQ queries as int8 codes c * 2^e (|c| <= 127,
//      cuda/indexer_mma.cuh) and its weight as w' = w * 2^e (bf16 |w'| and a sign).
//   2. select: a cluster of S CTAs (S <= 8) per group of 4 query rows; CTA s of the cluster owns
//      keys [s L, (s + 1) L). Chunk by chunk it decodes the packed index-key entries (E2M1 nibbles
//      + E8M0 per 32 channels) straight from the cache into int8 codes in shared memory, scores
//      16 keys per warp step with int8 mma.sync (exact integer dots) and keeps only the bf16
//      score of each (row, key) of its range in shared memory. The candidate source then takes
//      block maxima and the candidate top-k of the blocks, a layer inside the pool scores only
//      keys whose pool byte is set (a 16-key tile outside the pool costs no mma), and the top-k
//      is a radix select over the cluster (histograms exchanged through distributed shared
//      memory), lower position first among equal scores, written in ascending order.
//      (IndexSelectArgs::decode: the decode-shaped kernel instead, 16 rows per CTA over its
//      resident keys, cuda/index_select_decode.cu.)
//   3. merge (n > 65536 keys, or a chosen split): the keys are cut into ranges of R <= 65536, a
//      cluster each; a range writes its own top-min(k, its keys) positions (and the candidate
//      source its top blocks) as (score key, position) candidates to the workspace, and a merge
//      kernel selects the row's top-k (blocks) among them by the same rule (every global pick is
//      among its range's picks under the same total order): the same picks as one range, bit for bit.
//
// Inputs it does not cover: index_select_fits() says false, or the encode flags a row or key it
// cannot hold exactly (a query not on the FP4 grid, key block scales spanning more than a factor
// 8, extreme exponents or weights): index_select_flagged() then says true and the caller runs the
// composition of the exact ops instead.
#pragma once

#include <cstdint>

namespace dsv41::gpu {

struct IndexSelectArgs {
  const float* q = nullptr;        // [T, heads, dim] FP4-QDQ bf16 values (device)
  const float* w = nullptr;        // [T, heads] bf16 index weights (device)
  const uint8_t* keys = nullptr;   // index-key cache entries, the first n used (device)
  const int64_t* reach = nullptr;  // [T], each in [0, n] (device)
  const uint8_t* pool = nullptr;   // [T, n] candidate mask of the source, or null (device)
  int64_t T = 0, heads = 0, dim = 0, n = 0;
  int64_t k = 0;                   // min(index_topk, n)
  int64_t topk_blocks = 0;         // > 0: the candidate source (mask written)
  int64_t block_size = 0;
  int32_t* topk = nullptr;         // [T, k] out (device)
  uint8_t* mask = nullptr;         // [T, n] out (device; the candidate source only)
  uint8_t* workspace = nullptr;    // index_select_workspace_bytes(args) (device)
  // The split (tests and the bench; 0, 0: automatic, one range up to 65536 keys, else ranges of
  // 65536 in clusters of 8): ranges of range_keys keys in clusters of `cluster` CTAs (range_keys a
  // multiple of 128 cluster, at most 8192 keys per CTA). Any split gives the same picks.
  int64_t range_keys = 0, cluster = 0;
  // Pipeline the key chunks: two code buffers, one barrier per chunk, chunk c + 1 expanded and chunk
  // c + 2's packed bytes loaded while chunk c is scored (the same codes, the same picks). Off: the
  // session-18 loop (decode, barrier, score, barrier), timed beside it by the bench until a device
  // run settles the default.
  bool prefetch = false;
  // A tile's A fragments by 4 ldmatrix.x4 instead of 16 32-bit shared loads (the same fragments).
  bool ldmatrix = false;
  // Warp-aggregated histogram atomics in the radix select (__match_any_sync; the same counts).
  bool warp_hist = false;
  // With the default split of one range: while the device cannot hold all of the scoring kernel's
  // clusters at once (cudaOccupancyMaxActiveClusters), halve the cluster (ranges of S/2 CTAs of the
  // same keys, and the merge). The same picks; off until a device run settles it.
  bool fit_wave = false;
  // The decode-shaped scoring kernel (cuda/index_select_decode.cu): each CTA decodes its keys (at
  // most 1024; by default clusters of 8 CTAs of 512 keys, ranges of 4096 and the merge) ONCE into
  // shared memory and scores 16 query rows against them (the queries as the mma A operand), instead
  // of streaming 2048 keys for 4 rows. The same integer dots and the same head-sum order, so the
  // same picks. Ignores prefetch, ldmatrix and fit_wave; where its split does not fit (more than
  // 1024 keys per CTA chosen, or more candidates than the merge holds) the streaming kernel runs.
  // Off until a device run settles it.
  bool decode = false;
};

// Whether the kernels cover these shapes: heads <= 32, dim a multiple of 32 up to 128, 1 <= k <= n,
// block_size dividing 128 for the source, and the merge's candidates per row (ceil(n / 65536)
// ranges times min(k, 65536), and times min(topk_blocks, 65536 / block_size) for the source) at
// most 65536 (n up to 2^23 keys at k 512, 2^21 for the source with 2048 blocks of 8).
bool index_select_fits(int64_t heads, int64_t dim, int64_t n, int64_t k, int64_t topk_blocks, int64_t block_size);
int64_t index_select_workspace_bytes(const IndexSelectArgs& args);  // uses T, n, k, the source, the split
// The split index_select launches for args (T, n, k, the source, the split) and how many of its
// clusters the device holds at once (cudaOccupancyMaxActiveClusters): for the bench.
struct IndexSelectSplit {
  int cluster = 0, keys_per_cta = 0, ranges = 0, merge_cluster = 0;
  bool decode = false;           // the decode-shaped kernel runs
  int64_t clusters = 0;          // of the scoring kernel
  int max_active_clusters = 0;
};
IndexSelectSplit index_select_split(const IndexSelectArgs& args);
// Launches both kernels on the default stream (no synchronization).
void index_select(const IndexSelectArgs& args);
// Whether the last index_select on this workspace met an input it cannot hold exactly (its
// outputs are then unspecified). Synchronizes (a 4-byte download).
bool index_select_flagged(const uint8_t* workspace);

}  // namespace dsv41::gpu
