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
// Layout of one CTA (512 threads = 4 query rows x 4 warps; blockIdx.x = range g x S + cluster rank
// s, which owns keys [g R + s L, g R + s L + L); one range, R >= n, unless the keys exceed 65536 or
// the caller chose a split):
//   - the row's query codes are B fragments in registers (32 heads x 128 channels: 32 registers);
//   - per chunk of 128 keys the CTA decodes the packed entries (one thread per 32-channel block)
//     into int8 rows of 144 bytes in shared memory (the 16-byte pad makes the A-fragment loads
//     conflict free) and 2^ek per key (kPrefetch: two such buffers, the next chunk decoded while
//     this one is scored);
//   - warp w of a row takes 16-key tiles w, w + 4 of the chunk: 4 head groups x 4 channel steps of
//     mma.sync m16n8k32 (rows = 16 keys, columns = 8 heads); accumulators start at the bits of
//     1.5 * 2^23 so that each is the float 1.5 * 2^23 + I (one subtraction gives I);
//   - each (row, key) keeps only its bf16 score as a 16-bit ordered key in shared memory.
// Selection (cluster_select): per row, a two-pass 8-bit radix select whose histograms are summed
// over the cluster's CTAs through distributed shared memory, then the ties at the threshold taken
// lowest position first, and each pick's slot from scans within the CTA and counts across it
// (cuda/index_select_select.cuh). With several ranges the picks go to the workspace as candidates
// and cuda/index_select_merge.cu selects among them. The key decoding, the head sum and the
// selection after the scores are shared with the decode-shaped kernel (IndexSelectArgs::decode,
// cuda/index_select_decode.cu) in cuda/index_select_score.cuh.
#include "cuda/index_select.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "base/error.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/index_select_score.cuh"

namespace dsv41::gpu {
namespace {

using namespace indexer_mma;
using namespace index_select_detail;

constexpr int kKeysPerCta = 2048;            // the cluster grows until a CTA holds at most this

// Workspace: [flag int, pad to 16][q codes T x 32 x 128][|w'| T x 32 bf16][sign(w') T x 32 fp32]
// and, for a ranged selection, [cand T x G x kc u32][bcand T x G x kbc u32] (index_select_select.cuh).
int64_t codes_offset() { return 16; }
int64_t wabs_offset(int64_t T) { return codes_offset() + T * kHeads * kSlotD; }
int64_t wsign_offset(int64_t T) { return wabs_offset(T) + T * kHeads * 2; }
int64_t cand_offset(int64_t T) { return wsign_offset(T) + T * kHeads * 4; }

// The four 8 x 16-byte matrices whose row addresses lanes 8m .. 8m + 7 give, as mma A fragments:
// lane l gets bytes 4 (l % 4) .. 4 (l % 4) + 3 of row l / 4 of matrix m in a[m].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const int8_t* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
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

// kPrefetch: a pipeline of two code buffers and one barrier per chunk; while the warps score chunk
// c they expand chunk c + 1 (its packed bytes loaded into registers an iteration earlier) into the
// other buffer and load chunk c + 2's bytes. kLdmatrix: a tile's A fragments by 4 ldmatrix.x4
// instead of 16 32-bit loads. kWarpHist: warp-aggregated histogram atomics in the selection (the
// same counts). The same codes in the same fragments, so the same bits.
template <bool kPrefetch, bool kLdmatrix, bool kWarpHist>
__global__ void __launch_bounds__(kThreads, 1) index_select_kernel(const Params p) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) uint8_t smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  constexpr int kBuffers = kPrefetch ? 2 : 1;
  int8_t* codes = reinterpret_cast<int8_t*>(smem + (sizeof(Shared) + 15) / 16 * 16);  // [kBuffers][kChunk][kRowBytes]
  uint16_t* sc = reinterpret_cast<uint16_t*>(codes + kBuffers * kChunk * kRowBytes);  // [kRows][L] score keys
  const int L = p.L, Lb = p.topk_blocks > 0 ? L / p.block_size : 0;
  uint16_t* blk = sc + kRows * L;                                                     // [kRows][Lb] block keys
  uint8_t* kept = reinterpret_cast<uint8_t*>(blk + kRows * Lb);                       // [kRows][Lb]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = warp / kTeamWarps, wi = warp % kTeamWarps, g = lane / 4, q4 = lane % 4;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kRows + r;
  const bool live = t < p.T;
  // Range rg holds keys [range0, range0 + range_n); this CTA its keys [base, base + m_local).
  const int rg = static_cast<int>(blockIdx.x / cluster.num_blocks());
  const int64_t range0 = static_cast<int64_t>(rg) * p.R, range_n = min(p.n, range0 + p.R) - range0;
  const int local0 = static_cast<int>(cluster.block_rank()) * L;  // base - range0
  const int64_t base = range0 + local0;
  const int m_local = static_cast<int>(clamp64(range_n - local0, 0, L));
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

