// cuda/kernels.h
//
// Host-callable launchers of the ported ops (library dsv41_cuda), one group per cuda/<component>.cu,
// mirroring reference/ops/<component>.cc. Plain C++17, no CUDA types: device memory is a raw pointer,
// every launcher runs on the default stream and throws dsv41::Error when a CUDA call or launch
// fails (DSV41_CUDA_CHECK). Shapes and dtypes are those of the reference function of the same
// name; the CudaOps table (cuda/cuda_ops.h) checks shapes on the host before calling these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv41::gpu {

// ---- memory (cuda/memory.cu) ----
void copy_on_device(void* dst, const void* src, std::size_t bytes);  // synchronous D2D copy
// dst[dst_row[i]] = src[src_row[i]] for i < n, rows of `row_bytes` bytes (index arrays on device;
// nullptr = the identity).
void copy_rows(const uint8_t* src, const int64_t* src_row, uint8_t* dst, const int64_t* dst_row, int64_t n,
               int64_t row_bytes);
// y[t, off .. off + w) = x[t, 0 .. w): x [T, w], y [T, width] fp32.
void copy_cols(const float* x, int64_t T, int64_t w, float* y, int64_t width, int64_t off);
// y[i] += b[i], i < n (fp32, one add each: add_markov_bias).
void add_in_place(float* y, const float* b, int64_t n);
// *status = 1 (device int) when some flags[i] != 1, i < n (the finite flags of pack_rows: a
// deferred check, cuda/deferred_checks.h); no synchronization.
void flag_unless_all_set(const uint8_t* flags, int64_t n, int* status);

// ---- fp4_unpack.cu ----
// packed [n/2] bytes (two E2M1 codes each, low nibble first; n even) -> values [n] fp32 (exact).
void unpack_f4(const uint8_t* packed, int64_t n, float* values);

// ---- embedding.cu ----
// tokens [T] (checked on the host), table [vocab, dim] -> stream [T, hc, dim].
void embed(const int64_t* tokens, int64_t T, const float* table, int64_t dim, int64_t hc, float* stream);

// ---- rmsnorm.cu ----
// x [rows, n] -> y [rows, n] bf16: rms_norm_row of reference/ops/rmsnorm.cc (torch's sum order).
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t n, double eps, float* y);

// ---- rope.cu ----
// rope_rows of reference/ops/rope.h in place; cos/sin: [max_seq_len, rd/2] fp32 tables.
void rope_rows(float* x, int64_t T, int64_t heads, int64_t width, int64_t rd, const float* cos, const float* sin,
               int64_t first_pos, int64_t pos_stride, bool inverse);

// ---- linear.cu ----
// Outputs status: 0 when every input was valid, else nonzero (the caller re-runs the reference to
// raise its exact error). x [T, in]; y [T, out].
// kind 0: F8 (tile scales [ceil(out/32), in/32]), 1: F4 (row scales [out, in/32]): block-scaled.
int block_scaled_linear(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                        int64_t out, float* y);
// to_bf16: double sum in index order -> fp32 -> bf16 (BF16 weights, x must be bf16 values);
// else fp32 FMA chain in index order (fp32 out). wscale != nullptr: w values * scale first
// (linear_fp32 of F8/F4 weights; tile_scales as above).
int plain_linear(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                 int64_t out, bool to_bf16, float* y);
// The two without a synchronization (DSV41_CUDA_DEFER_CHECKS): an invalid input sets *status (a
// device int the caller zeroed; never cleared here) and the kernels still run on what they got.
// status may be nullptr only for plain_linear_async with to_bf16 false (it checks nothing).
void block_scaled_linear_async(const float* x, int64_t T, int64_t in, const float* w, const float* wscale,
                               bool tile_scales, int64_t out, float* y, int* status);
