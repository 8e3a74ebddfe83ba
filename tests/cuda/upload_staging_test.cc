// tests/cuda/upload_staging_test.cc: the asynchronous small uploads (DSV41_CUDA_ASYNC_UPLOADS,
// cuda/upload_staging.cu) and the ring's bookkeeping (cuda/staging_ring.h).
//   host (no device needed): StagingRing with fake fences — regions side by side while there is
//     room, a wait only for the oldest region in the way, the tail given up by a wrap, fences
//     released once each in order, and on random sizes and fence timings no region handed out
//     that overlaps a copy still in flight.
//   device (skips without one):
//     (a) 300 uploads of 64 KiB (and 1000 of 16 KiB) into one device buffer, each consumed by a
//         kernel before the next, queued behind a 0.3 s kernel: 19 MB through the 8 MiB ring, so it
//         wraps onto copies still in flight; the host buffer is overwritten after each upload. The
//         rows the kernels wrote equal the host data (what the synchronous path gives), and each
//         wait is counted as one device sync;
//     (b) 1000 small uploads behind a running kernel: 0 host syncs, 1000 staged;
//     (c) an upload above kStagedUploadMaxBytes: the synchronous path, 1 h2d sync;
//     (d) CudaOps::upload and DevIn of host tensors: the same values back.
// With DSV41_CUDA_ASYNC_UPLOADS=0 the contents are checked the same and the counts are those of
// the synchronous path (one h2d per upload).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda/device_tensor.h"
#include "cuda/kernels.h"
#include "cuda/staging_ring.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using reference::Tensor;

// ---- host: the ring's bookkeeping ----

// Fences are the integers 1, 2, ... in commit order; like events of one stream they pass in
// order: every fence <= completed has passed. wait(f) completes everything up to f.
class FakeFences final : public gpu::StagingFences {
 public:
  void* issue() { return reinterpret_cast<void*>(++issued); }
  static uintptr_t id(void* f) { return reinterpret_cast<uintptr_t>(f); }
  bool passed(void* f) override { return id(f) <= completed; }
  void wait(void* f) override {
    waited.push_back(id(f));
    completed = std::max(completed, id(f));
  }
  void release(void* f) override {
    EXPECT_LE(id(f), completed) << "fence " << id(f) << " released before it passed";
    released.push_back(id(f));
  }

  uintptr_t issued = 0, completed = 0;
  std::vector<uintptr_t> waited, released;
};

std::size_t place(gpu::StagingRing& ring, FakeFences& f, std::size_t bytes) {
  const std::size_t off = ring.reserve(bytes, f);
  ring.commit(off, bytes, f.issue());
  return off;
}

TEST(CudaStagingRing, SideBySideWhileThereIsRoomThenWaitsForTheOldest) {
  gpu::StagingRing ring(1024, 256);
  FakeFences f;  // nothing ever passes unless waited for
  EXPECT_EQ(place(ring, f, 100), 0u);
  EXPECT_EQ(place(ring, f, 256), 256u);
  EXPECT_EQ(place(ring, f, 1), 512u);
  EXPECT_EQ(place(ring, f, 200), 768u);
  EXPECT_EQ(ring.waits(), 0);
  EXPECT_EQ(ring.in_flight(), 4u);
  EXPECT_EQ(place(ring, f, 256), 0u);  // wraps onto fence 1's region: waits for it alone
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1}));
  EXPECT_EQ(f.released, (std::vector<uintptr_t>{1}));
  EXPECT_EQ(ring.in_flight(), 4u);
  EXPECT_EQ(place(ring, f, 512), 256u);  // fences 2 and 3 are in the way: one wait, for 3
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1, 3}));
  EXPECT_EQ(f.released, (std::vector<uintptr_t>{1, 2, 3}));
  EXPECT_EQ(ring.waits(), 2);
}

TEST(CudaStagingRing, PassedRegionsAreReusedWithoutWaiting) {
  gpu::StagingRing ring(1024, 128);
  FakeFences f;
  for (int i = 0; i < 100; ++i) {
    place(ring, f, 300);
    f.completed = f.issued;  // the copy ran before the next upload
  }
  EXPECT_EQ(ring.waits(), 0);
  EXPECT_TRUE(f.waited.empty());
  EXPECT_EQ(f.released.size(), 99u);  // the last is still held (its fence passed; retired lazily)
}

