// cuda/upload_staging.cu
//
// copy_to_device (cuda/device.h): a small upload goes through a pinned staging ring and an
// asynchronous copy on the legacy default stream, so the decode step's host-made index lists,
// token ids and routing weights cost no host wait (docs/cuda.md "Host synchronizations of a
// decode step"). The bytes are copied into the ring before copy_to_device returns; the copy to the
// device runs after every kernel queued before it, as cudaMemcpy's would, so the device sees the
// same bytes at the same point of the stream. The ring's bookkeeping is cuda/staging_ring.h; each
// staged region's fence is a CUDA event recorded after its copy.
//
// One process-wide ring (8 MiB of pinned memory, made at the first staged upload, never freed:
// uploads may come from static destructors), behind a mutex. The current device's legacy default
// stream; the library runs on one device.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "base/env_switch.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/staging_ring.h"

namespace dsv41::gpu {
namespace {

constexpr std::size_t kRingBytes = std::size_t{8} << 20;
constexpr std::size_t kRegionAlign = 256;
static_assert(kStagedUploadMaxBytes <= kRingBytes, "a staged upload must fit the ring");

// Fences are events of the legacy default stream, reused once their region is retired.
class EventFences final : public StagingFences {
 public:
  bool passed(void* fence) override {
    const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(fence));
    if (q == cudaErrorNotReady) {
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error
      return false;
    }
    DSV41_CUDA_CHECK(q);
    return true;
  }
  void wait(void* fence) override {
    note_host_sync(HostSync::kDevice);
    DSV41_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(fence)));
  }
  void release(void* fence) override { free_.push_back(static_cast<cudaEvent_t>(fence)); }

  cudaEvent_t take() {
    if (!free_.empty()) {
      const cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    DSV41_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

 private:
  std::vector<cudaEvent_t> free_;
};

struct Staging {
  std::mutex mu;
  uint8_t* arena = nullptr;  // pinned [kRingBytes]
  StagingRing ring{kRingBytes, kRegionAlign};
  EventFences fences;
  UploadStagingStats stats;
};

Staging& staging() {
  static Staging* s = new Staging();  // never destroyed (see the top)
  return *s;
}

void stage_upload(void* dst, const void* src, std::size_t bytes) {
  Staging& s = staging();
  const std::lock_guard<std::mutex> lock(s.mu);
  if (s.arena == nullptr) {
    void* p = nullptr;
    DSV41_CUDA_CHECK(cudaHostAlloc(&p, kRingBytes, cudaHostAllocPortable));
    s.arena = static_cast<uint8_t*>(p);
  }
  const int64_t waits_before = s.ring.waits();
  const std::size_t off = s.ring.reserve(bytes, s.fences);
  std::memcpy(s.arena + off, src, bytes);
  const cudaEvent_t e = s.fences.take();
  const cudaError_t copied = cudaMemcpyAsync(dst, s.arena + off, bytes, cudaMemcpyHostToDevice, 0);
  const cudaError_t recorded = copied == cudaSuccess ? cudaEventRecord(e, 0) : copied;
  if (recorded != cudaSuccess) {
    s.fences.release(e);  // the region was never committed: it stays free
    DSV41_CUDA_CHECK(recorded);
  }
  s.ring.commit(off, bytes, e);
  s.stats.staged += 1;
  s.stats.staged_bytes += static_cast<int64_t>(bytes);
  s.stats.waits += s.ring.waits() - waits_before;
}

}  // namespace

bool async_uploads() {
  static const bool on = env_switch("DSV41_CUDA_ASYNC_UPLOADS", false);  // off until a device run settles it
  return on;
}

UploadStagingStats upload_staging_stats() {
  Staging& s = staging();
  const std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes <= kStagedUploadMaxBytes && async_uploads()) {
    stage_upload(dst, src, bytes);
    return;
  }
  note_host_sync(HostSync::kH2D);
  DSV41_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

}  // namespace dsv41::gpu
