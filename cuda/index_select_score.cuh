// cuda/index_select_score.cuh: what the production fused indexer's two scoring kernels share
// (cuda/index_select.cu: a cluster per group of 4 query rows, the keys streamed in chunks;
// cuda/index_select_decode.cu: keys resident per CTA, all of a block of rows looped over them): the
// kernel parameters, the key decoding (packed entries -> int8 codes in shared memory), the head sum
// of one key's score (the exact arithmetic both kernels must reproduce) and the selection of a group
// of 4 rows after the scoring. Device header, included by those two .cu files only.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/index_key_codes.h"
#include "cuda/index_select_select.cuh"
#include "cuda/indexer_mma.cuh"

namespace dsv41::gpu::index_select_detail {

using namespace indexer_mma;

constexpr int kHeads = 32;                   // head slots (zero codes and weights past heads)
constexpr int kRowBytes = 144;               // one decoded key in shared memory (128 codes + pad)

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
  int64_t R;                // keys per range (= S L; a cluster per range and group of rows)
  int G, kc, kbc;           // ranges; candidate slots per range (positions, blocks)
  int32_t* topk;            // one range (G == 1): the final top-k and mask
  uint8_t* mask;
  uint32_t* cand;           // G > 1: the ranges' candidates (index_select_select.cuh MergeParams)
  uint32_t* bcand;
  int* flag;
};

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

// Decodes keys [key0, key0 + kChunk) into codes (rows of kRowBytes) and sh.kscale: thread 4 j + b
// takes 32-channel block b of key j (kThreads = 4 kChunk). The key's exponent is its smallest E8M0
// scale over the blocks holding a nonzero code (an all-zero block contributes 0 at any scale); a key
// it cannot encode (scales spanning more than x8, a NaN scale, |exponent| > kEBound) sets sh.flag.
// Keys >= n and channels >= dim are zero. In two steps: load_block reads the thread's packed bytes
// (issued a chunk ahead when the kernel prefetches), expand_chunk writes the codes.
struct RawBlock {
  uint32_t w[4];  // the block's 32 E2M1 nibbles
  int s;          // its E8M0 scale
};

__device__ __forceinline__ void load_block(const Params& p, int64_t key0, RawBlock& raw) {
  static_assert(kThreads == 4 * kChunk, "one thread per (key, block) of a chunk");
  const int j = static_cast<int>(threadIdx.x) / 4, b = static_cast<int>(threadIdx.x) % 4;
  const int64_t key = key0 + j;
  const bool live = key < p.n && b < p.dim / 32;
  uint32_t* w = raw.w;
  w[0] = w[1] = w[2] = w[3] = 0;
  raw.s = 0;
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
    raw.s = e[p.dim / 2 + b];
  }
}

template <class Sh>
__device__ __forceinline__ void expand_chunk(const Params& p, int64_t key0, const RawBlock& raw, int8_t* codes,
                                             float* kscale, Sh& sh) {
  const int j = static_cast<int>(threadIdx.x) / 4, b = static_cast<int>(threadIdx.x) % 4;
  const int64_t key = key0 + j;
  const bool live = key < p.n && b < p.dim / 32;
  const uint32_t(&w)[4] = raw.w;
  const int s = raw.s;
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
  if (b == 0) kscale[j] = key < p.n ? exp2i(smin - 128) : 0.0f;
}


