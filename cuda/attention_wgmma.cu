// cuda/attention_wgmma.cu: the PRODUCTION sparse attention on Hopper's wgmma (backend `cuda`, claim
// order-variant) ↔ reference/ops/attention.cc (sparse_attn); docs/cuda.md "Production ops".
//
// The algorithm, the semantics and the softmax statements are cuda/attention_mma.cu's (read its
// header); what differs is the matrix work: 2 warpgroups, each one wgmma M = 64 (all the CTA's
// heads) at a time, operands read by the tensor cores straight from shared memory:
//   S:  warpgroup dh computes the 64 heads x 32 indices 32 dh .. 32 dh + 31 of block b over the
//       whole head dim: D/16 wgmma m64n32k16 in channel order into one accumulator (A = Q, B = the
//       KV rows, both K-major), then s2 = s * c2, -1 -> -inf; the row max of the pair of warps that
//       share 16 heads (warp w and w + 4) through shared memory, p, r, l as cuda/attention_mma.cu;
//   P:  bf16 probabilities as wgmma A fragments in registers (the production default: each warp's
//       own 32 indices, the partner warp's 32 swapped through shared memory by ordinary stores), or
//       (p_in_registers = false) into a [64][64] K-major shared tile behind fence.proxy.async (that
//       fence waits for the next block's copies still in flight); O = O * r;
//   PV: warpgroup dh: O[64 heads, D/2 channels dh D/2 ..] += P . V_b, 4 wgmma m64n(D/2)k16, A = P,
//       B = the same KV tile read MN-major (channels contiguous: the transposed operand).
// Pipelining: block b's S is issued right after the barrier, then the threads gather block b + 1's
// rows (cp.async; each row's index loaded one block earlier, so no load is waited on) while the
// tensor cores run S; P . V of block b is waited at block b + 1's top, behind the copy wait.
// O = O * r is skipped where every r of the warp is 1.
// The gather (Gather below): kCoalesced (the default): warp w copies rows 8 w .. 8 w + 7 of the
// block whole, lane l chunks l, l + 32 of a row (one warp instruction = 512 contiguous bytes of one
// row), the row's index broadcast from lane j < 8 (which loaded it a block ahead) by a shuffle;
// kRowGather (session 15): thread tid copies row tid % 64, so each warp instruction touches 32 rows
// (16 bytes each: two sector requests per 32-byte sector). Both fill the same tile, so the
// arithmetic and the output bits are the same (tests/cuda/sparse_attn_production_test.cc).
// Shared tiles: [rows][D] bf16 as D/64 atom columns of [rows][128 bytes] in the 128-byte swizzle
// (16-byte chunk c of row r at chunk c ^ (r % 8); atoms 1024-byte aligned; atom columns 8 KiB
// apart), so one KV tile serves both the K-major B of S (SBO 1024) and the MN-major B of PV (LBO
// 8 KiB between atom columns, SBO 1024 between 8-row groups). Written by cp.async, made visible to
// the tensor cores by fence.proxy.async before the barrier (HOPPER.md). Shared memory at D = 512:
// Q 64 KiB, two KV stages 128 KiB, P 8 KiB: 207,360 bytes, one CTA per SM.
// Split (flash-decoding, off by default: sparse_attn_wgmma_split*, DSV41_CUDA_ATTN_SPLIT=1 on the op
// path): decode rows (T x 64-head tiles CTAs) leave most SMs idle (decode B 1: 4 CTAs on 132 SMs),
// so grid z cuts each row's index list into slices of slice_blocks 64-blocks; each CTA runs the
// loop above on its slice from its own running max and writes (m, l, unnormalised O) to a
// workspace, and a combine kernel merges the slices in order (cuda/attention_split.cuh). Another
// rounding order than the unsplit kernel's (the bound's slice_blocks); one slice: the same bits.
// Error model: each wgmma k16 is one step of scenarios/judge/sparse_attn_mma_bound.h (16 products
// and the accumulator), probed on the device by tests/cuda/sparse_attn_production_test.cc
// (bf16_wgmma_probe, this file's layout and descriptors).
#include <cmath>
#include <cstdint>

#include "cuda/attention_split.cuh"
#include "cuda/attention_split.h"
#include "cuda/bf16_storage.cuh"  // sm_count
#include "cuda/common.cuh"
#include "cuda/fp8_async.cuh"
#include "cuda/kernels.h"
#include "cuda/tensor_core.cuh"