TEST(CudaStagingRing, WrapGivesUpTheTailAndWaitsOnlyForWhatOverlaps) {
  gpu::StagingRing ring(1024, 128);
  FakeFences f;
  EXPECT_EQ(place(ring, f, 512), 0u);    // fence 1: [0, 512)
  EXPECT_EQ(place(ring, f, 384), 512u);  // fence 2: [512, 896)
  EXPECT_EQ(place(ring, f, 256), 0u);    // 896 + 256 > 1024: wraps; fence 1 is in the way
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1}));
  EXPECT_EQ(place(ring, f, 128), 256u);  // [256, 384): clear of fence 2
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1}));
  EXPECT_EQ(place(ring, f, 512), 384u);  // [384, 896) runs into fence 2
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1, 2}));
  EXPECT_EQ(place(ring, f, 1024), 0u);   // the whole arena: fences 3, 4, 5 go, one wait for 5
  EXPECT_EQ(f.waited, (std::vector<uintptr_t>{1, 2, 5}));
  EXPECT_EQ(f.released, (std::vector<uintptr_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(ring.in_flight(), 1u);
}

TEST(CudaStagingRing, RejectsBadSizes) {
  EXPECT_THROW(gpu::StagingRing(1000, 256), Error);
  EXPECT_THROW(gpu::StagingRing(0, 256), Error);
  gpu::StagingRing ring(1024, 256);
  FakeFences f;
  EXPECT_THROW(ring.reserve(0, f), Error);
  EXPECT_THROW(ring.reserve(1025, f), Error);
}

// Random sizes and random fence progress: a region handed out never overlaps a committed region
// whose fence has not passed; fences are released once each, in order.
TEST(CudaStagingRing, NeverHandsOutBytesInFlight) {
  std::mt19937_64 g(20);
  for (const std::size_t align : {std::size_t{1}, std::size_t{64}, std::size_t{256}}) {
    const std::size_t cap = 16 * 256;
    gpu::StagingRing ring(cap, align);
    FakeFences f;
    struct Placed {
      std::size_t off, end;
      uintptr_t fence;
    };
    std::vector<Placed> placed;
    for (int i = 0; i < 20000; ++i) {
      const std::size_t bytes = 1 + g() % (i % 7 == 0 ? cap : cap / 8);
      const std::size_t off = ring.reserve(bytes, f);
      const std::size_t end = off + (bytes + align - 1) / align * align;
      ASSERT_LE(end, cap);
      ASSERT_EQ(off % align, 0u);
      for (const Placed& p : placed) {
        if (p.fence > f.completed) {
          ASSERT_FALSE(p.off < end && off < p.end)
              << "step " << i << ": [" << off << ", " << end << ") overlaps fence " << p.fence << "'s [" << p.off
              << ", " << p.end << ") still in flight";
        }
      }
      ring.commit(off, bytes, f.issue());
      placed.push_back(Placed{off, end, f.issued});
      std::erase_if(placed, [&](const Placed& p) { return p.fence <= f.completed; });
      f.completed = std::min(f.issued, f.completed + g() % 3);  // the device runs on, in order
    }
    for (std::size_t k = 0; k < f.released.size(); ++k) ASSERT_EQ(f.released[k], k + 1) << "release order";
    EXPECT_GT(ring.waits(), 0) << "the sizes should have made the ring wait sometimes";
    EXPECT_LT(static_cast<std::size_t>(ring.waits()), f.issued) << "the device's progress should have spared waits";
  }
}

// ---- device ----

// Each of `n` uploads of `row_bytes` goes into one device buffer `slot`, which a kernel then copies
// into row i of `out`, all queued behind a kernel of `spin_ns`. The host buffer is overwritten
// right after each upload. The counters are read around the queueing (not the download).
struct UploadRun {
  std::vector<uint8_t> got, expect;  // the rows the kernels wrote; what was uploaded
  gpu::HostSyncCounts syncs;         // while queueing
  gpu::UploadStagingStats staging;   // while queueing
};
UploadRun upload_rows(int n, std::size_t row_bytes, uint64_t spin_ns) {
  gpu::DeviceBuffer<uint8_t> slot(row_bytes), out(static_cast<std::size_t>(n) * row_bytes);
  std::mt19937_64& g = rng();
  std::vector<uint8_t> host(row_bytes);
  UploadRun run;
  run.expect.assign(static_cast<std::size_t>(n) * row_bytes, 0);
  const gpu::HostSyncCounts s0 = gpu::host_sync_counts();
  const gpu::UploadStagingStats u0 = gpu::upload_staging_stats();
  gpu::spin_device(spin_ns);
  for (int i = 0; i < n; ++i) {
    for (auto& b : host) b = static_cast<uint8_t>(g());
    std::memcpy(run.expect.data() + static_cast<std::size_t>(i) * row_bytes, host.data(), row_bytes);
    gpu::copy_to_device(slot.get(), host.data(), row_bytes);
    std::fill(host.begin(), host.end(), uint8_t{0xEE});  // the caller's buffer is free at once
    gpu::copy_rows(slot.get(), nullptr, out.get() + static_cast<std::size_t>(i) * row_bytes, nullptr, 1,
                   static_cast<int64_t>(row_bytes));
  }
  const gpu::HostSyncCounts s1 = gpu::host_sync_counts();
  const gpu::UploadStagingStats u1 = gpu::upload_staging_stats();
  run.syncs = {s1.d2h - s0.d2h, s1.h2d - s0.h2d, s1.device - s0.device};
  run.staging = {u1.staged - u0.staged, u1.staged_bytes - u0.staged_bytes, u1.waits - u0.waits};
  run.got = out.download();
  return run;
}

std::size_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  const auto m = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<std::size_t>(m.first - a.begin());
}

