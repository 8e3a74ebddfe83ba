// scenarios/defects/bug_zoo_ops.h
//
// The ops-level bugs of the self-test's zoo (scenarios/selftest/bug_zoo.h, docs/selftest.md):
// each a ForwardingOps (scenarios/defects/bug_zoo_forwarding.h) that changes one op the way a
// real port got it wrong. The zoo's table names them; this header builds them.
//
// Example:
//   auto factory = zoo_ops_factory("e8m0_scale_floor");
//   std::unique_ptr<reference::seam::Ops> ops = factory(config);
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "reference/ops/config.h"
#include "reference/seam/ops.h"

namespace dsv41::scenarios::defects {

// The ops-level bugs' factories (scenarios/defects/bug_zoo_ops.cc), by bug name; nullptr for an unknown name.
std::function<std::unique_ptr<reference::seam::Ops>(const reference::ModelConfig&)> zoo_ops_factory(const std::string& bug);

}  // namespace dsv41::scenarios::defects