namespace dsv41::gpu {
namespace {

using fp8::cp_async16;
using fp8::cp_async_commit;
using fp8::cp_async_wait;
using fp8::smem_addr;
using namespace tc;  // wgmma fences and waits, pin, pair_sync, bf16 packing

constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kHeads = 64;
constexpr int kKeys = 64;
constexpr int kAtom = kHeads * 128;  // bytes of one [64 rows][128 B] atom column
constexpr float kInitMax = -1e30f;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Layout {
  static constexpr int kCols = D / 64;  // atom columns
  static constexpr int kTile = kCols * kAtom;
  static constexpr int kOffKV = kTile, kOffP = 3 * kTile, kOffStat = kOffP + kAtom;
  static constexpr int kBytes = kOffStat + 6 * 64 * 4;  // rmax[2][64], rl[2][64], sidx[2][64]
  static constexpr int kAlloc = kBytes + 1024;         // + alignment slack
};
static_assert(Layout<512>::kAlloc <= 232448, "shared memory of one CTA");

// Byte offset of 16-byte chunk ch (of D/8) of row r in a swizzled [rows][D] tile.
__device__ inline int sw_off(int r, int ch) { return (ch >> 3) * kAtom + r * 128 + (((ch & 7) ^ (r & 7)) << 4); }

__device__ inline uint64_t desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return ((addr >> 4) & 0x3FFFull) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// Generated wgmma wrappers (d += a b, bf16 in, fp32 accumulate; _tb: B MN-major).
__device__ inline void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b));
}
__device__ inline void wgmma_m64n64k16_tb(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 1, 1, 1, 0, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}
__device__ inline void wgmma_m64n128k16_tb(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}
__device__ inline void wgmma_m64n256k16_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b));
}

