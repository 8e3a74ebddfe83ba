#include "golden/golden_io.h"

#include <hdf5.h>

#include "base/error.h"
#include "h5/h5_io.h"

namespace dsv41::golden {

H5File::H5File(const std::string& path) : path_(path) {
  h5::OpenFailure why = h5::OpenFailure::kNone;
  id_ = h5::open_read_only(path, &why);
  DSV41_CHECK(why != h5::OpenFailure::kNoFile, "golden file not found: ", path,
              " (regenerate with scripts/extract_golden.py)");
  DSV41_CHECK(why != h5::OpenFailure::kNotHdf5, "not an HDF5 file: ", path);
  DSV41_CHECK(id_ >= 0, "cannot open HDF5 file ", path);
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

bool H5File::has(const std::string& name) const { return h5::path_exists(id_, name); }

std::vector<std::string> H5File::children(const std::string& group) const {
  DSV41_CHECK(has(group), path_, ": group '", group, "' not found");
  const h5::QuietErrors quiet;
  const h5::Handle g(H5Gopen2(id_, group.c_str(), H5P_DEFAULT), H5Gclose);
  DSV41_CHECK(g.ok(), path_, ": '", group, "' is not a group");
  const std::optional<std::vector<std::string>> names = h5::member_names(g.get());
  DSV41_CHECK(names.has_value(), path_, ": cannot list group '", group, "'");
  return *names;
}

template <typename T>
Array<T> H5File::read(const std::string& name, int rank) const {
  DSV41_CHECK(has(name), path_, ": dataset '", name, "' not found");
  const h5::QuietErrors quiet;
  const h5::Handle ds(H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose);
  DSV41_CHECK(ds.ok(), path_, ": '", name, "' is not a dataset");
  const h5::Handle type(H5Dget_type(ds.get()), H5Tclose);
  const h5::Type stored = h5::type_of(type.get());
  const size_t bytes = H5Tget_size(type.get());
  DSV41_CHECK(stored == h5::type_class<T>() && bytes == sizeof(T), path_, ": dataset '", name, "' holds ",
              h5::dtype_name(stored, bytes), ", expected ", h5::dtype_name(h5::type_class<T>(), sizeof(T)));
  const h5::Handle space(H5Dget_space(ds.get()), H5Sclose);
  const std::optional<std::vector<int64_t>> dims = h5::space_dims(space.get());
  DSV41_CHECK(dims.has_value(), path_, ": cannot read the shape of dataset '", name, "'");
  const int ndims = static_cast<int>(dims->size());
  DSV41_CHECK(rank < 0 || ndims == rank, path_, ": dataset '", name, "' has rank ", ndims,
              ", expected ", rank);
  Array<T> out;
  out.shape = *dims;
  size_t count = 1;
  for (const int64_t d : out.shape) count *= static_cast<size_t>(d);
  out.data.resize(count);
  if (count > 0) {
    DSV41_CHECK(H5Dread(ds.get(), h5::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        out.data.data()) >= 0,
                path_, ": cannot read dataset '", name, "'");
  }
  return out;
}

template Array<uint8_t> H5File::read<uint8_t>(const std::string&, int) const;
template Array<uint16_t> H5File::read<uint16_t>(const std::string&, int) const;
template Array<int32_t> H5File::read<int32_t>(const std::string&, int) const;
template Array<int64_t> H5File::read<int64_t>(const std::string&, int) const;
template Array<float> H5File::read<float>(const std::string&, int) const;

}  // namespace dsv41::golden
