// cuda/staging_ring.h
//
// StagingRing: the bookkeeping of the pinned upload ring (cuda/upload_staging.cu) — which bytes of
// a fixed arena a new upload may take, and which earlier uploads must have finished first. Host
// code with no CUDA types: a staged region is "in flight" until its fence (CUDA: an event recorded
// after its cudaMemcpyAsync) has passed; StagingFences asks about fences, so tests drive the ring
// with fake ones (tests/cuda/upload_staging_test.cc, no device needed).
//
// Regions are handed out one after another from `head`, wrapping to offset 0 when the next one
// does not fit before the end. So, read in address order from `head` (wrapping), the regions in
// flight are oldest first: the oldest is the one a new region runs into first. reserve() frees the
// oldest regions (front of the queue) that are in the way, the arena's tail given up by a wrap
// counting as in the way: it waits once, for the newest of them whose fence has not passed (fences
// of one stream pass in the order they were recorded, so the older ones have passed by then; it
// would wait for any that had not), and retires them in queue order.
//
// Example:
//   StagingRing ring(8 << 20, 256);
//   const std::size_t off = ring.reserve(bytes, fences);  // may wait for an old copy
//   std::memcpy(arena + off, src, bytes);  cudaMemcpyAsync(dst, arena + off, ...);  record(event);
//   ring.commit(off, bytes, event);
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "base/error.h"

namespace dsv41::gpu {

// The owner's view of a fence (an opaque handle; CUDA: a cudaEvent_t).
class StagingFences {
 public:
  virtual ~StagingFences() = default;
  virtual bool passed(void* fence) = 0;   // the region's copy has completed (never waits)
  virtual void wait(void* fence) = 0;     // block until it has
  virtual void release(void* fence) = 0;  // the region is free again; the fence may be reused
};

class StagingRing {
 public:
  // capacity: the arena's bytes, a positive multiple of align (every region starts aligned).
  StagingRing(std::size_t capacity, std::size_t align) : capacity_(capacity), align_(align) {
    DSV41_CHECK(align > 0 && capacity > 0 && capacity % align == 0, "StagingRing: capacity ", capacity,
                " is not a positive multiple of the alignment ", align);
  }

  // The offset of `bytes` (0 < bytes <= capacity) no in-flight copy uses. Retires every leading
  // region whose fence has passed, then the oldest regions still in the way (waiting for them).
  std::size_t reserve(std::size_t bytes, StagingFences& f) {
    DSV41_CHECK(bytes > 0 && bytes <= capacity_, "StagingRing: a region of ", bytes, " bytes in an arena of ",
                capacity_);
    const std::size_t n = rounded(bytes);
    while (!regions_.empty() && f.passed(regions_.front().fence)) retire_front(f);
    if (regions_.empty()) head_ = 0;  // nothing in flight: start over at the arena's beginning
    const bool wrap = head_ + n > capacity_;
    const std::size_t off = wrap ? 0 : head_;
    std::size_t in_way = 0;  // the leading regions in the way
    for (; in_way < regions_.size(); ++in_way) {
      const Region& r = regions_[in_way];
      const bool in_given_up_tail = wrap && r.offset >= head_;
      const bool overlaps = r.offset < off + n && off < r.offset + r.bytes;
      if (!in_given_up_tail && !overlaps) break;
    }
    // Wait once, for the newest of them (the older ones' fences pass first); then retire them all.
    for (std::size_t k = in_way; k-- > 0;) {
      if (f.passed(regions_[k].fence)) continue;
      ++waits_;
      f.wait(regions_[k].fence);
    }
    for (; in_way > 0; --in_way) retire_front(f);
    return off;
  }

  // The region reserve() just returned is in flight until `fence` passes.
  void commit(std::size_t offset, std::size_t bytes, void* fence) {
    const std::size_t n = rounded(bytes);
    DSV41_CHECK(offset % align_ == 0 && offset + n <= capacity_, "StagingRing: commit of [", offset, ", ",
                offset + n, ") outside the arena of ", capacity_);
    regions_.push_back(Region{offset, n, fence});
    head_ = offset + n;
  }

  std::size_t in_flight() const { return regions_.size(); }  // regions not yet retired
  int64_t waits() const { return waits_; }                    // reserve()'s waits so far
  std::size_t capacity() const { return capacity_; }

 private:
  struct Region {
    std::size_t offset, bytes;  // bytes rounded up to the alignment
    void* fence;
  };
  std::size_t rounded(std::size_t bytes) const { return (bytes + align_ - 1) / align_ * align_; }
  void retire_front(StagingFences& f) {
    void* fence = regions_.front().fence;
    regions_.pop_front();
    f.release(fence);
  }

  std::size_t capacity_, align_, head_ = 0;
  std::deque<Region> regions_;  // in flight, oldest first
  int64_t waits_ = 0;
};

}  // namespace dsv41::gpu