// A from registers (the m16n8k16 A fragment layout per warp), B MN-major.
__device__ inline void wgmma_m64n64k16_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ inline void wgmma_m64n128k16_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ inline void wgmma_m64n256k16_rs_tb(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <int N>
__device__ inline void wgmma_pv(float (&d)[N / 2], uint64_t a, uint64_t b) {
  if constexpr (N == 256) wgmma_m64n256k16_tb(d, a, b);
  else if constexpr (N == 128) wgmma_m64n128k16_tb(d, a, b);
  else wgmma_m64n64k16_tb(d, a, b);
}
template <int N>
__device__ inline void wgmma_pv(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (N == 256) wgmma_m64n256k16_rs_tb(d, a, b);
  else if constexpr (N == 128) wgmma_m64n128k16_rs_tb(d, a, b);
  else wgmma_m64n64k16_rs_tb(d, a, b);
}
// Keeps registers an in-flight wgmma reads (its A fragments) alive and unmoved until this point.
__device__ inline void hold(const uint32_t (&a)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" ::"r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
}

// kRegP: P . V takes P from registers (each warp's own fragments and its partner's, swapped through
// shared memory by ordinary stores: no async-proxy fence while the next block's copies are in
// flight); else from a shared K-major tile (fence.proxy.async after the P stores).
// kCoalesced: the gather of whole rows per warp (see the header); else the row-per-thread gather.
// kSplit: this CTA runs blocks blockIdx.z * slice_blocks .. of its row's index list only and writes
// its partial (running max, l, unnormalised O) to `part` (attn_split::SplitPart) instead of `out`.
template <int D, typename OutT, bool kRegP, bool kCoalesced, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attn_wgmma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                             const int32_t* __restrict__ idxs, const float* __restrict__ sink, int64_t H, int64_t K,
                             float c2, OutT* __restrict__ out, int64_t slice_blocks, float* __restrict__ part) {
  using L = Layout<D>;
  constexpr int DH = D / 2, kChunks = D / 8;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* const Qs = smem;
  uint8_t* const KVs = smem + L::kOffKV;
  uint8_t* const Ps = smem + L::kOffP;
  float* const rmax = reinterpret_cast<float*>(smem + L::kOffStat);  // [2][64]
  float* const rl = rmax + 2 * kHeads;                                // [2][64]
  int32_t* const sidx = reinterpret_cast<int32_t*>(rl + 2 * kHeads);   // [2][64]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, w = tid >> 5, hg = w & 3, dh = w >> 2;
  const int g = lane >> 2, c = lane & 3;
  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kHeads;
  const int32_t* const idx = idxs + t * K;
  if constexpr (kSplit) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the combine may launch
  // This CTA's blocks: b_lo .. b_lo + nblocks - 1 (all of them unless kSplit).
  const int64_t all_blocks = (K + kKeys - 1) / kKeys, b_lo = kSplit ? blockIdx.z * slice_blocks : 0;
  const int64_t nblocks = !kSplit ? all_blocks : all_blocks - b_lo < slice_blocks ? all_blocks - b_lo : slice_blocks;

  for (int i = tid; i < kHeads * kChunks; i += kThreads) {  // the Q tile (zero rows past H)
    const int r = i / kChunks, ch = i % kChunks;
    const bool ok = h0 + r < H;
    cp_async16(Qs + sw_off(r, ch), ok ? q + ((t * H + h0 + r) * D + ch * 8) : q, ok ? 16 : 0);
  }
  // KV loads. kRowGather: thread tid copies row r = tid % 64 of a block, 32-byte pieces
  // 2 (tid / 64) + 8 i of its chunks. kCoalesced: warp w copies rows 8 w + j (j = 0..7), lane l
  // chunks l, l + 32 (D = 512; fewer chunks: a row per kLanesPerRow lanes), row 8 w + j's index held
  // by lane j. Either way a thread's index for the next block is loaded one block ahead (never
  // waited on) and the tile's index row sidx written by its holder.
  constexpr int kRowsPerWarp = kKeys / (kThreads / 32);           // 8
  constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32;      // lanes sharing one row's copy
  constexpr int kRowsPerStep = 32 / kLanesPerRow;                 // rows per warp instruction
  constexpr int kChunksPerLane = kChunks / kLanesPerRow;          // 16-byte chunks of a row per lane
  static_assert(kRowsPerWarp % kRowsPerStep == 0 && kChunks % kLanesPerRow == 0, "the coalesced gather's split");
  const int lr = kCoalesced ? w * kRowsPerWarp + (lane & (kRowsPerWarp - 1)) : tid & 63;
  const auto row_index = [&](int64_t b) -> int32_t {
    const int64_t j = (b_lo + b) * kKeys + lr;  // b: the block within this CTA's slice
    return b < nblocks && j < K ? __ldg(idx + j) : -1;
  };
  const auto load_kv = [&](int stage, int32_t ix) {
    uint8_t* const dst = KVs + stage * L::kTile;
    if constexpr (kCoalesced) {
      const int sub = lane / kLanesPerRow, cl = lane % kLanesPerRow;  // the row of a step, the lane in it
#pragma unroll
      for (int step = 0; step < kRowsPerWarp / kRowsPerStep; ++step) {
        const int j = step * kRowsPerStep + sub, r = w * kRowsPerWarp + j;
        const int32_t rix = __shfl_sync(0xffffffffu, ix, j);
        const uint16_t* const src = rix >= 0 ? kv + static_cast<int64_t>(rix) * D : kv;
#pragma unroll
        for (int i = 0; i < kChunksPerLane; ++i) {
          const int ch = cl + i * kLanesPerRow;
          cp_async16(dst + sw_off(r, ch), src + ch * 8, rix >= 0 ? 16 : 0);
        }
      }
      if (lane < kRowsPerWarp) sidx[stage * kKeys + lr] = ix;
    } else {
      const int lpart = tid >> 6;
      const uint16_t* const src = ix >= 0 ? kv + static_cast<int64_t>(ix) * D : kv;
#pragma unroll
      for (int i = 0; i < kChunks / 8; ++i) {
        const int ch = 8 * i + 2 * lpart;
        cp_async16(dst + sw_off(lr, ch), src + ch * 8, ix >= 0 ? 16 : 0);
        cp_async16(dst + sw_off(lr, ch + 1), src + ch * 8 + 8, ix >= 0 ? 16 : 0);
      }
      if (lpart == 0) sidx[stage * kKeys + lr] = ix;
    }
    cp_async_commit();
  };
  if (nblocks > 0) load_kv(0, row_index(0));
  cp_async_commit();
  int32_t next_ix = row_index(1);  // block 1's row of this thread

  float o[DH / 2];
#pragma unroll
  for (int n = 0; n < DH / 2; ++n) o[n] = 0.0f;
  float m_run[2] = {kInitMax, kInitMax};
  float l_run[2] = {0.0f, 0.0f};
  const unsigned qs = smem_addr(Qs), kvs0 = smem_addr(KVs), ps = smem_addr(Ps);
  const int prow0 = hg * 16 + g;
  uint32_t pa[4][4] = {};  // kRegP: the A fragments of P, k-steps 0..3 (16 indices each)
  uint32_t* const px = reinterpret_cast<uint32_t*>(Ps);  // kRegP: [8 warps][8][32 lanes] swap slots

  for (int64_t b = 0; b < nblocks; ++b) {
    const int st = static_cast<int>(b & 1);
    cp_async_wait<0>();
    wgmma_wait0();        // the previous block's P . V (it overlapped this wait)
    pin(o);
    if constexpr (kRegP) hold(pa);
    fence_proxy_async();  // this thread's cp.async bytes -> visible to the tensor cores
    __syncthreads();      // stage st landed; stage st ^ 1, P and the statistics are free
    const unsigned kvs = kvs0 + static_cast<unsigned>(st * L::kTile);

    // S: 64 heads x this warpgroup's 32 indices, D/16 steps in channel order
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned col = static_cast<unsigned>((ks >> 2) * kAtom + (ks & 3) * 32);
      wgmma_m64n32k16(s, desc(qs + col, 16, 1024), desc(kvs + col + static_cast<unsigned>(dh * 32 * 128), 16, 1024));
    }
    wgmma_commit();
    // while S runs: the next block's rows into the other stage, and the index one block further
    if (b + 1 < nblocks) load_kv(st ^ 1, next_ix);
    next_ix = row_index(b + 2);
    wgmma_wait0();
    pin(s);
    float x[4][4];
    const int* const sid = sidx + st * kKeys + dh * 32;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[i][e] = sid[i * 8 + 2 * c + (e & 1)] < 0 ? -INFINITY : __fmul_rn(s[4 * i + e], c2);
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mx[0] = fmaxf(mx[0], fmaxf(x[i][0], x[i][1]));
      mx[1] = fmaxf(mx[1], fmaxf(x[i][2], x[i][3]));
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
    }
    if (c == 0) {
      rmax[dh * kHeads + prow0] = mx[0];
      rmax[dh * kHeads + prow0 + 8] = mx[1];
    }
    pair_sync(hg);
    float r[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float m_new = fmaxf(m_run[k], fmaxf(mx[k], rmax[(dh ^ 1) * kHeads + prow0 + 8 * k]));
      r[k] = exp2f(__fsub_rn(m_run[k], m_new));
      m_run[k] = m_new;
    }
    float psum[2] = {0.0f, 0.0f};
    uint32_t own[8];  // kRegP: this thread's P fragments: k-steps 2 dh, 2 dh + 1 of the A layout
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = exp2f(__fsub_rn(x[i][e], m_run[e >> 1]));
        psum[e >> 1] = __fadd_rn(psum[e >> 1], p[e]);
      }
      if constexpr (kRegP) {
        own[2 * i] = pack_bf16x2(p[0], p[1]);      // row g: a0a1 (even n8 block) or a4a5 (odd)
        own[2 * i + 1] = pack_bf16x2(p[2], p[3]);  // row g + 8: a2a3 or a6a7
      } else {
        const int key = dh * 32 + i * 8 + 2 * c, chunk = key >> 3, within = (key & 7) * 2;
        *reinterpret_cast<uint32_t*>(Ps + prow0 * 128 + ((chunk ^ (prow0 & 7)) << 4) + within) = pack_bf16x2(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(Ps + (prow0 + 8) * 128 + ((chunk ^ ((prow0 + 8) & 7)) << 4) + within) =
            pack_bf16x2(p[2], p[3]);
      }
    }
    l_run[0] = __fmaf_rn(l_run[0], r[0], psum[0]);
    l_run[1] = __fmaf_rn(l_run[1], r[1], psum[1]);
    if constexpr (kRegP) {
#pragma unroll
      for (int k = 0; k < 8; ++k) px[(w * 8 + k) * 32 + lane] = own[k];
      pair_sync(hg);
      uint32_t other[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) other[k] = px[((w ^ 4) * 8 + k) * 32 + lane];
      // k-step j (indices 16 j ..) belongs to warpgroup j / 2; its n8 blocks 2 (j % 2), 2 (j % 2) + 1
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int lo = 4 * (j & 1);
        const bool mine = (j >> 1) == dh;
        pa[j][0] = mine ? own[lo] : other[lo];          // row g, indices 2c, 2c + 1
        pa[j][1] = mine ? own[lo + 1] : other[lo + 1];  // row g + 8
        pa[j][2] = mine ? own[lo + 2] : other[lo + 2];  // row g, indices 8 + 2c, 8 + 2c + 1
        pa[j][3] = mine ? own[lo + 3] : other[lo + 3];  // row g + 8
      }
    } else {
      fence_proxy_async();  // the P stores -> visible to the tensor cores
    }
    if (__any_sync(0xffffffffu, r[0] != 1.0f || r[1] != 1.0f)) {  // (a factor 1 changes no value)
#pragma unroll
      for (int n = 0; n < DH / 8; ++n) {
        o[4 * n] = __fmul_rn(o[4 * n], r[0]);
        o[4 * n + 1] = __fmul_rn(o[4 * n + 1], r[0]);
        o[4 * n + 2] = __fmul_rn(o[4 * n + 2], r[1]);
        o[4 * n + 3] = __fmul_rn(o[4 * n + 3], r[1]);
      }
    }
    if constexpr (!kRegP) __syncthreads();  // all of P written
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint64_t vb = desc(kvs + static_cast<unsigned>(dh * (DH / 64) * kAtom + kk * 2048), kAtom, 1024);
      if constexpr (kRegP) wgmma_pv<DH>(o, pa[kk], vb);
      else wgmma_pv<DH>(o, desc(ps + static_cast<unsigned>(kk * 32), 16, 1024), vb);
    }
    wgmma_commit();  // waited at the next block's top (or below)
  }
  wgmma_wait0();
  pin(o);
  if constexpr (kRegP) hold(pa);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l_run[k] = __fadd_rn(l_run[k], __shfl_xor_sync(0xffffffffu, l_run[k], 1));
    l_run[k] = __fadd_rn(l_run[k], __shfl_xor_sync(0xffffffffu, l_run[k], 2));
  }
  if (c == 0) {
    rl[dh * kHeads + prow0] = l_run[0];
    rl[dh * kHeads + prow0 + 8] = l_run[1];
  }
  pair_sync(hg);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = prow0 + 8 * k;
    const int64_t h = h0 + row;
    if (h >= H) continue;
    const float other = rl[(dh ^ 1) * kHeads + row];
    float l = dh == 0 ? __fadd_rn(l_run[k], other) : __fadd_rn(other, l_run[k]);
    if constexpr (kSplit) {  // the partial, unnormalised: attn_split::combine_kernel finishes it
      const attn_split::SplitPart pp{part, static_cast<int64_t>(gridDim.x), H, static_cast<int64_t>(gridDim.z), D};
      const int64_t s = blockIdx.z;
      if (dh == 0 && c == 0) {
        pp.m(t, h)[s] = m_run[k];
        pp.l(t, h)[s] = l;
      }
      float* const prow = pp.o(t, h, s) + dh * DH + 2 * c;
#pragma unroll
      for (int n = 0; n < DH / 8; ++n) {
        *reinterpret_cast<float2*>(prow + n * 8) = make_float2(o[4 * n + 2 * k], o[4 * n + 2 * k + 1]);
      }
      continue;
    }
    l = __fadd_rn(l, exp2f(__fsub_rn(__fmul_rn(sink[h], kLog2e), m_run[k])));
    const float inv = __frcp_rn(l);
    OutT* const orow = out + (t * H + h) * D + dh * DH + 2 * c;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      store2(orow + n * 8, bf16_value(__fmul_rn(o[4 * n + 2 * k], inv)), bf16_value(__fmul_rn(o[4 * n + 2 * k + 1], inv)));
    }
  }
}

