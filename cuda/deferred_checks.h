// cuda/deferred_checks.h
//
// Deferred input checks of the CUDA ops table (DSV41_CUDA_DEFER_CHECKS=1; docs/cuda.md "Host
// synchronizations of a decode step"). A ported op whose device-side check can only ever lead to
// an error (the reference raising: a non-bf16 linear input, a non-finite act_quant block or cache
// row, a NaN top-k score) does not read its status back: the check writes into a slot of a
// device array, the host notes what the slot checks, and the pending slots are read at the next
// point that synchronizes anyway (CudaOps::download, host_copy; one async copy before it), where
// a set slot raises a dsv41::Error naming the op and the thing. Host header, no CUDA types:
//   defer_checks()     the switch, read once (parse_defer_checks: unset, "", "0" off; "1" on)
//   PendingChecks      host bookkeeping: which check each slot holds, and the error of a set one
//   CheckSlots         the device side: [capacity] zeroed ints, their pinned host mirror, the copy
//                      staged before a synchronizing call and read after it (cuda/host_sync.cu)
// One CudaOps owns one of each; a check failing on one thread may be raised on another thread's
// download of the same CudaOps (the backend is driven by one thread at a time in practice).
//
// Example:
//   PendingChecks p(4);
//   const int slot = p.add("linear 'wq_a' (F8): an input is not a bf16 value");
//   ... the kernel sets flags[slot] on the device; after a synchronization:
//   p.resolve(flags, p.pending());   // throws naming 'wq_a' when flags[slot] != 0; clears the list
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::gpu {

// DSV41_CUDA_DEFER_CHECKS's value: nullptr, "" or "0" -> false, "1" -> true; anything else throws
// a dsv41::Error naming the value.
bool parse_defer_checks(const char* value);
// The process's switch: parse_defer_checks(getenv("DSV41_CUDA_DEFER_CHECKS")), read once.
bool defer_checks();

class PendingChecks {
 public:
  explicit PendingChecks(int capacity);
  int capacity() const { return capacity_; }
  int pending() const { return static_cast<int>(what_.size()); }
  bool full() const { return pending() >= capacity_; }
  // The next free slot, now checking `what` (an op, its operand and what a set flag means).
  // Throws when full() (the caller resolves first).
  int add(std::string what);
  // flags [n] as read back (n == pending()): forgets every pending check, then throws a
  // dsv41::Error naming the first set one (in the order added) and how many were set.
  void resolve(const int* flags, int n);

 private:
  int capacity_;
  std::vector<std::string> what_;  // [pending()] by slot
};

// [capacity] device ints, zero until a kernel sets one; their pinned host mirror.
class CheckSlots {
 public:
  explicit CheckSlots(int capacity);  // allocates and zeroes (synchronizes once)
  ~CheckSlots();
  CheckSlots(const CheckSlots&) = delete;
  CheckSlots& operator=(const CheckSlots&) = delete;
  int* slot(int i) const;  // the device int of slot i
  // Copies slots [0, n) to the host mirror, asynchronously (no host wait), and records an event.
  void stage(int n);
  // After stage(): the host values of the staged slots (waiting for the copy only if no
  // synchronization since stage() has already passed it: then counted as a host sync), with
  // those device slots zeroed again (asynchronously). Valid until the next stage().
  const int* settle();

 private:
  int capacity_;
  int staged_ = 0;
  int* device_ = nullptr;
  int* host_ = nullptr;   // pinned
  void* event_ = nullptr;  // cudaEvent_t
};

}  // namespace dsv41::gpu
