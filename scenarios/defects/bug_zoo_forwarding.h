// scenarios/defects/bug_zoo_forwarding.h
//
// BugOps: the base of the zoo's ops-level bugs (scenarios/defects/bug_zoo_ops.cc,
// small_bug_ops.cc). A bug derives from it and overrides the one op it gets wrong; every other op
// forwards to the BASE ops (reference/seam/forwarding_ops.h, which also tracks the running layer:
// current_layer()): the CPU reference by default, or any backend's ops (the small bugs: a
// reordered variant, the tensor-core emulation, the production CUDA path), so a bug is planted in
// that backend. A bug that recomputes an op on the host takes its inputs through host() and hands
// its output back through device() (identity copies for a host base). name() is
// "<base's name>+<bug>" ("reference+<bug>" on the reference).
#pragma once

#include <string>

#include "reference/seam/forwarding_ops.h"

namespace dsv41::scenarios::defects {

class BugOps : public reference::seam::ForwardingOps {
 public:
  explicit BugOps(const std::string& bug, const reference::seam::Ops& base = reference::seam::reference_ops())
      : ForwardingOps(base, (&base == &reference::seam::reference_ops() ? std::string("reference") : base.name()) + "+" +
                                bug) {}

 protected:
  // The CPU reference (the large zoo's bugs, always on it).
  static const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
  // The ops the bug is planted in (every op it does not get wrong runs there).
  const reference::seam::Ops& base() const { return inner(); }
  // A tensor of the base's memory on the host, and back.
  template <typename T>
  reference::Tensor<T> host(const reference::Tensor<T>& t) const { return inner().download(t); }
  template <typename T>
  reference::Tensor<T> device(reference::Tensor<T> t) const { return inner().upload(std::move(t)); }
};

}  // namespace dsv41::scenarios::defects