template <int D, typename OutT, bool kRegP, bool kCoalesced>
void launch(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T, int64_t H,
            int64_t K, float scale, OutT* out, int64_t slice_blocks = 0, float* workspace = nullptr) {
  const int64_t hb = (H + kHeads - 1) / kHeads;
  DSV41_CHECK(T <= 0x7fffffff && hb <= 65535, "sparse_attn_wgmma: ", T, " queries x ", H, " heads exceed the grid");
  const float c2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634074);
  if (slice_blocks <= 0) {
    const auto kernel = sparse_attn_wgmma_kernel<D, OutT, kRegP, kCoalesced, false>;
    DSV41_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout<D>::kAlloc)));
    kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(hb)), kThreads, Layout<D>::kAlloc>>>(
        q, kv, idxs, sink, H, K, c2, out, 0, nullptr);
    DSV41_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if constexpr (kRegP && kCoalesced) {  // the split exists for the production default only
    const int64_t S = attn_split::slices(K, slice_blocks);
    DSV41_CHECK(S <= 65535 && T * H <= 0x7fffffff, "sparse_attn_wgmma split: ", S, " slices of ", T, " x ", H,
                " rows exceed the grid");
    DSV41_CHECK(workspace != nullptr, "sparse_attn_wgmma split: no workspace");
    const attn_split::SplitPart pp{workspace, T, H, S, D};
    const auto kernel = sparse_attn_wgmma_kernel<D, OutT, kRegP, kCoalesced, true>;
    DSV41_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout<D>::kAlloc)));
    kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(hb), static_cast<unsigned>(S)), kThreads,
             Layout<D>::kAlloc>>>(q, kv, idxs, sink, H, K, c2, out, slice_blocks, workspace);
    DSV41_CUDA_CHECK(cudaGetLastError());
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(T * H), 1, 1);
    cfg.blockDim = dim3(D / 4, 1, 1);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = attn_split::pdl() ? 1 : 0;
    DSV41_CUDA_CHECK(cudaLaunchKernelEx(&cfg, attn_split::combine_kernel<OutT>, pp, sink, out));
  } else {
    DSV41_CHECK(false, "sparse_attn_wgmma: the split runs the kCoalesced kernel only");
  }
}

