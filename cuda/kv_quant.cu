// cuda/kv_quant.cu
//
// Kernels and launchers of cuda/device.h: the scalar encoder sweeps, the CUDA-intrinsic oracle
// sweeps, the block-recipe pack/unpack kernels of the cache formats, and the device/memory
// helpers. Every kernel calls the formats/ functions the host calls; nothing here re-implements
// a rounding rule (the oracle sweeps, which call CUDA's conversions, are the one exception, and
// are only compared against).
//
// pack_rows of kWindowKvFp8 and kCompressedKvFp4 runs cuda/kv_pack.cu's warp-per-row kernels
// (bandwidth-bound, bit-exact; the file says why); the recipes below pack the other formats.
//
// Thread mapping of the block recipes: one thread quantizes one block of a row (16 or 32
// values, 8 for bf16). A row's blocks go to a group of G lanes of one warp (G = the block count
// rounded up to a power of two, at most 32), so the row's finite flag is one __ballot_sync.

#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/env_switch.h"
#include "cuda/common.cuh"
#include "cuda/kv_pack.h"
#include "cuda/device.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------------------------
// Scalar encoders: formats/ functions and CUDA's conversions, one functor each.

struct FmtE2M1 {
  using Code = uint8_t;
  __device__ static Code encode(float x) { return formats::e2m1_encode(x); }
};
struct FmtE4M3Satfinite {
  using Code = uint8_t;
  __device__ static Code encode(float x) { return formats::e4m3_encode_satfinite(x); }
};
struct FmtE4M3NoSat {
  using Code = uint8_t;
  __device__ static Code encode(float x) {
    return static_cast<Code>(
        formats::E4M3::encode<formats::Round::kNearestEven, formats::Overflow::kSpecial>(x));
  }
};
struct FmtE8M0Ceil {
  using Code = uint8_t;
  __device__ static Code encode(float x) { return formats::e8m0_encode_ceil(x); }
};
struct FmtE8M0CeilOfficial {
  using Code = uint8_t;
  __device__ static Code encode(float x) { return formats::e8m0_ceil_official(x); }
};
struct FmtBf16 {
  using Code = uint16_t;
  __device__ static Code encode(float x) { return formats::bf16_encode(x); }
};

struct CudaE2M1 {
  using Code = uint8_t;
  __device__ static Code encode(float x) {
    return static_cast<Code>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest));
  }
};
struct CudaE4M3Satfinite {
  using Code = uint8_t;
  __device__ static Code encode(float x) {
    return static_cast<Code>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
};
struct CudaE4M3NoSat {
  using Code = uint8_t;
  __device__ static Code encode(float x) {
    return static_cast<Code>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3));
  }
};
struct CudaE8M0Ceil {
  using Code = uint8_t;
  __device__ static Code encode(float x) {
    return static_cast<Code>(__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf));
  }
};
struct CudaBf16 {
  using Code = uint16_t;
  __device__ static Code encode(float x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    uint16_t c;
    std::memcpy(&c, &h, sizeof c);
    return c;
  }
};

