// python/module.cc
//
// The `dsv41._core` extension module (pybind11): the C++ half of the `dsv41` Python package
// (python/dsv41/, docs/python.md). Every dsv41::Error becomes a `dsv41.Error` (a ValueError) with
// the same message the CLI prints after "dsv41: error: ".
#include "python/bindings.h"

#include "base/data_dir.h"
#include "reference/ops/config.h"

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  m.doc() = "dsv41's C++ reference, bound for Python (use the dsv41 package, not this module)";
  static py::exception<dsv41::Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dsv41::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  m.attr("version") = DSV41_VERSION;
  m.def("data_file", &dsv41::data::file, py::arg("relative"),
        "the path of a file of dsv41's built-in data (base/data_dir.h, docs/install.md), e.g. "
        "data_file('golden/oracle/weights.safetensors'); raises dsv41.Error when the data is not found");
  dsv41::python::register_formats(m);
  dsv41::python::register_model(m);
  dsv41::python::register_ops(m);
  dsv41::python::register_conform(m);
  dsv41::python::register_check(m);
  dsv41::python::register_port_writer(m);
}