template <typename OutT, bool kRegP, bool kCoalesced>
void dispatch_d(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T, int64_t H,
                int64_t D, int64_t K, float scale, OutT* out, int64_t slice_blocks = 0, float* workspace = nullptr) {
  if (D == 512) launch<512, OutT, kRegP, kCoalesced>(q, kv, idxs, sink, T, H, K, scale, out, slice_blocks, workspace);
  else if (D == 256) launch<256, OutT, kRegP, kCoalesced>(q, kv, idxs, sink, T, H, K, scale, out, slice_blocks, workspace);
  else launch<128, OutT, kRegP, kCoalesced>(q, kv, idxs, sink, T, H, K, scale, out, slice_blocks, workspace);
}

template <typename OutT>
void dispatch(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T, int64_t H,
              int64_t D, int64_t K, float scale, OutT* out, AttnWgmmaVariant variant) {
  DSV41_CHECK(sparse_attn_mma_supported(D), "sparse_attn_wgmma: head dim ", D, " not supported (128, 256, 512)");
  if (T * H == 0) return;
  switch (variant) {
    case AttnWgmmaVariant::kCoalesced: return dispatch_d<OutT, true, true>(q, kv, idxs, sink, T, H, D, K, scale, out);
    case AttnWgmmaVariant::kRowGather: return dispatch_d<OutT, true, false>(q, kv, idxs, sink, T, H, D, K, scale, out);
    case AttnWgmmaVariant::kSharedP: return dispatch_d<OutT, false, false>(q, kv, idxs, sink, T, H, D, K, scale, out);
  }
  DSV41_CHECK(false, "sparse_attn_wgmma: unknown variant ", static_cast<int>(variant));
}

