// scenarios/defects/bug_zoo_forwarding.h
//
// BugOps: the base of the zoo's ops-level bugs (scenarios/defects/bug_zoo_ops.cc). A bug derives
// from it and overrides the one op it gets wrong; every other op forwards to the CPU reference
// (reference/seam/forwarding_ops.h, which also tracks the running layer: current_layer()).
// name() is "reference+<bug>".
#pragma once

#include <string>

#include "reference/seam/forwarding_ops.h"

namespace dsv41::scenarios::defects {

class BugOps : public reference::seam::ForwardingOps {
 public:
  explicit BugOps(const std::string& bug) : ForwardingOps(reference::seam::reference_ops(), "reference+" + bug) {}

 protected:
  static const reference::seam::Ops& ref() { return reference::seam::reference_ops(); }
};

}  // namespace dsv41::scenarios::defects
