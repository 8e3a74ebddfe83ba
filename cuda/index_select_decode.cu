// cuda/index_select_decode.cu: the decode-shaped scoring kernel of the production fused indexer
// (IndexSelectArgs::decode, off by default; cuda/index_select.h says what the op computes and
// cuda/index_select.cu how the streaming kernel scores).
//
// Why: at decode (T 64 x N 16384) the streaming kernel's CTA scans 2048 keys for only 4 query rows
// (each key decoded by 16 CTAs, each decoded chunk used by 4 rows, a barrier per chunk: ncu in
// bench/RESULTS.md session 18, 25% occupancy, latency-bound). Here a CTA (512 threads, a cluster of
// S per range as there) decodes its L <= 1024 keys once into shared memory (int8 rows of 144 bytes,
// 2^ek per key) and scores kDecodeRows = 16 query rows (grid.y) against all of them, then selects
// the 16 rows at once, a warp per row (DecodeShared), with the shared select_group (the same block
// maxima, candidate top-k, mask and position top-k, or the range's candidates for the merge: the
// selection is exact whatever threads run it).
//
// Scoring: the queries are the mma A operand (m16n8k32: 16 (query, head) rows x 32 channels), the
// keys the B operand (8 keys x 32 channels). Warp w takes the pair of query rows 2 (w % 8),
// 2 (w % 8) + 1 of the CTA's 16 and every other 8-key tile (w / 8, w / 8 + 2, ...). Its A fragments,
// 4 m-tiles x 4 channel steps, stay in registers; m-tile i has on row g = 4 a + q (lane group g)
// head 8 i + 2 q of query a and on row g + 8 head 8 i + 2 q + 1. So a lane's accumulators hold,
// for keys 2 (lane % 4) and + 1, exactly the 8 heads 2q, 2q + 1, 8 + 2q, ... 24 + 2q + 1 that the
// streaming kernel's lane q sums (in that order, by add_heads), and the two xor shuffles over q
// (lanes 4 apart, 8 apart) add the four partial sums as that kernel's do ((S0 + S1) + (S2 + S3):
// fp32 addition commutes exactly). Then bf16(sum x 2^ek) as there: the same bits, so the same picks.
#include <cooperative_groups.h>

#include "base/error.h"
#include "cuda/common.cuh"
#include "cuda/index_select_score.cuh"

namespace dsv41::gpu::index_select_detail {
namespace {

constexpr int kPairs = kDecodeRows / 2;      // query-row pairs per CTA
constexpr int kPairWarps = kThreads / 32 / kPairs;  // warps per pair (2)
static_assert(kDecodeRows % kRows == 0 && kPairWarps * kPairs * 32 == kThreads, "the warps split the rows");

// Shared memory: [DecodeShared][codes L x kRowBytes][kscale L fp32][sc kDecodeRows x L u16][blk
// kDecodeRows x Lb u16][kept kDecodeRows x Lb].
constexpr size_t kCodesAt = (sizeof(DecodeShared) + 15) / 16 * 16;

template <bool kWarpHist>
__global__ void __launch_bounds__(kThreads, 1) index_select_decode_kernel(const Params p) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) uint8_t smem[];
  DecodeShared& sh = *reinterpret_cast<DecodeShared*>(smem);
  const int L = p.L, Lb = p.topk_blocks > 0 ? L / p.block_size : 0;
  int8_t* codes = reinterpret_cast<int8_t*>(smem + kCodesAt);                          // [L][kRowBytes]
  float* kscale = reinterpret_cast<float*>(codes + static_cast<size_t>(L) * kRowBytes);  // [L]
  uint16_t* sc = reinterpret_cast<uint16_t*>(kscale + L);                              // [kDecodeRows][L]
  uint16_t* blk = sc + kDecodeRows * L;                                                // [kDecodeRows][Lb]
  uint8_t* kept = reinterpret_cast<uint8_t*>(blk + kDecodeRows * Lb);                  // [kDecodeRows][Lb]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, q4 = lane % 4, qa = g / 4, qq = g % 4;  // qa: the lane's query of the pair
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kDecodeRows;
  // Range rg holds keys [range0, range0 + range_n); this CTA its keys [base, base + m_local).
  const int rg = static_cast<int>(blockIdx.x / cluster.num_blocks());
  const int64_t range0 = static_cast<int64_t>(rg) * p.R, range_n = min(p.n, range0 + p.R) - range0;
  const int local0 = static_cast<int>(cluster.block_rank()) * L;
  const int64_t base = range0 + local0;
  const int m_local = static_cast<int>(clamp64(range_n - local0, 0, L));

  if (threadIdx.x == 0) sh.flag = 0;
  __syncthreads();
  for (int c0 = 0; c0 < m_local; c0 += kChunk) {  // every key of the CTA, once
    RawBlock raw;
    load_block(p, base + c0, raw);
    expand_chunk(p, base + c0, raw, codes + c0 * kRowBytes, kscale + c0, sh);
  }