// After the scoring: the selection of this CTA's group of Sh::kR rows (row r = warp / Sh::kTW is
// query row t, sc[r * p.L + i] the order key of its local key i, m_local of them, local keys
// [local0, local0 + m_local) of range rg = [range0, range0 + range_n)). The candidate source's
// block maxima, block top-k and mask (blk, kept: [Sh::kR][L / block_size] of shared memory), then the
// position top-k: the final picks with one range, the range's candidates otherwise. Every thread of
// the cluster calls it, after a barrier that made sc visible; it ends with a cluster barrier.
template <bool kWarpHist, class Sh>
__device__ void select_group(cg::cluster_group& cluster, Sh& sh, const Params& p, const uint16_t* sc,
                             uint16_t* blk, uint8_t* kept, int64_t t, bool live, int64_t reach, int rg, int64_t range0,
                             int64_t range_n, int local0, int m_local) {
  constexpr int kTeamT = Sh::kTW * 32;  // the row's threads
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / Sh::kTW, tt = (warp % Sh::kTW) * 32 + lane;
  const int L = p.L, Lb = p.topk_blocks > 0 ? L / p.block_size : 0;
  const int64_t base = range0 + local0;
  if (p.topk_blocks > 0) {  // the candidate source: block maxima, the block top-k, the mask
    const int bs = p.block_size;  // divides kChunk, so blocks never straddle CTAs or ranges
    const int64_t nblocks = (range_n + bs - 1) / bs, b0 = local0 / bs;  // the range's blocks, this CTA's first
    const int mb = static_cast<int>(clamp64(nblocks - b0, 0, Lb));
    const int64_t pinned = reach > 0 ? (reach - 1) / bs - range0 / bs : -1;  // the newest reachable block
    for (int i = tt; i < mb; i += kTeamT) {
      uint32_t m = 0;
      for (int j = 0; j < bs && i * bs + j < m_local; ++j) m = max(m, static_cast<uint32_t>(sc[r * L + i * bs + j]));
      blk[r * Lb + i] = static_cast<uint16_t>(b0 + i == pinned ? kPosInfKey : m);
      kept[r * Lb + i] = 0;
    }
    __syncthreads();
    const uint32_t kb = live ? static_cast<uint32_t>(clamp64(p.topk_blocks, 0, nblocks)) : 0u;
    cluster_select<kWarpHist>(cluster, sh, blk, Lb, mb, kb, [&](int i, uint32_t slot) {
      if (p.G > 1) {  // a candidate for the merge, -inf fillers included
        p.bcand[(t * p.G + rg) * p.kbc + slot] = static_cast<uint32_t>(blk[r * Lb + i]) << 16 | static_cast<uint32_t>(b0 + i);
      } else if (blk[r * Lb + i] > kNegInfKey) {
        kept[r * Lb + i] = 1;  // a -inf block picked as filler is dropped
      }
    });
    __syncthreads();
    if (live && p.G == 1) {
      for (int i = tt; i < m_local; i += kTeamT) p.mask[t * p.n + base + i] = kept[r * Lb + i / bs];
    }
  }
  const uint32_t k = live ? static_cast<uint32_t>(min(p.k, range_n)) : 0u;
  cluster_select<kWarpHist>(cluster, sh, sc, L, m_local, k, [&](int i, uint32_t slot) {
    if (p.G > 1) {
      p.cand[(t * p.G + rg) * p.kc + slot] = static_cast<uint32_t>(sc[r * L + i]) << 16 | static_cast<uint32_t>(local0 + i);
    } else {
      const int64_t pos = base + i;
      p.topk[t * p.k + slot] = pos < reach ? static_cast<int32_t>(pos) : -1;
    }
  });
}

// The decode-shaped scoring kernel (cuda/index_select_decode.cu, IndexSelectArgs::decode): kDecodeRows
// query rows per CTA (grid.y; selected together, a warp per row), at most kDecodeMaxLocal keys per
// CTA (grid.x and clusters as the streaming kernel's), shared memory decode_smem_bytes.
constexpr int kDecodeRows = 16;
using DecodeShared = SelectShared<kDecodeRows, kThreads / 32 / kDecodeRows>;
constexpr int kDecodeMaxLocal = 1024;
using ScoreKernel = void (*)(Params);
ScoreKernel decode_kernel(bool warp_hist);
size_t decode_smem_bytes(int L, int Lb);

}  // namespace dsv41::gpu::index_select_detail