void plain_linear_async(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                        int64_t out, bool to_bf16, float* y, int* status);
// grouped_linear: x [T, G * width], w [out, width] bf16 -> y [T, out] bf16 (checks nothing, as the
// reference's grouped_linear).
void grouped_linear(const float* x, int64_t T, int64_t groups, int64_t width, const float* w, int64_t out, float* y);

// ---- linear_fp8_mma.cu, linear_fp8_wgmma.cu (PRODUCTION, order-variant: backend `cuda`; docs/cuda.md) ----
// E4M3 values [n] (exact) -> their codes [n].
void encode_e4m3(const float* values, int64_t n, uint8_t* codes);
// act_quant of x [T, in] (bf16 values, in % 32 == 0) as the reference: codes [T, in] E4M3 bytes,
// scales [T, in/32] E8M0 values. Returns status (nonzero: a non-bf16 value or a non-finite block).
int act_quant_codes(const float* x, int64_t T, int64_t in, uint8_t* codes, float* scales);
// y [T, out] bf16 = the block-scaled F8 linear on the fp8 tensor cores: per 32-wide K block one
// wgmma m64nNk32 e4m3 (fresh accumulator), promoted to an fp32 CUDA-core accumulator per block
// in K order. x_codes [T, in], x_scales [T, in/32], w_codes [out, in], w_scales [ceil(out/32), in/32].
// The kernel named by fp8_linear_kernel() (DSV41_FP8_LINEAR_KERNEL); all give the same bits.
void fp8_mma_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                          const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
// The two GEMM kernels: serial (cuda/linear_fp8_wgmma.cu: wgmma, wait, promote, one block at a
// time) and pipelined (cuda/linear_fp8_wgmma_pipe.cu: block b + 1's wgmma in flight while block b
// is promoted; 64-row tiles for T <= 64).
// pipelined-tma: the pipelined kernel with its code tiles loaded by the bulk tensor copy (TMA) from
// one thread instead of cp.async from all (same bits).
// ws: warp-specialized (cuda/linear_fp8_wgmma_ws.cu: a producer warpgroup's TMA copies and scale
// products feed one or two consumer warpgroups through an mbarrier ring; same bits).
enum class Fp8LinearKernel { kSerial, kPipelined, kPipelinedTma, kWs };
// DSV41_FP8_LINEAR_KERNEL = serial | pipelined | pipelined-tma | ws (unset: pipelined-tma, the
// fastest on the H100 in session 19, bench/RESULTS.md), read at each call;
// another value throws.
Fp8LinearKernel fp8_linear_kernel();
void fp8_wgmma_serial_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                                   const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
void fp8_wgmma_pipelined_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                                      const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
void fp8_wgmma_pipelined_tma_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                                          const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
void fp8_wgmma_ws_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                               const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
// The same with mma.sync m16n8k32 e4m3 (the first kernel, kept for comparison: bench/).
void fp8_mma_sync_linear_codes(const uint8_t* x_codes, const float* x_scales, int64_t T, int64_t in,
                               const uint8_t* w_codes, const float* w_scales, int64_t out, float* y);
// act_quant_codes then fp8_mma_linear_codes; returns act_quant's status (y unwritten when nonzero).
int fp8_mma_linear(const float* x, int64_t T, int64_t in, const uint8_t* w_codes, const float* w_scales,
                   int64_t out, float* y);
// The two without a synchronization (DSV41_CUDA_DEFER_CHECKS): act_quant's status goes to *status (a
// device int the caller zeroed; set, never cleared) and the GEMM runs on whatever act_quant gave.
void act_quant_codes_async(const float* x, int64_t T, int64_t in, uint8_t* codes, float* scales, int* status);
void fp8_mma_linear_async(const float* x, int64_t T, int64_t in, const uint8_t* w_codes, const float* w_scales,
                          int64_t out, float* y, int* status);