// 300 x 64 KiB: the ring wraps (after 128 uploads, about 400 queued commands: short of the launch
// queue, so the host reaches the wrap while the 0.3 s kernel runs and must wait); 1000 x 16 KiB:
// the same through a longer queue (the host may also block on the launch queue, which no counter
// sees).
TEST(CudaAsyncUploads, WrappingTheRingBehindARunningKernelKeepsEveryRow) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (const auto& [n, row] : {std::pair<int, std::size_t>{300, 64 << 10}, {1000, 16 << 10}}) {
    const UploadRun r = upload_rows(n, row, 300'000'000);
    ASSERT_EQ(r.got.size(), r.expect.size());
    const std::size_t diff = first_difference(r.got, r.expect);
    EXPECT_EQ(diff, r.got.size()) << n << " x " << row << " bytes: row " << diff / row << " differs";
    std::printf("%d uploads of %zu bytes behind a 300 ms kernel: %lld staged, %lld ring waits; syncs d2h %lld h2d "
                "%lld device %lld\n",
                n, row, static_cast<long long>(r.staging.staged), static_cast<long long>(r.staging.waits),
                static_cast<long long>(r.syncs.d2h), static_cast<long long>(r.syncs.h2d),
                static_cast<long long>(r.syncs.device));
    if (gpu::async_uploads()) {
      EXPECT_EQ(r.staging.staged, n);
      if (n == 300) {
        EXPECT_GT(r.staging.waits, 0) << "19 MB behind a 0.3 s kernel must wrap onto copies in flight";
      }
      EXPECT_EQ(r.syncs.device, r.staging.waits) << "each ring wait is one device sync";
      EXPECT_EQ(r.syncs.h2d + r.syncs.d2h, 0);
    } else {
      EXPECT_EQ(r.syncs.h2d, n);
    }
  }
}

TEST(CudaAsyncUploads, SmallUploadsCostNoHostSync) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const int n = 1000;
  const std::size_t row = 64;
  const auto t0 = std::chrono::steady_clock::now();
  const UploadRun r = upload_rows(n, row, 100'000'000);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(first_difference(r.got, r.expect), r.got.size());
  std::printf("%d uploads of %zu bytes behind a 100 ms kernel: %lld host syncs while queueing; %.1f ms in all\n", n,
              row, static_cast<long long>(r.syncs.total()), ms);
  if (gpu::async_uploads()) {
    EXPECT_EQ(r.syncs.total(), 0);
    EXPECT_EQ(r.staging.staged, n);
    EXPECT_EQ(r.staging.waits, 0);
  } else {
    EXPECT_EQ(r.syncs.h2d, n);
  }
}

TEST(CudaAsyncUploads, LargeUploadsStaySynchronous) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const std::size_t bytes = gpu::kStagedUploadMaxBytes + 4096;
  std::vector<uint8_t> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(i * 31 + 5);
  gpu::DeviceBuffer<uint8_t> d(bytes);
  const gpu::HostSyncCounts s0 = gpu::host_sync_counts();
  d.upload(host);
  const gpu::HostSyncCounts s1 = gpu::host_sync_counts();
  EXPECT_EQ(s1.h2d - s0.h2d, 1);
  EXPECT_EQ(d.download(), host);
}

TEST(CudaAsyncUploads, OpsUploadsAndHostInputsArriveIntact) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const gpu::CudaOps& ops = cuda_ops();
  for (int round = 0; round < 50; ++round) {
    Tensor<int32_t> idx({3, 17}, "idx");
    for (int64_t i = 0; i < idx.numel(); ++i) idx.data()[static_cast<std::size_t>(i)] = static_cast<int32_t>(i * 13 - round);
    const Tensor<int32_t> up = ops.upload(idx);
    ASSERT_FALSE(up.on_host());
    EXPECT_EQ(ops.download(up).data(), idx.data());
    const Tensor<float> x = random_bf16({5, 40});
    const gpu::DevIn<float> dx(x);
    Tensor<float> y = gpu::device_tensor<float>({5, 40}, "y");
    gpu::copy_rows(reinterpret_cast<const uint8_t*>(dx.get()), nullptr, reinterpret_cast<uint8_t*>(gpu::dev(y)),
                   nullptr, 5, 40 * sizeof(float));
    EXPECT_EQ(ops.download(y).data(), x.data());
  }
}

}  // namespace
}  // namespace dsv41::test