  RawBlock raw;
  if (kPrefetch) {  // chunk 0 expanded, chunk 1's bytes on their way
    __syncthreads();  // sh.flag is 0
    if (m_local > 0) {
      load_block(p, base, raw);
      expand_chunk(p, base, raw, codes, sh.kscale[0], sh);
    }
    if (kChunk < m_local) load_block(p, base + kChunk, raw);
    __syncthreads();
  }
  for (int c0 = 0, buf = 0; c0 < m_local; c0 += kChunk, buf ^= kBuffers - 1) {
    const int8_t* cur = codes + buf * kChunk * kRowBytes;
    const float* kscale = sh.kscale[buf];
    if (!kPrefetch) {
      __syncthreads();  // the previous chunk is consumed
      load_block(p, base + c0, raw);
      expand_chunk(p, base + c0, raw, codes, sh.kscale[0], sh);
      __syncthreads();
    } else if (c0 + kChunk < m_local) {  // the other buffer was consumed before the last barrier
      expand_chunk(p, base + c0 + kChunk, raw, codes + (buf ^ 1) * kChunk * kRowBytes, sh.kscale[buf ^ 1], sh);
      if (c0 + 2 * kChunk < m_local) load_block(p, base + c0 + 2 * kChunk, raw);  // in flight during the MMAs
    }
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
          if (kLdmatrix) {  // matrix m = lane / 8: keys + 8 (m & 1), bytes + 16 (m >> 1); lane i of it: row i
            const int m = lane / 8;
            ldmatrix_x4(a[s], cur + (tile * 16 + lane % 8 + 8 * (m & 1)) * kRowBytes + s * 32 + 16 * (m >> 1));
          } else {
            const int8_t* rg = cur + (tile * 16 + g) * kRowBytes + s * 32 + q4 * 4;
            a[s][0] = *reinterpret_cast<const uint32_t*>(rg);
            a[s][1] = *reinterpret_cast<const uint32_t*>(rg + 8 * kRowBytes);
            a[s][2] = *reinterpret_cast<const uint32_t*>(rg + 16);
            a[s][3] = *reinterpret_cast<const uint32_t*>(rg + 8 * kRowBytes + 16);
          }
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
        if (keep(k0 + g)) key_g = order_key(__float2bfloat16_rn(__fmul_rn(sum0, kscale[tile * 16 + g])));
        if (keep(k0 + g + 8)) key_g8 = order_key(__float2bfloat16_rn(__fmul_rn(sum1, kscale[tile * 16 + g + 8])));
      }
      if (q4 == 0 && l0 + g < m_local) sc[r * L + l0 + g] = static_cast<uint16_t>(key_g);
      if (q4 == 1 && l0 + g + 8 < m_local) sc[r * L + l0 + g + 8] = static_cast<uint16_t>(key_g8);
    }
    if (kPrefetch) __syncthreads();  // chunk c consumed, chunk c + 1 expanded
  }
  __syncthreads();
  if (threadIdx.x == 0 && sh.flag) atomicOr(p.flag, 1);

  select_group<kWarpHist>(cluster, sh, p, sc, blk, kept, t, live, reach, rg, range0, range_n, local0, m_local);
}

// The cluster size and the keys per CTA for n keys (one range).
void split_keys(int64_t n, int* S, int* L) {
  *S = static_cast<int>(std::clamp<int64_t>((n + kKeysPerCta - 1) / kKeysPerCta, 1, kMaxCluster));
  const int64_t per = (n + *S - 1) / *S;
  *L = static_cast<int>((per + kChunk - 1) / kChunk * kChunk);
}

// How a call is cut: G ranges of R = S L keys, a cluster of S CTAs of L keys per range and group of
// 4 rows; G > 1 adds the merge (a cluster of Sm CTAs per group of rows). ok: the kernels cover it.
// decode: the decode-shaped kernel (kDecodeRows rows per CTA, at most kDecodeMaxLocal keys per CTA).
struct Plan {
  bool ok = false, decode = false;
  int S = 1, L = kChunk, G = 1, Sm = 0, kc = 0, kbc = 0;
  int64_t R = 0;
};