// The tensor-core probes of tests/cuda/linear_production_test.cc: a [64, 32], b [8, 32] E4M3 codes
// (device, K contiguous) -> d [64, 8] fp32, each 32-wide dot in one instruction with a zero
// accumulator: 4 mma.sync m16n8k32, or one wgmma m64n8k32 (the production kernel's layout).
void fp8_mma_sync_probe(const uint8_t* a, const uint8_t* b, float* d);
void fp8_wgmma_probe(const uint8_t* a, const uint8_t* b, float* d);

// ---- mhc.cu ----
void hc_identity_pre(int64_t T, int64_t hc, float* pre);  // pre [T, hc]: column 0 = 1, else 0
// stream [T, hc, dim], pre [T, hc] -> y [T, dim] bf16.
void hc_pre(const float* stream, const float* pre, int64_t T, int64_t hc, int64_t dim, float* y);
// f [T, dim], residual [T, hc, dim], post [T, hc], comb [T, hc, hc] -> y [T, hc, dim] bf16.
void hc_post(const float* f, const float* residual, const float* post, const float* comb, int64_t T, int64_t hc,
             int64_t dim, float* y);
// hc_raw_mixes of reference/ops/mhc.h: stream [T, hc, dim] bf16, fn [(2+hc)*hc, hc*dim] fp32 ->
// mixes [T, (2+hc)*hc] fp32; r [T] is scratch (the per-token rsqrt). hc*dim < 32768 (checked by
// the caller: the reference's torch sum order is not modelled beyond).
void hc_raw_mixes(const float* stream, const float* fn, int64_t T, int64_t hc, int64_t dim, double norm_eps,
                  float* r, float* mixes);
// stream [T, hc, dim] -> y [T, dim] bf16: the fp32 sum of the copies in order, / hc (dspark hc_mean).
// hc_split_sinkhorn of reference/ops/mhc.h, one thread per token (libm_expf for the comb's exp):
// mixes [T, (2+hc)*hc] fp32, scale [3], base [(2+hc)*hc] -> pre [T, hc], post [T, hc], comb [T, hc, hc].
void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int64_t T, int64_t hc, int iters,
                       double hc_eps, float* pre, float* post, float* comb);
void hc_mean(const float* stream, int64_t T, int64_t hc, int64_t dim, float* y);

// ---- compressor.cu ----
// compress's pooling (reference/ops/compressor.cc): groups first_group .. first_group + n_groups - 1
// -> latent [n_groups, dim] bf16. kv, score: [T, dim] fp32 rows of tokens start_pos ..; a group's
// tokens before start_pos are read from kv_state / score_state [ratio, dim] (slot = t).
void compress_pool(const float* kv, const float* score, int64_t dim, int64_t start_pos, int ratio,
                   const float* kv_state, const float* score_state, int64_t first_group, int64_t n_groups,
                   float* latent);
// State slots p % ratio <- the input rows of tokens p_lo .. p_hi - 1 (after compress_pool).
void compress_state_write(const float* kv, const float* score, int64_t dim, int64_t start_pos, int ratio,
                          int64_t p_lo, int64_t p_hi, float* kv_state, float* score_state);
// y[i] = libm_expf(the float with bits first + i), i < n (cuda/libm_expf.h; its exhaustive test).
void libm_expf_range(uint32_t first, int64_t n, float* y);

// ---- attention.cu ----
// sparse_attn's device stages (reference/ops/attention.h): q [T, H, D], kv [N, D], idxs [T, K] (every
// index in [-1, N): checked by the caller). Scores s [T, H, K] = fl(fma-chain(q, kv_j) * scale),
// -inf for -1. Then, with the host's bf16 probabilities p [T, H, K], per-block rescale factors
// [T, H, ceil(K/64)] and denominators l [T, H]: out [T, H, D] bf16.
void sparse_attn_scores(const float* q, const float* kv, const int32_t* idxs, int64_t T, int64_t H, int64_t D,
                        int64_t K, float scale, float* s);