// out[i] = Enc(bits begin + i), four inputs per thread and step.
template <class Enc>
__global__ void __launch_bounds__(kThreads)
    sweep_kernel(uint64_t begin, uint64_t count, typename Enc::Code* __restrict__ out) {
  using Code = typename Enc::Code;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x * 4u;
  for (uint64_t i = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 4u; i < count;
       i += stride) {
    if (i + 4 <= count) {
      Code c[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        c[k] = Enc::encode(f32_from_bits(static_cast<uint32_t>(begin + i + k)));
      if constexpr (sizeof(Code) == 1) {
        *reinterpret_cast<uchar4*>(out + i) = make_uchar4(c[0], c[1], c[2], c[3]);
      } else {
        *reinterpret_cast<ushort4*>(out + i) = make_ushort4(c[0], c[1], c[2], c[3]);
      }
    } else {
      for (uint64_t j = i; j < count; ++j)
        out[j] = Enc::encode(f32_from_bits(static_cast<uint32_t>(begin + j)));
    }
  }
}

template <class Enc>
void launch_sweep(uint64_t begin, uint64_t count, void* out, void* stream) {
  DSV41_CHECK(begin + count <= (uint64_t{1} << 32), "sweep past 2^32: begin=", begin,
              " count=", count);
  DSV41_CHECK(out != nullptr || count == 0, "sweep output is null");
  DSV41_CHECK(reinterpret_cast<uintptr_t>(out) % (4 * sizeof(typename Enc::Code)) == 0,
              "sweep output must be aligned to 4 codes");
  if (count == 0) return;
  const int64_t quads = static_cast<int64_t>((count + 3) / 4);
  const unsigned grid = grid_for(quads < (int64_t{1} << 24) ? quads : (int64_t{1} << 24), kThreads);
  sweep_kernel<Enc><<<grid, kThreads, 0, as_stream(stream)>>>(
      begin, count, static_cast<typename Enc::Code*>(out));
  DSV41_CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Block recipes. A recipe maps kBlock inputs to kValueBytes payload bytes plus, if kHasScale,
// one scale byte. Entry layout (formats/packed.h): [payloads of all blocks][scales of all blocks].

// The two FP4 recipes differ only in block size, block quantizer and element dequantizer.
template <int kBlockSize, bool (*kQuantize)(const float*, uint8_t*, uint8_t*),
          float (*kDequant)(uint8_t, uint8_t)>
struct Fp4Recipe {
  static constexpr int kBlock = kBlockSize;
  static constexpr int kValueBytes = kBlock / 2;
  static constexpr bool kHasScale = true;
  __device__ static bool pack(const float (&x)[kBlock], uint8_t (&values)[kValueBytes],
                              uint8_t* scale) {
    uint8_t codes[kBlock];
    const bool finite = kQuantize(x, scale, codes);
    formats::pack_nibbles(codes, kBlock, values);
    return finite;
  }
  __device__ static void unpack(const uint8_t (&values)[kValueBytes], uint8_t scale,
                                float (&out)[kBlock]) {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) out[i] = kDequant(formats::nibble_at(values, i), scale);
  }
};

using CompressedKvRecipe = Fp4Recipe<formats::kCompressedKvBlock, formats::quantize_compressed_kv_block,
                               formats::dequant_fp4_e4m3>;
using IndexKeysRecipe = Fp4Recipe<formats::kIndexBlock, formats::quantize_index_block,
                                 formats::dequant_fp4_e8m0>;

struct WindowKvRecipe {
  static constexpr int kBlock = formats::kFp8Block;
  static constexpr int kValueBytes = kBlock;
  static constexpr bool kHasScale = true;
  __device__ static bool pack(const float (&x)[kBlock], uint8_t (&values)[kValueBytes],
                              uint8_t* scale) {
    return formats::quantize_fp8_block(x, scale, values);
  }
  __device__ static void unpack(const uint8_t (&values)[kValueBytes], uint8_t scale,
                                float (&out)[kBlock]) {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) out[i] = formats::dequant_fp8_e8m0(values[i], scale);
  }
};

// bf16 has no blocks; 8 values per thread keep the accesses 16 bytes wide.
struct Bf16Recipe {
  static constexpr int kBlock = 8;
  static constexpr int kValueBytes = 2 * kBlock;
  static constexpr bool kHasScale = false;
  __device__ static bool pack(const float (&x)[kBlock], uint8_t (&values)[kValueBytes],
                              uint8_t* /*scale*/) {
    return formats::pack_bf16(x, kBlock, values);
  }
  __device__ static void unpack(const uint8_t (&values)[kValueBytes], uint8_t /*scale*/,
                                float (&out)[kBlock]) {
    formats::unpack_bf16(values, kBlock, out);
  }
};

template <class R>
__host__ __device__ constexpr int64_t entry_bytes_of(int nblocks) {
  return int64_t{nblocks} * (R::kValueBytes + (R::kHasScale ? 1 : 0));
}