template <typename OutT>
void dispatch_split(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                    int64_t H, int64_t D, int64_t K, float scale, OutT* out, int64_t slice_blocks, float* workspace) {
  DSV41_CHECK(sparse_attn_mma_supported(D), "sparse_attn_wgmma split: head dim ", D, " not supported (128, 256, 512)");
  DSV41_CHECK(slice_blocks >= 1, "sparse_attn_wgmma split: slice_blocks ", slice_blocks, " must be >= 1");
  if (T * H == 0) return;
  dispatch_d<OutT, true, true>(q, kv, idxs, sink, T, H, D, K, scale, out, slice_blocks, workspace);
}

__device__ inline unsigned pack16(uint16_t lo, uint16_t hi) {
  return static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
}

// One wgmma m64n32k16 bf16 with accumulator, in the kernel's layout and descriptors: a [64][16],
// b [32][16] (k contiguous), c, d [64][32].
__global__ void bf16_wgmma_probe_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  __shared__ __align__(1024) uint8_t sa[kAtom];
  __shared__ __align__(1024) uint8_t sb[kAtom];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, wi = tid >> 5, g = lane >> 2, q = lane & 3;
  for (int i = tid; i < 64 * 8; i += 128) {  // rows x 16-byte chunks; k 0..15 in chunks 0, 1
    const int r = i / 8, ch = i % 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    uint4 u = make_uint4(0, 0, 0, 0);
    if (ch < 2) {
      const uint16_t* pa = a + r * 16 + ch * 8;
      v = make_uint4(pack16(pa[0], pa[1]), pack16(pa[2], pa[3]), pack16(pa[4], pa[5]), pack16(pa[6], pa[7]));
      if (r < 32) {
        const uint16_t* pb = b + r * 16 + ch * 8;
        u = make_uint4(pack16(pb[0], pb[1]), pack16(pb[2], pb[3]), pack16(pb[4], pb[5]), pack16(pb[6], pb[7]));
      }
    }
    *reinterpret_cast<uint4*>(sa + sw_off(r, ch)) = v;
    *reinterpret_cast<uint4*>(sb + sw_off(r, ch)) = u;
  }
  fence_proxy_async();
  __syncthreads();
  float acc[16];
  const int r0 = wi * 16 + g;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[4 * j] = c[r0 * 32 + 8 * j + 2 * q];
    acc[4 * j + 1] = c[r0 * 32 + 8 * j + 2 * q + 1];
    acc[4 * j + 2] = c[(r0 + 8) * 32 + 8 * j + 2 * q];
    acc[4 * j + 3] = c[(r0 + 8) * 32 + 8 * j + 2 * q + 1];
  }
  wgmma_fence();
  wgmma_m64n32k16(acc, desc(smem_addr(sa), 16, 1024), desc(smem_addr(sb), 16, 1024));
  wgmma_commit();
  wgmma_wait0();
  pin(acc);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    d[r0 * 32 + 8 * j + 2 * q] = acc[4 * j];
    d[r0 * 32 + 8 * j + 2 * q + 1] = acc[4 * j + 1];
    d[(r0 + 8) * 32 + 8 * j + 2 * q] = acc[4 * j + 2];
    d[(r0 + 8) * 32 + 8 * j + 2 * q + 1] = acc[4 * j + 3];
  }
}

}  // namespace

