// cuda/attention_split.h: the production sparse attention's split over CTAs (flash-decoding), next
// to gpu::sparse_attn_wgmma (cuda/kernels.h), implemented in cuda/attention_wgmma.cu ("Split").
// Host-only declarations: q [T, H, D] and kv [N, D] bf16 bits, idxs [T, K], sink [H] fp32 as
// sparse_attn_wgmma's; out [T, H, D] bf16 values (fp32 storage; _bf16: bf16 bits).
#pragma once

#include <cstdint>

namespace dsv41::gpu {

// The split (flash-decoding; cuda/attention_wgmma.cu "Split"), for rows too few to fill the SMs: the
// kCoalesced kernel on slices of slice_blocks 64-index blocks of each row's list (one CTA per row x
// head tile x slice), each writing its partial (running max, denominator, unnormalised output) to
// `workspace` (device, sparse_attn_wgmma_split_workspace_bytes), then a combine kernel merging the
// slices in order. A different rounding order (bound: sparse_attn_row_bound's slice_blocks); one
// slice (slice_blocks >= the row's blocks) gives the unsplit kernel's bits.
// sparse_attn_wgmma_split_pick: the slice_blocks for this shape on the current device, 0 (no split)
// when T x head tiles CTAs fill half the SMs or more, or the rows have one block.
int64_t sparse_attn_wgmma_split_pick(int64_t T, int64_t H, int64_t K);
int64_t sparse_attn_wgmma_split_workspace_bytes(int64_t T, int64_t H, int64_t D, int64_t K, int64_t slice_blocks);
void sparse_attn_wgmma_split(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                             int64_t H, int64_t D, int64_t K, float scale, float* out, int64_t slice_blocks,
                             float* workspace);
void sparse_attn_wgmma_split_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink,
                                  int64_t T, int64_t H, int64_t D, int64_t K, float scale, uint16_t* out,
                                  int64_t slice_blocks, float* workspace);

}  // namespace dsv41::gpu
