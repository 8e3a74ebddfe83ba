// tests/support/h5_attr.h
//
// string_attr(file, name): a string attribute of an HDF5 file's root group ("(missing)" when it has
// none, "(cannot open)", "(not a string)"), as the CLI tests read `forward -o` provenance.
#pragma once

#include <hdf5.h>

#include <string>

namespace dsv41::test {

inline std::string string_attr(const std::string& file, const std::string& name) {
  std::string value = "(missing)";
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return "(cannot open)";
  if (H5Aexists(f, name.c_str()) > 0) {
    const hid_t a = H5Aopen(f, name.c_str(), H5P_DEFAULT);
    const hid_t t = H5Aget_type(a);
    if (H5Tget_class(t) != H5T_STRING) {
      value = "(not a string)";
    } else if (H5Tis_variable_str(t) > 0) {
      char* p = nullptr;
      const hid_t mem = H5Tcopy(H5T_C_S1);
      H5Tset_size(mem, H5T_VARIABLE);
      H5Tset_cset(mem, H5Tget_cset(t));  // HDF5 converts no character sets (dsv41 writes UTF-8)
      if (H5Aread(a, mem, &p) >= 0 && p != nullptr) value = p;
      H5free_memory(p);
      H5Tclose(mem);
    } else {
      std::string buf(H5Tget_size(t) + 1, '\0');
      if (H5Aread(a, t, buf.data()) >= 0) value = buf.c_str();
    }
    H5Tclose(t);
    H5Aclose(a);
  }
  H5Fclose(f);
  return value;
}

}  // namespace dsv41::test