// The decode kernel's default keys per CTA: 512 (decode T 64 x N 16384: 4 ranges of 8 CTAs x 4
// blocks of 16 rows = 128 CTAs, each key decoded by 4 CTAs instead of 16).
constexpr int kDecodeKeys = 512;

Plan plan_for(int64_t n, int64_t k, int64_t topk_blocks, int64_t block_size, int64_t range_keys, int64_t cluster,
              bool decode) {
  Plan pl;
  pl.decode = decode;
  const int64_t most_local = decode ? kDecodeMaxLocal : kMaxLocal;
  if (range_keys == 0 && cluster == 0 && decode) {  // ranges of clusters of 8 CTAs of kDecodeKeys keys
    if (n <= kMaxCluster * kDecodeKeys) {  // one range: the cluster grows until a CTA holds at most kDecodeKeys
      pl.S = static_cast<int>(std::clamp<int64_t>((n + kDecodeKeys - 1) / kDecodeKeys, 1, kMaxCluster));
      const int64_t per = (n + pl.S - 1) / pl.S;
      pl.L = static_cast<int>((per + kChunk - 1) / kChunk * kChunk);
    } else {
      pl.S = kMaxCluster, pl.L = kDecodeKeys;
    }
    pl.R = static_cast<int64_t>(pl.S) * pl.L;
  } else if (range_keys == 0 && cluster == 0) {
    if (n <= kMaxRange) {  // one range: the cluster grows until a CTA holds at most kKeysPerCta keys
      split_keys(n, &pl.S, &pl.L);
      pl.R = static_cast<int64_t>(pl.S) * pl.L;
    } else {
      pl.S = kMaxCluster, pl.L = kMaxLocal, pl.R = kMaxRange;
    }
  } else {  // chosen (tests, the bench): S CTAs of range_keys / S keys
    if (!(cluster >= 1 && cluster <= kMaxCluster && range_keys >= 1 && range_keys % (cluster * kChunk) == 0 &&
          range_keys / cluster <= most_local)) {
      return pl;
    }
    pl.S = static_cast<int>(cluster), pl.L = static_cast<int>(range_keys / cluster), pl.R = range_keys;
  }
  if (pl.L > most_local) return pl;
  const int64_t G = (n + pl.R - 1) / pl.R;
  if (G > 1) {
    pl.kc = static_cast<int>(std::min(k, pl.R));
    pl.kbc = topk_blocks > 0 ? static_cast<int>(std::min(topk_blocks, pl.R / block_size)) : 0;
    pl.Sm = merge_cluster_size(G, pl.kc, pl.kbc);
    if (pl.Sm == 0) return pl;
  }
  pl.G = static_cast<int>(G);
  pl.ok = true;
  return pl;
}

size_t select_smem(const Plan& pl, int block_size, bool source, bool prefetch) {
  const int Lb = source ? pl.L / block_size : 0;
  if (pl.decode) return decode_smem_bytes(pl.L, Lb);
  return (sizeof(Shared) + 15) / 16 * 16 + (prefetch ? 2 : 1) * kChunk * kRowBytes + static_cast<size_t>(kRows) * pl.L * 2 +
         static_cast<size_t>(kRows) * Lb * 3;
}