// x: [rows, dim] fp32 -> out: [rows, entry] bytes, finite: [rows]. A group of 2^group_log2
// lanes owns one row; lane `sub` of the group packs blocks sub, sub + G, ...
template <class R>
__global__ void __launch_bounds__(kThreads)
    pack_kernel(const float* __restrict__ x, int64_t rows, int dim, int group_log2,
                uint8_t* __restrict__ out, uint8_t* __restrict__ finite) {
  const int nblocks = dim / R::kBlock;
  const int group = 1 << group_log2;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int sub = lane & (group - 1);
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const int64_t row = (warp << (5 - group_log2)) + (lane >> group_log2);
  const int64_t entry = entry_bytes_of<R>(nblocks);
  bool ok = true;
  if (row < rows) {
    const float* xr = x + row * dim;
    uint8_t* er = out + row * entry;
    for (int b = sub; b < nblocks; b += group) {
      float v[R::kBlock];
      load_f32(xr + b * R::kBlock, v);
      uint8_t values[R::kValueBytes];
      uint8_t scale = 0;
      ok &= R::pack(v, values, &scale);
      store_bytes(er + b * R::kValueBytes, values);
      if constexpr (R::kHasScale) er[nblocks * R::kValueBytes + b] = scale;
    }
  }
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, ok);
  if (row < rows && sub == 0) {
    const unsigned mask = (group == 32 ? 0xFFFFFFFFu : ((1u << group) - 1u)) << lane;
    finite[row] = (ballot & mask) == mask ? 1 : 0;
  }
}

// in: [rows, entry] bytes -> out: [rows, dim] fp32; one thread per (row, block).
template <class R>
__global__ void __launch_bounds__(kThreads)
    unpack_kernel(const uint8_t* __restrict__ in, int64_t rows, int dim, float* __restrict__ out) {
  const int nblocks = dim / R::kBlock;
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= rows * nblocks) return;
  const int64_t row = t / nblocks;
  const int b = static_cast<int>(t - row * nblocks);
  const uint8_t* er = in + row * entry_bytes_of<R>(nblocks);
  uint8_t values[R::kValueBytes];
  load_bytes(er + b * R::kValueBytes, values);
  const uint8_t scale = R::kHasScale ? er[nblocks * R::kValueBytes + b] : 0;
  float v[R::kBlock];
  R::unpack(values, scale, v);
  store_f32(out + row * dim + b * R::kBlock, v);
}

template <class R>
void check_shape(formats::CacheFormat f, int64_t rows, int dim) {
  DSV41_CHECK(rows >= 0, "rows must be >= 0, got ", rows);
  const int bytes = formats::entry_bytes(f, dim);  // throws for a dim the format rejects
  DSV41_CHECK(dim % R::kBlock == 0, "gpu: format ", formats::info(f).name, " needs dim % ",
              R::kBlock, " == 0 on the GPU, got dim=", dim);
  DSV41_CHECK(bytes == entry_bytes_of<R>(dim / R::kBlock), "gpu: entry size ",
              entry_bytes_of<R>(dim / R::kBlock), " != formats::entry_bytes ", bytes);
}

template <class R>
void launch_pack(formats::CacheFormat f, const float* x, int64_t rows, int dim, uint8_t* out,
                 uint8_t* finite, void* stream) {
  check_shape<R>(f, rows, dim);
  DSV41_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "gpu::pack_rows: x must be 16-byte aligned");
  if (rows == 0) return;
  const int nblocks = dim / R::kBlock;
  int group_log2 = 0;
  while ((1 << group_log2) < nblocks && group_log2 < 5) ++group_log2;
  const int64_t warps = (rows + (int64_t{1} << (5 - group_log2)) - 1) >> (5 - group_log2);
  pack_kernel<R><<<grid_for(warps * 32, kThreads), kThreads, 0, as_stream(stream)>>>(
      x, rows, dim, group_log2, out, finite);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

template <class R>
void launch_unpack(formats::CacheFormat f, const uint8_t* in, int64_t rows, int dim, float* out,
                   void* stream) {
  check_shape<R>(f, rows, dim);
  DSV41_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0,
              "gpu::unpack_rows: out must be 16-byte aligned");
  if (rows == 0) return;
  const int64_t threads = rows * (dim / R::kBlock);
  unpack_kernel<R>
      <<<grid_for(threads, kThreads), kThreads, 0, as_stream(stream)>>>(in, rows, dim, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Devices and memory.

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  DSV41_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return buf;
}