// The online softmax of every (t, h) row of s [T, H, K] with sink [H]: p [T, H, K] bf16 values,
// rescale [T, H, ceil(K/64)], l [T, H] (reference::OnlineSoftmax with libm_expf).
void sparse_attn_softmax(const float* s, const float* sink, int64_t T, int64_t H, int64_t K, float* p,
                         float* rescale, float* l);
void sparse_attn_pv(const float* kv, const int32_t* idxs, const float* p, const float* rescale, const float* l,
                    int64_t T, int64_t H, int64_t D, int64_t K, float* out);
// ---- attention_mma.cu (PRODUCTION, order-variant: backend `cuda`; docs/cuda.md) ----
// sparse_attn on the bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate), one pass: q [T, H, D]
// and kv [N, D] as bf16 bits, idxs [T, K] (each in [-1, N): checked by the caller), sink [H] fp32
// -> out [T, H, D] bf16 values (fp32 storage; _bf16: bf16 bits). D in {128, 256, 512}.
// Error bound: scenarios/judge/sparse_attn_mma_bound.h.
bool sparse_attn_mma_supported(int64_t D);
void sparse_attn_mma(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                     int64_t H, int64_t D, int64_t K, float scale, float* out);
void sparse_attn_mma_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                          int64_t H, int64_t D, int64_t K, float scale, uint16_t* out);
// The same on wgmma (cuda/attention_wgmma.cu: 2 warpgroups, M = 64 heads): the production path's
// kernel, in three variants. kCoalesced (the default): P . V takes P from registers, each warp
// gathers whole KV rows; kRowGather: P from registers, one KV row per thread group (session 15's
// production kernel; the same bits as kCoalesced); kSharedP: P from a shared tile, the row gather.
enum class AttnWgmmaVariant { kCoalesced, kRowGather, kSharedP };
void sparse_attn_wgmma(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                       int64_t H, int64_t D, int64_t K, float scale, float* out,
                       AttnWgmmaVariant variant = AttnWgmmaVariant::kCoalesced);
void sparse_attn_wgmma_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                            int64_t H, int64_t D, int64_t K, float scale, uint16_t* out,
                            AttnWgmmaVariant variant = AttnWgmmaVariant::kCoalesced);
// y [n] = the bf16 bits of x [n] (fp32 storage); *flag (device, zeroed by the caller) = 1 when some
// x is not a bf16 value.
void to_bf16_bits(const float* x, int64_t n, uint16_t* y, int* flag);
// The probes of tests/cuda/sparse_attn_production_test.cc: one mma.sync m16n8k16 bf16 (a [16][16],
// b [8][16] bf16 bits, k contiguous; c, d [16][8] fp32: d = c + a b^T), and the kernel's exp2f.
void bf16_mma_probe(const uint16_t* a, const uint16_t* b, const float* c, float* d);
// One wgmma m64n32k16 bf16 in cuda/attention_wgmma.cu's layout: a [64][16], b [32][16] bf16 bits
// (k contiguous), c, d [64][32] fp32: d = c + a b^T.
void bf16_wgmma_probe(const uint16_t* a, const uint16_t* b, const float* c, float* d);
void exp2_probe(const float* x, int64_t n, float* y);
// attention_index_rows: window [rows, kw], topk [rows, kt] -> out [rows, kw + width] int32.
void attention_index_rows(const int32_t* window, int64_t kw, const int32_t* topk, int64_t kt, int64_t rows,
                          int64_t offset, int64_t width, int32_t* out);

// ---- engram.cu ----
// engram_lookup: codes [rows, head_dim] E4M3, scales [rows, head_dim/32] E8M0, ids [T, cols] (each
// in [0, rows): checked by the caller) -> out [T, cols * head_dim] bf16.
void engram_lookup(const uint8_t* codes, const uint8_t* scales, int64_t head_dim, const int64_t* ids, int64_t T,
                   int64_t cols, float* out);
