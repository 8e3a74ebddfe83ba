// cuda/device.h
//
// The host-callable API of the CUDA path (library dsv41_cuda). Plain C++17 with no CUDA types,
// so tests, benches and scenarios include it without CUDA headers: device memory is a raw
// pointer, a stream is an opaque `void*` (nullptr = the default stream).
//
// Contents:
//   devices and memory   device_count, device_name, alloc/free/copy/fill, DeviceBuffer<T>
//   scalar encoder sweep for each of the named encoders of formats/minifloat.h and
//                        formats/qdq.h, the code of every fp32 bit pattern in [begin, begin+count)
//   CUDA oracle sweep    the same sweep through CUDA's own conversions (cuda_fp4.h, cuda_fp8.h,
//                        cuda_bf16.h), an independent implementation; research/numerics.md §5
//                        lists where CUDA's results differ on purpose (NaN payloads, E8M0 edges)
//   block recipes        pack_rows / unpack_rows on device tensors, for every formats::CacheFormat;
//                        pack_rows_bf16 on bf16 storage (FP8 window and FP4 main KV)
//
// Contract: every kernel calls the same formats/ functions the host calls (DSV41_HD), built
// with --fmad=false, so each result is bit-identical to the host's; tests/cuda checks it.
// Launchers are asynchronous on `stream`; they throw dsv41::Error on bad arguments or a failed
// launch (DSV41_CUDA_CHECK), never for a device-side result.
//
// Example:
//   if (gpu::device_count() == 0) return;                  // no device: nothing to do
//   gpu::DeviceBuffer<float> x(rows * 512);  x.upload(host_x);
//   gpu::DeviceBuffer<uint8_t> packed(rows * 288), finite(rows);
//   gpu::pack_rows(formats::CacheFormat::kCompressedKvFp4, x.get(), rows, 512, packed.get(),
//                  finite.get());
//   std::vector<uint8_t> bytes = packed.download();       // synchronizes
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "base/error.h"