namespace {
// device_alloc's bookkeeping: the size of every live block, what they hold and the high-water mark.
struct AllocBook {
  std::mutex mu;
  std::unordered_map<void*, std::size_t> sizes;
  std::size_t held = 0, peak = 0;
};
AllocBook& alloc_book() {
  static AllocBook* b = new AllocBook();  // never destroyed: frees may come from static destructors
  return *b;
}
}  // namespace

// Allocations come from the device's default memory pool, stream-ordered
// on the legacy default stream that every kernel here runs on (cudaMallocAsync / cudaFreeAsync): a
// free does not synchronize the device and the pool keeps what was freed for the next allocation
// (release threshold: never), where cudaMalloc / cudaFree cost tens of microseconds and a device
// synchronization each (a decode step makes thousands; bench/RESULTS.md, sessions 18 and 19).
// DSV41_CUDA_ALLOC_POOL=0 takes cudaMalloc / cudaFree instead (docs/cuda.md "Switches"); read once.
namespace {
bool alloc_pool() {
  static const bool on = [] {
    if (!env_switch("DSV41_CUDA_ALLOC_POOL", true)) return false;
    int dev = 0;
    cudaMemPool_t pool = nullptr;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t never = ~uint64_t{0};
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never);
    }
    (void)cudaGetLastError();
    return true;
  }();
  return on;
}
}  // namespace

void* device_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (alloc_pool()) {
    DSV41_CUDA_CHECK(cudaMallocAsync(&p, bytes, 0));
  } else {
    DSV41_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  AllocBook& b = alloc_book();
  const std::lock_guard<std::mutex> lock(b.mu);
  b.sizes[p] = bytes;
  b.held += bytes;
  b.peak = std::max(b.peak, b.held);
  return p;
}

void device_free(void* p) noexcept {
  if (p == nullptr) return;
  {
    AllocBook& b = alloc_book();
    const std::lock_guard<std::mutex> lock(b.mu);
    const auto it = b.sizes.find(p);
    if (it != b.sizes.end()) {
      b.held -= it->second;
      b.sizes.erase(it);
    }
  }
  if (!alloc_pool()) note_host_sync(HostSync::kDevice);  // cudaFree waits for the device
  const cudaError_t e = alloc_pool() ? cudaFreeAsync(p, 0) : cudaFree(p);
  if (e != cudaSuccess) std::fprintf(stderr, "dsv41: cudaFree failed: %s\n", cudaGetErrorString(e));
}

DeviceMemoryStats device_memory_stats() {
  DeviceMemoryStats s;
  {
    AllocBook& b = alloc_book();
    const std::lock_guard<std::mutex> lock(b.mu);
    s.alloc_bytes = b.held;
    s.peak_alloc_bytes = b.peak;
  }
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    s.in_use_bytes = total_bytes - free_bytes;
  } else {
    (void)cudaGetLastError();
  }
  return s;
}

void reset_device_alloc_peak() {
  AllocBook& b = alloc_book();
  const std::lock_guard<std::mutex> lock(b.mu);
  b.peak = b.held;
}

void* pinned_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  DSV41_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void pinned_free(void* p) noexcept {
  if (p == nullptr) return;
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess)
    std::fprintf(stderr, "dsv41: cudaFreeHost failed: %s\n", cudaGetErrorString(e));
}

// ---------------------------------------------------------------------------------------------
// Launchers.

const char* encoder_name(Encoder e) {
  switch (e) {
    case Encoder::kE2M1:
      return "E2M1";
    case Encoder::kE4M3Satfinite:
      return "E4M3Satfinite";
    case Encoder::kE4M3NoSat:
      return "E4M3NoSat";
    case Encoder::kE8M0Ceil:
      return "E8M0Ceil";
    case Encoder::kE8M0CeilOfficial:
      return "E8M0CeilOfficial";
    case Encoder::kBf16:
      return "Bf16";
  }
  return "unknown";
}

int encoder_code_bytes(Encoder e) { return e == Encoder::kBf16 ? 2 : 1; }