// engram_gate_residual: x [T, hc, dim], kv [T, (hc+1)*dim], q/k weights [hc*dim] (dim < 32768),
// inv_sqrt_dim = fp32(dim^-0.5) -> gates [T, hc] (scratch) and out [T, hc, dim] bf16.
void engram_gate_residual(const float* x, const float* kv, const float* q_weight, const float* k_weight, int64_t T,
                          int64_t hc, int64_t dim, double eps, float inv_sqrt_dim, float* gates, float* out);

// ---- moe.cu ----
// acc [T, dim] fp32 += y [n, dim] row i into row tokens[i] (device [n], each in [0, T)), i in order.
void moe_scatter_add(float* acc, const float* y, const int64_t* tokens, int64_t n, int64_t dim);
// out[k] = bf16(acc[k] + shared[k]), k < n.
// reference::swiglu: g, u [n, inter] bf16, routing_weight [n] fp32 or nullptr -> h [n, inter] bf16.
void swiglu(const float* g, const float* u, const float* routing_weight, int64_t n, int64_t inter, double limit,
            float* h);
void moe_finish(const float* acc, const float* shared, int64_t n, float* out);

// ---- indexer.cu ----
// index_weights: w[k] = bf16(proj[k] * scale), k < n.
void index_weights(const float* proj, int64_t n, float scale, float* w);
// index_scores: q [T, heads, d], keys [n, d], w [T, heads], reach [T] (device, each in [0, n]) ->
// scores [T, n] bf16 (-inf from reach[t] on).
// Bit-exact on every input; FP4-QDQ q and keys take the int8 tensor-core path, the rest the
// double-precision path (the top of cuda/indexer.cu says which pairs and why).
void index_scores(const float* q, const float* keys, const float* w, const int64_t* reach, int64_t T, int64_t heads,
                  int64_t d, int64_t n, float* scores);
// The path of the last index_scores call (synchronizes the device): mma = the tensor-core path ran;
// slow_queries / slow_keys = the queries (any of their head rows) and keys it could not encode, whose
// pairs the double-precision path computed (all of them when mma is false).
struct IndexScoresPath {
  bool mma = false;
  int64_t queries = 0, keys = 0, slow_queries = 0, slow_keys = 0;
};
IndexScoresPath index_scores_last_path();

// ---- topk.cu ----
// select_index_topk (offset 0): scores [rows, n] (no NaN: returns false when one is met, out then
// unspecified), reach [rows] on the device, k = min(index_topk, n) -> out [rows, k] int32: the k
// best positions (value descending, lower index first) in ascending order, -1 from reach[t] on.
// Synchronizes (the NaN answer).
bool index_topk(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t k, int32_t* out);
// index_topk without a synchronization: a NaN sets *nan_flag = 1 (device int, never cleared);
// mask [rows, n] uint8 or nullptr: positions with mask 0 count as -inf (apply_candidate_mask fused,
// the scores are not written). chunk: positions per CTA of the first level (0 = automatic; a
// bench knob). 0 <= k <= n.
void index_topk_async(const float* scores, const uint8_t* mask, const int64_t* reach, int64_t rows, int64_t n,
                      int64_t k, int32_t* out, int* nan_flag, int64_t chunk = 0);
// select_candidate_blocks' mask: scores [rows, n], reach [rows] (device) -> mask [rows, n] uint8.
void candidate_blocks(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t topk_blocks,
                      int64_t block_size, uint8_t* mask);
// The candidate-source layer's two outputs of the same scores: candidate_blocks' mask and the
// index_topk_async picks (k <= n); one kernel when block_size == 8 and n <= 16384.
void candidate_pool_topk(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t k,
                         int64_t topk_blocks, int64_t block_size, uint8_t* mask, int32_t* out, int* nan_flag);
// apply_candidate_mask: scores[i] = -inf where mask[i] == 0, i < n (in place).
void mask_scores(float* scores, const uint8_t* mask, int64_t n);

}  // namespace dsv41::gpu