  // This lane's query row and its fragments (zero codes for a row past T).
  const int pair = warp % kPairs, part = warp / kPairs, ra = 2 * pair + qa;  // ra: row in the CTA
  const int64_t t = t0 + ra;
  const bool live = t < p.T;
  const int64_t reach = live ? p.reach[t] : 0;
  uint32_t aq[4][4][4], wabs[4];
  float sg[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int8_t* h0 = p.q_codes + ((live ? t : 0) * kHeads + 8 * i + 2 * qq) * kSlotD + q4 * 4;  // head 8i + 2q
    const int8_t* h1 = h0 + kSlotD;                                                               // head 8i + 2q + 1
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      aq[i][s][0] = live ? *reinterpret_cast<const uint32_t*>(h0 + s * 32) : 0u;
      aq[i][s][1] = live ? *reinterpret_cast<const uint32_t*>(h1 + s * 32) : 0u;
      aq[i][s][2] = live ? *reinterpret_cast<const uint32_t*>(h0 + s * 32 + 16) : 0u;
      aq[i][s][3] = live ? *reinterpret_cast<const uint32_t*>(h1 + s * 32 + 16) : 0u;
    }
    wabs[i] = live ? p.w_abs[t * (kHeads / 2) + i * 4 + qq] : 0u;
    sg[i][0] = live ? p.w_sign[t * kHeads + 8 * i + 2 * qq] : 1.0f;
    sg[i][1] = live ? p.w_sign[t * kHeads + 8 * i + 2 * qq + 1] : 1.0f;
  }
  const auto keep = [&](int64_t key) { return key < reach && (p.pool == nullptr || p.pool[t * p.n + key] != 0); };
  __syncthreads();  // the codes are in

  const int tiles = (m_local + 7) / 8;
  for (int tile = part; tile < tiles; tile += kPairWarps) {
    const int l = tile * 8 + 2 * q4;  // local index of this lane's first key (the second: l + 1)
    const int64_t key = base + l;
    const bool in0 = l < m_local && keep(key), in1 = l + 1 < m_local && keep(key + 1);
    uint32_t key0 = kNegInfKey, key1 = kNegInfKey;
    if (__any_sync(~0u, in0 || in1)) {
      uint32_t b[4][2];
#pragma unroll
      for (int s = 0; s < 4; ++s) {  // column g = key tile * 8 + g, channels s * 32 + 4 q4 (+ 16)
        const int8_t* kr = codes + (tile * 8 + g) * kRowBytes + s * 32 + q4 * 4;
        b[s][0] = *reinterpret_cast<const uint32_t*>(kr);
        b[s][1] = *reinterpret_cast<const uint32_t*>(kr + 16);
      }
      float sum0 = 0.0f, sum1 = 0.0f;  // keys l and l + 1, this lane's 8 heads of its query
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int acc[4];  // {head 8i + 2q, key l}, {8i + 2q, l + 1}, {8i + 2q + 1, l}, {8i + 2q + 1, l + 1}
        mma_s8_first(acc, aq[i][0], b[0][0], b[0][1]);
#pragma unroll
        for (int s = 1; s < 4; ++s) mma_s8(acc, aq[i][s], b[s][0], b[s][1]);
        add_heads(acc[0], acc[2], wabs[i], sg[i][0], sg[i][1], sum0);
        add_heads(acc[1], acc[3], wabs[i], sg[i][0], sg[i][1], sum1);
      }
      sum0 = __fadd_rn(sum0, __shfl_xor_sync(~0u, sum0, 4));
      sum1 = __fadd_rn(sum1, __shfl_xor_sync(~0u, sum1, 4));
      sum0 = __fadd_rn(sum0, __shfl_xor_sync(~0u, sum0, 8));
      sum1 = __fadd_rn(sum1, __shfl_xor_sync(~0u, sum1, 8));
      if (in0) key0 = order_key(__float2bfloat16_rn(__fmul_rn(sum0, kscale[l])));
      if (in1) key1 = order_key(__float2bfloat16_rn(__fmul_rn(sum1, kscale[l + 1])));
    }
    if (qq == 0 && l < m_local) sc[ra * L + l] = static_cast<uint16_t>(key0);
    if (qq == 0 && l + 1 < m_local) sc[ra * L + l + 1] = static_cast<uint16_t>(key1);
  }
  __syncthreads();
  if (threadIdx.x == 0 && sh.flag) atomicOr(p.flag, 1);

  // The selection of the 16 rows, warp w's row t0 + w.
  static_assert(DecodeShared::kTW == 1, "a warp per row");
  const int64_t tw = t0 + warp;
  const bool live_w = tw < p.T;
  select_group<kWarpHist>(cluster, sh, p, sc, blk, kept, tw, live_w, live_w ? p.reach[tw] : 0, rg, range0, range_n,
                          local0, m_local);
}

}  // namespace

ScoreKernel decode_kernel(bool warp_hist) {
  return warp_hist ? index_select_decode_kernel<true> : index_select_decode_kernel<false>;
}

size_t decode_smem_bytes(int L, int Lb) {
  return kCodesAt + static_cast<size_t>(L) * (kRowBytes + 4 + 2 * kDecodeRows) + static_cast<size_t>(kDecodeRows) * Lb * 3;
}

}  // namespace dsv41::gpu::index_select_detail
