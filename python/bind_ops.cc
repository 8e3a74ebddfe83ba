// python/bind_ops.cc
//
// dsv41.ops (docs/python.md, "Ops"): each reference op of the seam (reference/seam/ops.h) by name, the
// way the conformance vectors run them (scenarios/vectors/vectors.h run_vector_case: one contract per op,
// docs/port-dump.md "Conformance vectors" table): inputs by name, scalar parameters, the config
// where the op needs it, outputs by name. python/dsv41/ops.py gives each op its own function with
// its shapes and dtypes.
#include <cstdio>
#include <map>
#include <string>

#include "python/bindings.h"
#include "python/op_inputs.h"
#include "python/port_ops.h"
#include "reference/ops/config.h"
#include "reference/seam/ops.h"
#include "scenarios/vectors/vectors.h"

namespace dsv41::python {

namespace st = reference::checkpoint::safetensors;

namespace {

st::Entry raw_entry(const std::string& name, reference::DType dtype, std::vector<int64_t> shape, const py::handle& bytes) {
  st::Entry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  reference::Tensor<uint8_t> b = to_int<uint8_t>(bytes, name);
  e.bytes = std::move(b.data());
  return e;
}

template <typename T>
st::Entry typed_entry(const std::string& name, reference::DType dtype, const py::handle& h) {
  reference::Tensor<T> t = to_int<T>(h, name);
  st::Entry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = t.shape();
  e.bytes.resize(t.data().size() * sizeof(T));
  if (!e.bytes.empty()) std::memcpy(e.bytes.data(), t.data().data(), e.bytes.size());
  return e;
}

std::string param_string(const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "1" : "0";
  if (py::isinstance<py::int_>(v)) return std::to_string(int_param<int64_t>(v, key));  // 2**64 refused
  if (py::isinstance<py::float_>(v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v.cast<double>());
    return buf;
  }
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  DSV41_FAIL("parameter '", key, "': expected an int, float, bool or str, got ", py::str(v.get_type()).cast<std::string>());
}

}  // namespace

st::Entry input_entry(const std::string& name, const py::handle& v) {
  if (py::isinstance<py::tuple>(v)) {  // (dtype name, logical shape, uint8 bytes): a checkpoint tensor as stored
    py::tuple t = v.cast<py::tuple>();
    DSV41_CHECK(t.size() == 3, "input '", name, "': a stored tensor is (dtype name, shape, uint8 bytes)");
    return raw_entry(name, reference::dtype_from_name(t[0].cast<std::string>()), t[1].cast<std::vector<int64_t>>(), t[2]);
  }
  py::array a = as_array(v);
  if (!a) DSV41_FAIL("input '", name, "': not an array");
  if (a.dtype().is(py::dtype::of<float>()) || a.dtype().is(py::dtype::of<uint16_t>())) {
    reference::Tensor<float> f = to_f32(a, name);
    st::Entry e;
    e.name = name;
    e.dtype = reference::DType::kF32;
    e.shape = f.shape();
    e.bytes.resize(f.data().size() * 4);
    if (!e.bytes.empty()) std::memcpy(e.bytes.data(), f.data().data(), e.bytes.size());
    return e;
  }
  if (a.dtype().is(py::dtype::of<int32_t>())) return typed_entry<int32_t>(name, reference::DType::kI32, a);
  if (a.dtype().is(py::dtype::of<int64_t>())) return typed_entry<int64_t>(name, reference::DType::kI64, a);
  if (a.dtype().is(py::dtype::of<uint8_t>())) return typed_entry<uint8_t>(name, reference::DType::kU8, a);
  DSV41_FAIL("input '", name, "': dtype ", dtype_str(a),
             "; expected float32 / uint16 (bf16 bits), int32, int64, uint8, or (dtype, shape, bytes) for a stored weight");
}

st::SafetensorsFile op_case(const std::string& op, const py::dict& inputs, const py::dict& params,
                            const reference::ModelConfig* config) {
  std::vector<st::Entry> entries;
  for (const auto& [k, v] : inputs) entries.push_back(input_entry("in." + py::str(k).cast<std::string>(), v));
  std::map<std::string, std::string> md = {{"op", op}};
  for (const auto& [k, v] : params) {
    const std::string key = py::str(k).cast<std::string>();
    md["param." + key] = param_string(key, v);
  }
  if (config != nullptr) md["config"] = reference::to_json_string(*config);
  return st::SafetensorsFile::from_entries("dsv41.ops." + op, std::move(entries), std::move(md));
}

py::dict outputs_dict(std::vector<st::Entry>&& out) {
  py::dict d;
  for (st::Entry& e : out) {
    const std::string name = e.name.rfind("out.", 0) == 0 ? e.name.substr(4) : e.name;
    const int64_t n = e.numel();
    switch (e.dtype) {
      case reference::DType::kF32: {
        std::vector<float> v(static_cast<size_t>(n));
        if (n) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
        d[name.c_str()] = to_numpy(std::move(v), e.shape);
        break;
      }
      case reference::DType::kI32: {
        std::vector<int32_t> v(static_cast<size_t>(n));
        if (n) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
        d[name.c_str()] = to_numpy(std::move(v), e.shape);
        break;
      }
      case reference::DType::kI64: {
        std::vector<int64_t> v(static_cast<size_t>(n));
        if (n) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
        d[name.c_str()] = to_numpy(std::move(v), e.shape);
        break;
      }
      default: d[name.c_str()] = to_numpy(std::move(e.bytes), e.shape); break;
    }
  }
  return d;
}

py::dict run_op(const std::string& op, const py::dict& inputs, const py::dict& params,
                const reference::ModelConfig* config) {
  const st::SafetensorsFile f = op_case(op, inputs, params, config);
  std::vector<st::Entry> out;
  {
    py::gil_scoped_release release;
    out = scenarios::vectors::run_vector_case(reference::seam::reference_ops(), f);
  }
  return outputs_dict(std::move(out));
}

void register_ops(py::module_& m) {
  m.def("run_op", &run_op, py::arg("op"), py::arg("inputs"), py::arg("params") = py::dict(),
        py::arg("config") = nullptr,
        "run one reference op (a reference::seam::Ops method, docs/port-dump.md 'Conformance vectors' table): inputs "
        "{name: array}, params {name: scalar}, config where the op needs it -> {output name: array}");
  m.def("port_ops", [] { return std::vector<std::string>(PortOps::supported().begin(), PortOps::supported().end()); },
        "the ops a Python port may replace in dsv41.Model(..., port={...})");
}

}  // namespace dsv41::python
