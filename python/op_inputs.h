// python/op_inputs.h
//
// An op's inputs and parameters as an in-memory conformance-vector case (scenarios/vectors/vectors.h):
// what dsv41.ops.run and dsv41.check hand run_vector_case (python/bind_ops.cc).
#pragma once

#include <string>
#include <vector>

#include "python/bindings.h"
#include "reference/ops/config.h"
#include "reference/checkpoint/safetensors.h"

namespace dsv41::python {

// One input: a float32 / uint16 (bf16 bits) array -> F32; int32 -> I32; int64 -> I64; uint8 -> U8;
// a tuple (dtype name, shape, uint8 bytes) -> the stored tensor (weights: F8_E4M3, F4, E8M0, BF16).
reference::checkpoint::safetensors::Entry input_entry(const std::string& name, const py::handle& v);

// The case: "in.<name>" entries, "param.<k>" metadata, "config" when given.
reference::checkpoint::safetensors::SafetensorsFile op_case(const std::string& op, const py::dict& inputs, const py::dict& params,
                                                const reference::ModelConfig* config);

// {name: array} of a case's outputs ("out." dropped).
py::dict outputs_dict(std::vector<reference::checkpoint::safetensors::Entry>&& out);

}  // namespace dsv41::python