namespace dsv41::gpu {

// ---- devices and memory ----

// Number of CUDA devices; 0 when there is none or no driver (never throws for that).
int device_count();
// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" style description of `device`.
std::string device_name(int device = 0);

void* device_alloc(std::size_t bytes);  // the default pool, stream-ordered (cudaMallocAsync); nullptr for 0 bytes
void device_free(void* p) noexcept;     // logs to stderr instead of throwing
// What device_alloc holds (a high-water mark since the last reset) and what the driver says is
// in use on the current device (cudaMemGetInfo: also counts scratch outside device_alloc, the
// stream-ordered pools and the context). Process-wide; thread-safe.
struct DeviceMemoryStats {
  std::size_t alloc_bytes = 0, peak_alloc_bytes = 0, in_use_bytes = 0;
};
DeviceMemoryStats device_memory_stats();
void reset_device_alloc_peak();         // the high-water mark restarts at what is held now
void* pinned_alloc(std::size_t bytes);  // page-locked host memory
void pinned_free(void* p) noexcept;
// Host to device. An upload of at most kStagedUploadMaxBytes is staged with DSV41_CUDA_ASYNC_UPLOADS=1
// (off by default until a device run settles it; cuda/upload_staging.cu): `src` is copied into a pinned ring right away (so the
// caller may change or free it on return) and the copy to `dst` is queued on the legacy default
// stream, after every kernel queued before it; no host wait unless the ring wraps onto a region
// whose copy is still in flight (counted as a device sync). `dst` must stay allocated until the
// copy ran: device_free is stream-ordered (or synchronizes with DSV41_CUDA_ALLOC_POOL=0).
// Larger uploads, or any without DSV41_CUDA_ASYNC_UPLOADS=1: a cudaMemcpy from pageable memory, which
// waits for the device first (counted as h2d).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
inline constexpr std::size_t kStagedUploadMaxBytes = std::size_t{1} << 20;
bool async_uploads();  // DSV41_CUDA_ASYNC_UPLOADS == "1" (read once)
// What the staging ring did since the process started (process-wide): uploads staged, their bytes,
// and the host waits for a region still in flight (each also counted as a HostSync::kDevice).
struct UploadStagingStats {
  int64_t staged = 0, staged_bytes = 0, waits = 0;
};
UploadStagingStats upload_staging_stats();
// The synchronous helpers (each counted below, cuda/host_sync.cu):
void copy_to_host(void* dst, const void* src, std::size_t bytes);    // waits for the copy
void fill_device(void* dst, uint8_t byte, std::size_t bytes);        // waits for the device after
void synchronize();                                                  // whole device
// Asynchronous on the default stream (no host wait, not counted): dst of copy_to_host_async must be
// pinned (pinned_alloc) and is valid once a later synchronization has passed.
void fill_device_async(void* dst, uint8_t byte, std::size_t bytes);
void copy_to_host_async(void* dst, const void* src, std::size_t bytes);
// For tests and benches: one thread that keeps the default stream busy for about `ns` nanoseconds
// (the device's global timer), so that what is queued after it is still in flight.
void spin_device(uint64_t ns);

// ---- host synchronizations ----
// Every helper of this library that makes the host wait for the device counts itself here
// (process-wide relaxed atomics: cheap, always on; docs/cuda.md "Host synchronizations of a decode
// step"): d2h = a device-to-host cudaMemcpy (waits for the stream and the copy); h2d = a
// host-to-device cudaMemcpy from pageable memory (the runtime waits for the stream before the
// copy); device = cudaDeviceSynchronize, cudaEventSynchronize, or cudaFree (DSV41_CUDA_ALLOC_POOL=0).
enum class HostSync : uint8_t { kD2H, kH2D, kDevice };
void note_host_sync(HostSync kind);
struct HostSyncCounts {
  int64_t d2h = 0, h2d = 0, device = 0;
  int64_t total() const { return d2h + h2d + device; }
};
HostSyncCounts host_sync_counts();
int64_t host_sync_count();  // host_sync_counts().total()

// Owns `n` elements of device memory.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n), p_(static_cast<T*>(device_alloc(n * sizeof(T)))) {}
  ~DeviceBuffer() { device_free(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  void upload(const std::vector<T>& v) {
    DSV41_CHECK(v.size() == n_, "upload of ", v.size(), " elements into a buffer of ", n_);
    copy_to_device(p_, v.data(), bytes());
  }
  void poison(uint8_t byte = 0xA5) { fill_device(p_, byte, bytes()); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    copy_to_host(v.data(), p_, bytes());
    return v;
  }

 private:
  std::size_t n_;
  T* p_;
};

// ---- scalar encoders ----

enum class Encoder : uint8_t {
  kE2M1,              // formats::e2m1_encode                          (RNE, satfinite)
  kE4M3Satfinite,     // formats::e4m3_encode_satfinite                (RNE, satfinite)
  kE4M3NoSat,         // formats::E4M3::encode<kNearestEven, kSpecial> (overflow -> NaN)
  kE8M0Ceil,          // formats::e8m0_encode_ceil                     (ceil, satfinite)
  kE8M0CeilOfficial,  // formats::e8m0_ceil_official                   (the official bit formula)
  kBf16,              // formats::bf16_encode                          (RNE, overflow -> Inf)
};
inline constexpr Encoder kAllEncoders[] = {
    Encoder::kE2M1,     Encoder::kE4M3Satfinite,    Encoder::kE4M3NoSat,
    Encoder::kE8M0Ceil, Encoder::kE8M0CeilOfficial, Encoder::kBf16};

const char* encoder_name(Encoder e);  // "E2M1", "E4M3Satfinite", ... (PascalCase, test-name safe)
int encoder_code_bytes(Encoder e);    // bytes per code in a sweep output: 2 for kBf16, else 1

// out: [count] codes, encoder_code_bytes(e) each, little endian;
// out[i] = encoder(f32_from_bits(begin + i)). Needs begin + count <= 2^32.
void sweep_encoder(Encoder e, uint64_t begin, uint64_t count, void* out, void* stream = nullptr);

// The same sweep through CUDA's conversions, for encoders that CUDA has:
//   kE2M1             __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
//   kE4M3Satfinite    __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
//   kE4M3NoSat        __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)
//   kE8M0Ceil         __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf)
//   kE8M0CeilOfficial the same as kE8M0Ceil (the formula differs from it on purpose at the edges)
//   kBf16             __float2bfloat16_rn(x)
void sweep_cuda_intrinsic(Encoder e, uint64_t begin, uint64_t count, void* out,
                          void* stream = nullptr);

// ---- block recipes (formats/packed.h) ----

// x: [rows, dim] fp32 on device, 16-byte aligned (bf16 values in practice).
// out: [rows, formats::entry_bytes(f, dim)] packed entries; finite: [rows] 1 if every block of
// the row was finite, else 0 (the bytes are still written, as pack_compressed_kv & co. write them).
// Throws if dim is not valid for f (formats::entry_bytes) or x is misaligned.
void pack_rows(formats::CacheFormat f, const float* x, int64_t rows, int dim, uint8_t* out,
               uint8_t* finite, void* stream = nullptr);

// The same packer on bf16 storage (the production format, cuda/kv_pack.cu): x: [rows, dim] bf16
// bit patterns (uint16), 16-byte aligned; the bytes and flags equal pack_rows' on the same values.
// Only kWindowKvFp8 and kCompressedKvFp4 (throws for the others); dim % 8 == 0.
void pack_rows_bf16(formats::CacheFormat f, const uint16_t* x, int64_t rows, int dim, uint8_t* out,
                    uint8_t* finite, void* stream = nullptr);

// y[i] = formats::bf16_encode(x[i]), i < n: bf16 values in fp32 storage -> bf16 storage (exact
// for bf16 values). For benches and tests of the bf16-storage kernels.
void to_bf16_storage(const float* x, int64_t n, uint16_t* y, void* stream = nullptr);

// in: [rows, entry_bytes(f, dim)] any bytes; out: [rows, dim] fp32, 16-byte aligned, the
// values unpack_compressed_kv & co. give for the same bytes.
void unpack_rows(formats::CacheFormat f, const uint8_t* in, int64_t rows, int dim, float* out,
                 void* stream = nullptr);

}  // namespace dsv41::gpu