void sparse_attn_wgmma(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                       int64_t H, int64_t D, int64_t K, float scale, float* out, AttnWgmmaVariant variant) {
  dispatch<float>(q, kv, idxs, sink, T, H, D, K, scale, out, variant);
}
void sparse_attn_wgmma_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                            int64_t H, int64_t D, int64_t K, float scale, uint16_t* out, AttnWgmmaVariant variant) {
  dispatch<uint16_t>(q, kv, idxs, sink, T, H, D, K, scale, out, variant);
}
int64_t sparse_attn_wgmma_split_pick(int64_t T, int64_t H, int64_t K) {
  const int64_t ctas = T * ((H + kHeads - 1) / kHeads), blocks = (K + kKeys - 1) / kKeys;
  const int64_t sms = sm_count();
  if (ctas <= 0 || blocks <= 1 || 2 * ctas > sms) return 0;  // half the SMs busy already: no split
  const int64_t want = sms / ctas;                            // slices: at most one wave of CTAs
  const int64_t per = (blocks + want - 1) / want;
  return per >= blocks ? 0 : per;
}
int64_t sparse_attn_wgmma_split_workspace_bytes(int64_t T, int64_t H, int64_t D, int64_t K, int64_t slice_blocks) {
  if (slice_blocks <= 0) return 0;
  const attn_split::SplitPart pp{nullptr, T, H, attn_split::slices(K, slice_blocks), D};
  return pp.floats() * static_cast<int64_t>(sizeof(float));
}
void sparse_attn_wgmma_split(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink, int64_t T,
                             int64_t H, int64_t D, int64_t K, float scale, float* out, int64_t slice_blocks,
                             float* workspace) {
  dispatch_split<float>(q, kv, idxs, sink, T, H, D, K, scale, out, slice_blocks, workspace);
}
void sparse_attn_wgmma_split_bf16(const uint16_t* q, const uint16_t* kv, const int32_t* idxs, const float* sink,
                                  int64_t T, int64_t H, int64_t D, int64_t K, float scale, uint16_t* out,
                                  int64_t slice_blocks, float* workspace) {
  dispatch_split<uint16_t>(q, kv, idxs, sink, T, H, D, K, scale, out, slice_blocks, workspace);
}
void bf16_wgmma_probe(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  bf16_wgmma_probe_kernel<<<1, 128>>>(a, b, c, d);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