// The scoring kernel's launch: S G CTAs of 512 threads per group of 4 rows (the decode kernel: of
// kDecodeRows rows), clusters of S.
struct SelectLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  void (*kernel)(Params);
  SelectLaunch(const Plan& pl, int64_t T, size_t smem, const IndexSelectArgs& a)
      : kernel(pl.decode ? decode_kernel(a.warp_hist) : pick(a)) {
    DSV41_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const int rows = pl.decode ? kDecodeRows : kRows;
    cfg.gridDim = dim3(static_cast<unsigned>(pl.S * pl.G), static_cast<unsigned>((T + rows - 1) / rows), 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(pl.S);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  SelectLaunch(const SelectLaunch&) = delete;
  template <bool... kFlags>
  static auto pick(const IndexSelectArgs& a) -> void (*)(Params) {  // the instance for a's switches
    constexpr int kSet = sizeof...(kFlags);
    if constexpr (kSet == 3) {
      return index_select_kernel<kFlags...>;
    } else {
      const bool on = kSet == 0 ? a.prefetch : kSet == 1 ? a.ldmatrix : a.warp_hist;
      return on ? pick<kFlags..., true>(a) : pick<kFlags..., false>(a);
    }
  }
  SelectLaunch& operator=(const SelectLaunch&) = delete;
};

// cudaOccupancyMaxActiveClusters for the scoring kernel's launch, remembered per (device, kernel,
// cluster size, shared memory): fit_wave asks on every call.
int max_active_clusters(const Plan& pl, int64_t T, size_t smem, const IndexSelectArgs& a) {
  static std::mutex mu;
  static std::map<std::tuple<int, void*, int, size_t>, int> known;
  int device = 0;
  DSV41_CUDA_CHECK(cudaGetDevice(&device));
  SelectLaunch l(pl, T, smem, a);
  const auto key = std::make_tuple(device, reinterpret_cast<void*>(l.kernel), pl.S, smem);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int active = 0;
  DSV41_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&active, l.kernel, &l.cfg));
  known[key] = active;
  return active;
}

Plan plan_for(const IndexSelectArgs& a) {
  const int bs = static_cast<int>(a.topk_blocks > 0 ? a.block_size : 1);
  if (a.decode) {  // the decode kernel where its split fits, else the streaming kernel
    const Plan d = plan_for(a.n, a.k, a.topk_blocks, bs, a.range_keys, a.cluster, true);
    if (d.ok) return d;
  }
  Plan pl = plan_for(a.n, a.k, a.topk_blocks, bs, a.range_keys, a.cluster, false);
  if (!(pl.ok && a.fit_wave && a.range_keys == 0 && a.cluster == 0 && pl.G == 1)) return pl;
  // One range whose clusters the device cannot hold at once (decode T 64 x N 16384: 16 clusters of
  // 8 where an H100 holds 15): halve the cluster, same keys per CTA, more ranges, while that helps.
  const int64_t groups = (a.T + kRows - 1) / kRows;
  while (pl.S > 1 &&
         groups * pl.G > max_active_clusters(pl, a.T, select_smem(pl, bs, a.topk_blocks > 0, a.prefetch), a)) {
    Plan half = plan_for(a.n, a.k, a.topk_blocks, bs, static_cast<int64_t>(pl.S / 2) * pl.L, pl.S / 2, false);
    if (!half.ok) break;
    pl = half;
  }
  return pl;
}

}  // namespace

bool index_select_fits(int64_t heads, int64_t dim, int64_t n, int64_t k, int64_t topk_blocks, int64_t block_size) {
  if (heads < 1 || heads > kHeads || dim < 32 || dim > kSlotD || dim % 32 != 0 || n < 1 || k < 1 || k > n) return false;
  if (topk_blocks > 0 && (block_size < 1 || kChunk % block_size != 0)) return false;
  return plan_for(n, k, topk_blocks, topk_blocks > 0 ? block_size : 1, 0, 0, false).ok;
}

// Query rows per launch: all of them with one range; with several, chunks of kRowChunk rows, so that
// the candidates' workspace stays bounded (T x ranges x (kc + kbc) x 4 bytes otherwise: 671 MB at T
// 4096, 2^20 keys, top-k 512 and 2048 blocks; 168 MB a chunk).
constexpr int64_t kRowChunk = 1024;
int64_t rows_per_launch(const Plan& pl, int64_t T) { return pl.G > 1 ? std::min(T, kRowChunk) : T; }

int64_t index_select_workspace_bytes(const IndexSelectArgs& a) {
  const Plan pl = plan_for(a);
  DSV41_CHECK(pl.ok, "index_select_workspace_bytes: n ", a.n, ", k ", a.k, ", range_keys ", a.range_keys,
              ", cluster ", a.cluster, " not covered");
  const int64_t rows = rows_per_launch(pl, a.T);
  const int64_t cand = pl.G > 1 ? rows * pl.G * (static_cast<int64_t>(pl.kc) + pl.kbc) * 4 : 0;
  return cand_offset(rows) + cand;
}

