// cuda/host_sync.cu
//
// The synchronous memory helpers of cuda/device.h and their count (every host wait this library
// makes goes through note_host_sync; copy_to_device is cuda/upload_staging.cu), the asynchronous
// ones, and CheckSlots (cuda/deferred_checks.h: the device side of the deferred checks).
#include <atomic>

#include "cuda/common.cuh"
#include "cuda/deferred_checks.h"
#include "cuda/device.h"

namespace dsv41::gpu {
namespace {
std::atomic<int64_t> g_syncs[3];  // by HostSync
}  // namespace

void note_host_sync(HostSync kind) { g_syncs[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed); }

HostSyncCounts host_sync_counts() {
  HostSyncCounts c;
  c.d2h = g_syncs[static_cast<int>(HostSync::kD2H)].load(std::memory_order_relaxed);
  c.h2d = g_syncs[static_cast<int>(HostSync::kH2D)].load(std::memory_order_relaxed);
  c.device = g_syncs[static_cast<int>(HostSync::kDevice)].load(std::memory_order_relaxed);
  return c;
}
int64_t host_sync_count() { return host_sync_counts().total(); }

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  note_host_sync(HostSync::kD2H);
  DSV41_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void fill_device(void* dst, uint8_t byte, std::size_t bytes) {
  if (bytes != 0) DSV41_CUDA_CHECK(cudaMemset(dst, byte, bytes));
  note_host_sync(HostSync::kDevice);
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
}

void synchronize() {
  note_host_sync(HostSync::kDevice);
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
}

void fill_device_async(void* dst, uint8_t byte, std::size_t bytes) {
  if (bytes != 0) DSV41_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, 0));
}

void copy_to_host_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) DSV41_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, 0));
}

namespace {
__global__ void spin_kernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
}  // namespace

void spin_device(uint64_t ns) {
  spin_kernel<<<1, 1>>>(ns);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

// ---- CheckSlots ----

CheckSlots::CheckSlots(int capacity) : capacity_(capacity) {
  DSV41_CHECK(capacity > 0, "CheckSlots: capacity ", capacity);
  device_ = static_cast<int*>(device_alloc(static_cast<std::size_t>(capacity) * sizeof(int)));
  host_ = static_cast<int*>(pinned_alloc(static_cast<std::size_t>(capacity) * sizeof(int)));
  cudaEvent_t e = nullptr;
  DSV41_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
  fill_device(device_, 0, static_cast<std::size_t>(capacity) * sizeof(int));
}

CheckSlots::~CheckSlots() {
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  pinned_free(host_);
  device_free(device_);
}

int* CheckSlots::slot(int i) const {
  DSV41_CHECK(i >= 0 && i < capacity_, "CheckSlots: slot ", i, " of ", capacity_);
  return device_ + i;
}

void CheckSlots::stage(int n) {
  DSV41_CHECK(n >= 0 && n <= capacity_, "CheckSlots: stage of ", n, " slots of ", capacity_);
  staged_ = n;
  if (n == 0) return;
  copy_to_host_async(host_, device_, static_cast<std::size_t>(n) * sizeof(int));
  DSV41_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), 0));
}

const int* CheckSlots::settle() {
  if (staged_ == 0) return host_;
  const auto e = static_cast<cudaEvent_t>(event_);
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) {  // no synchronization passed the copy: wait for it
    note_host_sync(HostSync::kDevice);
    DSV41_CUDA_CHECK(cudaEventSynchronize(e));
  } else {
    DSV41_CUDA_CHECK(q);
  }
  fill_device_async(device_, 0, static_cast<std::size_t>(staged_) * sizeof(int));
  staged_ = 0;
  return host_;
}

}  // namespace dsv41::gpu