void sweep_encoder(Encoder e, uint64_t begin, uint64_t count, void* out, void* stream) {
  switch (e) {
    case Encoder::kE2M1:
      return launch_sweep<FmtE2M1>(begin, count, out, stream);
    case Encoder::kE4M3Satfinite:
      return launch_sweep<FmtE4M3Satfinite>(begin, count, out, stream);
    case Encoder::kE4M3NoSat:
      return launch_sweep<FmtE4M3NoSat>(begin, count, out, stream);
    case Encoder::kE8M0Ceil:
      return launch_sweep<FmtE8M0Ceil>(begin, count, out, stream);
    case Encoder::kE8M0CeilOfficial:
      return launch_sweep<FmtE8M0CeilOfficial>(begin, count, out, stream);
    case Encoder::kBf16:
      return launch_sweep<FmtBf16>(begin, count, out, stream);
  }
  DSV41_FAIL("sweep_encoder: unknown encoder ", static_cast<int>(e));
}

void sweep_cuda_intrinsic(Encoder e, uint64_t begin, uint64_t count, void* out, void* stream) {
  switch (e) {
    case Encoder::kE2M1:
      return launch_sweep<CudaE2M1>(begin, count, out, stream);
    case Encoder::kE4M3Satfinite:
      return launch_sweep<CudaE4M3Satfinite>(begin, count, out, stream);
    case Encoder::kE4M3NoSat:
      return launch_sweep<CudaE4M3NoSat>(begin, count, out, stream);
    case Encoder::kE8M0Ceil:
    case Encoder::kE8M0CeilOfficial:
      return launch_sweep<CudaE8M0Ceil>(begin, count, out, stream);
    case Encoder::kBf16:
      return launch_sweep<CudaBf16>(begin, count, out, stream);
  }
  DSV41_FAIL("sweep_cuda_intrinsic: unknown encoder ", static_cast<int>(e));
}

void pack_rows(formats::CacheFormat f, const float* x, int64_t rows, int dim, uint8_t* out,
               uint8_t* finite, void* stream) {
  using formats::CacheFormat;
  // The two KV formats go to the warp-per-row kernels of cuda/kv_pack.cu (same bytes, the same
  // shape checks first); the index keys and bf16 keep the block-recipe kernel below.
  if (f == CacheFormat::kWindowKvFp8 || f == CacheFormat::kCompressedKvFp4) {
    if (f == CacheFormat::kWindowKvFp8) check_shape<WindowKvRecipe>(f, rows, dim);
    else check_shape<CompressedKvRecipe>(f, rows, dim);
    if (pack_rows_fast(f, x, rows, dim, out, finite, stream)) return;
  }
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
      return launch_pack<CompressedKvRecipe>(f, x, rows, dim, out, finite, stream);
    case CacheFormat::kIndexKeysFp4:
      return launch_pack<IndexKeysRecipe>(f, x, rows, dim, out, finite, stream);
    case CacheFormat::kWindowKvFp8:
      return launch_pack<WindowKvRecipe>(f, x, rows, dim, out, finite, stream);
    case CacheFormat::kBf16:
      return launch_pack<Bf16Recipe>(f, x, rows, dim, out, finite, stream);
  }
  DSV41_FAIL("gpu::pack_rows: unknown format ", static_cast<int>(f));
}

void unpack_rows(formats::CacheFormat f, const uint8_t* in, int64_t rows, int dim, float* out,
                 void* stream) {
  using formats::CacheFormat;
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
      return launch_unpack<CompressedKvRecipe>(f, in, rows, dim, out, stream);
    case CacheFormat::kIndexKeysFp4:
      return launch_unpack<IndexKeysRecipe>(f, in, rows, dim, out, stream);
    case CacheFormat::kWindowKvFp8:
      return launch_unpack<WindowKvRecipe>(f, in, rows, dim, out, stream);
    case CacheFormat::kBf16:
      return launch_unpack<Bf16Recipe>(f, in, rows, dim, out, stream);
  }
  DSV41_FAIL("gpu::unpack_rows: unknown format ", static_cast<int>(f));
}

}  // namespace dsv41::gpu