void index_select(const IndexSelectArgs& a) {
  const Plan pl = plan_for(a);
  DSV41_CHECK(pl.ok && index_select_fits(a.heads, a.dim, a.n, a.k, a.topk_blocks, a.block_size) && a.T >= 1 &&
                  (a.topk_blocks <= 0 || a.mask != nullptr),
              "index_select: heads ", a.heads, ", dim ", a.dim, ", n ", a.n, ", k ", a.k, ", block_size ",
              a.block_size, ", range_keys ", a.range_keys, ", cluster ", a.cluster, " not covered");
  uint8_t* ws = a.workspace;
  int* flag = reinterpret_cast<int*>(ws);
  DSV41_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int)));
  const bool source = a.topk_blocks > 0;
  if (source && pl.G > 1) DSV41_CUDA_CHECK(cudaMemsetAsync(a.mask, 0, static_cast<size_t>(a.T * a.n)));
  const int64_t chunk = rows_per_launch(pl, a.T);  // the workspace's layout holds `chunk` rows
  for (int64_t t0 = 0; t0 < a.T; t0 += chunk) {
    const int64_t T = std::min(chunk, a.T - t0);
    Params p{};
    p.q_codes = reinterpret_cast<const int8_t*>(ws + codes_offset());
    p.w_abs = reinterpret_cast<const uint32_t*>(ws + wabs_offset(chunk));
    p.w_sign = reinterpret_cast<const float*>(ws + wsign_offset(chunk));
    const int64_t rows = T * kHeads;
    encode_queries_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256>>>(
        a.q + t0 * a.heads * a.dim, a.w + t0 * a.heads, T, a.heads, a.dim, reinterpret_cast<int8_t*>(ws + codes_offset()),
        reinterpret_cast<uint16_t*>(ws + wabs_offset(chunk)), reinterpret_cast<float*>(ws + wsign_offset(chunk)), flag);
    DSV41_CUDA_CHECK(cudaGetLastError());

    p.keys = a.keys;
    p.entry_bytes = a.dim / 2 + a.dim / 32;
    p.dim = static_cast<int>(a.dim);
    p.reach = a.reach + t0;
    p.pool = a.pool != nullptr ? a.pool + t0 * a.n : nullptr;
    p.T = T, p.n = a.n, p.k = a.k, p.topk_blocks = a.topk_blocks;
    p.block_size = static_cast<int>(source ? a.block_size : 1);
    p.L = pl.L, p.R = pl.R, p.G = pl.G, p.kc = pl.kc, p.kbc = pl.kbc;
    p.topk = a.topk + t0 * a.k;
    p.mask = source ? a.mask + t0 * a.n : nullptr;
    p.cand = reinterpret_cast<uint32_t*>(ws + cand_offset(chunk));
    p.bcand = p.cand + chunk * pl.G * pl.kc;
    p.flag = flag;
    const size_t smem = select_smem(pl, p.block_size, source, a.prefetch);
    SelectLaunch l(pl, T, smem, a);
    DSV41_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, l.kernel, p));
    if (pl.G == 1) continue;

    MergeParams m;
    m.cand = p.cand;
    m.bcand = source ? p.bcand : nullptr;
    m.reach = p.reach;
    m.T = T, m.n = a.n, m.k = a.k, m.topk_blocks = source ? a.topk_blocks : 0, m.R = pl.R;
    m.G = pl.G, m.kc = pl.kc, m.kbc = pl.kbc, m.block_size = p.block_size, m.S = pl.Sm;
    m.topk = p.topk;
    m.mask = p.mask;
    launch_merge(m);
  }
}

IndexSelectSplit index_select_split(const IndexSelectArgs& a) {
  const Plan pl = plan_for(a);
  DSV41_CHECK(pl.ok, "index_select_split: n ", a.n, ", k ", a.k, ", range_keys ", a.range_keys, ", cluster ",
              a.cluster, " not covered");
  IndexSelectSplit s;
  s.cluster = pl.S, s.keys_per_cta = pl.L, s.ranges = pl.G, s.merge_cluster = pl.Sm, s.decode = pl.decode;
  const int rows = pl.decode ? kDecodeRows : kRows;
  s.clusters = static_cast<int64_t>(pl.G) * ((a.T + rows - 1) / rows);
  const size_t smem =
      select_smem(pl, static_cast<int>(a.topk_blocks > 0 ? a.block_size : 1), a.topk_blocks > 0, a.prefetch);
  s.max_active_clusters = max_active_clusters(pl, a.T, smem, a);
  return s;
}

bool index_select_flagged(const uint8_t* workspace) {
  int flag = 0;
  copy_to_host(&flag, workspace, sizeof flag);
  return flag != 0;
}

}  // namespace dsv41::gpu
