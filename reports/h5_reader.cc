#include "reports/h5_reader.h"

#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "base/error.h"
#include "base/input_file.h"
#include "h5/h5_probe.h"

namespace dsv41::reports {
namespace {

using h5::Handle;
using h5::space_count;
using h5::type_name;
using h5::type_of;

bool is_integer(H5Reader::Type t) { return t == H5Reader::Type::kInt || t == H5Reader::Type::kUInt; }

// Reads `count` strings of the (string) file type `ftype` with `read(mem_type, buffer)`.
template <typename Read>
std::vector<std::string> read_string_values(hid_t ftype, int64_t count, Read read, const std::string& where) {
  std::vector<std::string> out;
  if (count == 0) return out;
  if (H5Tis_variable_str(ftype) > 0) {
    const Handle mem(h5::vlen_utf8(), H5Tclose);
    std::vector<char*> ptrs(static_cast<size_t>(count), nullptr);
    if (read(mem.get(), ptrs.data()) < 0) DSV41_FAIL(where, ": cannot read strings");
    for (char* p : ptrs) {
      out.emplace_back(p == nullptr ? "" : p);
      if (p != nullptr) H5free_memory(p);
    }
  } else {
    const size_t width = H5Tget_size(ftype);
    const Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), width);
    H5Tset_cset(mem.get(), H5Tget_cset(ftype));  // HDF5 converts no character sets
    H5Tset_strpad(mem.get(), H5T_STR_NULLPAD);
    std::vector<char> buf(width * static_cast<size_t>(count) + 1, '\0');
    if (read(mem.get(), buf.data()) < 0) DSV41_FAIL(where, ": cannot read strings");
    for (int64_t i = 0; i < count; ++i) {
      const char* p = buf.data() + static_cast<size_t>(i) * width;
      out.emplace_back(p, strnlen(p, width));
    }
  }
  return out;
}

}  // namespace

H5Reader::H5Reader(std::string path) : path_(std::move(path)) {
  // Read once in the probe's worker process first: libhdf5 itself may crash or hang on a crafted file
  // (h5/h5_probe.h).
  // The input-file policy (base/input_file.h): a path that exists must be a regular file (a FIFO or a
  // device is refused by stat, before anything opens it); a missing one is reported below.
  std::error_code ec;
  if (std::filesystem::exists(path_, ec)) input::require_regular_file(path_, "HDF5 file");
  const h5::ProbeResult probe = h5::probe_file(path_);
  if (!probe.ok) DSV41_FAIL("'", path_, "': refused: ", probe.reason);
  // What the worker could not open is not opened here either (the messages are open_read_only's).
  if (!probe.opens && probe.not_hdf5) DSV41_FAIL("'", path_, "': not an HDF5 file");
  if (!probe.opens) DSV41_FAIL("'", path_, "': cannot open the HDF5 file (truncated or corrupt)");
  h5::OpenFailure why = h5::OpenFailure::kNone;
  file_ = h5::open_read_only(path_, &why);
  switch (why) {
    case h5::OpenFailure::kNone: break;
    case h5::OpenFailure::kNoFile: DSV41_FAIL("'", path_, "': no such file");
    case h5::OpenFailure::kNotHdf5: DSV41_FAIL("'", path_, "': not an HDF5 file");
    case h5::OpenFailure::kCannotOpen: DSV41_FAIL("'", path_, "': cannot open the HDF5 file (truncated or corrupt)");
  }
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

H5Reader::Kind H5Reader::kind(const std::string& object) const {
  if (!h5::path_exists(file_, object)) return Kind::kMissing;
  H5O_info_t info;
#if H5_VERSION_GE(1, 12, 0)
  if (H5Oget_info_by_name3(file_, object.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return Kind::kOther;
#else
  if (H5Oget_info_by_name2(file_, object.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return Kind::kOther;
#endif
  switch (info.type) {
    case H5O_TYPE_GROUP: return Kind::kGroup;
    case H5O_TYPE_DATASET: return Kind::kDataset;
    default: return Kind::kOther;
  }
}

std::vector<std::string> H5Reader::children(const std::string& group) const {
  if (kind(group) != Kind::kGroup) DSV41_FAIL("'", path_, "': group '", group, "' not found");
  const Handle g(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose);
  const std::optional<std::vector<std::string>> names =
      g.ok() ? h5::member_names(g.get()) : std::nullopt;
  if (!names) DSV41_FAIL("'", path_, "': cannot list group '", group, "'");
  return *names;
}

// ---- attributes ----

H5Reader::Type H5Reader::attr_type(const std::string& object, const std::string& name) const {
  if (kind(object) == Kind::kMissing) return Type::kNone;
  if (H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) <= 0) return Type::kNone;
  const Handle a(H5Aopen_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return Type::kNone;
  const Handle t(H5Aget_type(a.get()), H5Tclose);
  return t.ok() ? type_of(t.get()) : Type::kOther;
}

namespace {

// Opens attribute `name` of `object`, checking it exists and has a type accepted by `accept`.
template <typename Accept>
hid_t open_attr(const H5Reader& r, int64_t file, const std::string& object, const std::string& name,
                Accept accept, const char* wanted) {
  const H5Reader::Type t = r.attr_type(object, name);
  if (t == H5Reader::Type::kNone) DSV41_FAIL("'", r.path(), "': ", object, ": attribute '", name, "' not found");
  if (!accept(t)) {
    DSV41_FAIL("'", r.path(), "': ", object, ": attribute '", name, "' is ", type_name(t), ", expected ", wanted);
  }
  const hid_t a = H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) DSV41_FAIL("'", r.path(), "': ", object, ": cannot open attribute '", name, "'");
  return a;
}

}  // namespace

int64_t H5Reader::attr_size(const std::string& object, const std::string& name) const {
  const Handle a(open_attr(*this, file_, object, name, [](Type) { return true; }, "any"), H5Aclose);
  const Handle s(H5Aget_space(a.get()), H5Sclose);
  return space_count(s.get());
}

std::string H5Reader::attr_string(const std::string& object, const std::string& name) const {
  const Handle a(open_attr(*this, file_, object, name, [](Type t) { return t == Type::kString; }, "a string"),
                 H5Aclose);
  const Handle t(H5Aget_type(a.get()), H5Tclose);
  const Handle s(H5Aget_space(a.get()), H5Sclose);
  const std::string where = "'" + path_ + "': " + object + ": attribute '" + name + "'";
  if (space_count(s.get()) != 1) DSV41_FAIL(where, " is not a single string");
  const std::vector<std::string> v = read_string_values(
      t.get(), 1, [&](hid_t mem, void* buf) { return H5Aread(a.get(), mem, buf); }, where);
  return v.at(0);
}

namespace {

template <typename T>
T read_scalar_attr(const H5Reader& r, int64_t file, const std::string& object, const std::string& name,
                   bool allow_float) {
  const Handle a(open_attr(
                     r, file, object, name,
                     [&](H5Reader::Type t) { return is_integer(t) || (allow_float && t == H5Reader::Type::kFloat); },
                     allow_float ? "a number" : "an integer"),
                 H5Aclose);
  const Handle s(H5Aget_space(a.get()), H5Sclose);
  if (space_count(s.get()) != 1) DSV41_FAIL("'", r.path(), "': ", object, ": attribute '", name, "' is not a scalar");
  T v{};
  if (H5Aread(a.get(), h5::native_type<T>(), &v) < 0) {
    DSV41_FAIL("'", r.path(), "': ", object, ": cannot read attribute '", name, "'");
  }
  return v;
}

}  // namespace

int64_t H5Reader::attr_int(const std::string& object, const std::string& name) const {
  return read_scalar_attr<int64_t>(*this, file_, object, name, false);
}
uint64_t H5Reader::attr_uint(const std::string& object, const std::string& name) const {
  return read_scalar_attr<uint64_t>(*this, file_, object, name, false);
}
double H5Reader::attr_double(const std::string& object, const std::string& name) const {
  return read_scalar_attr<double>(*this, file_, object, name, true);
}

std::vector<int64_t> H5Reader::attr_ints(const std::string& object, const std::string& name) const {
  const Handle a(open_attr(*this, file_, object, name, is_integer, "integers"), H5Aclose);
  const Handle s(H5Aget_space(a.get()), H5Sclose);
  const int64_t n = space_count(s.get());
  if (n < 0) DSV41_FAIL("'", path_, "': ", object, ": cannot read attribute '", name, "'");
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (n > 0 && H5Aread(a.get(), h5::native_type<int64_t>(), v.data()) < 0) {
    DSV41_FAIL("'", path_, "': ", object, ": cannot read attribute '", name, "'");
  }
  return v;
}

// ---- datasets ----

H5Reader::DatasetInfo H5Reader::dataset_info(const std::string& path) const {
  if (kind(path) != Kind::kDataset) DSV41_FAIL("'", path_, "': dataset '", path, "' not found");
  const Handle ds(H5Dopen2(file_, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) DSV41_FAIL("'", path_, "': cannot open dataset '", path, "'");
  const Handle t(H5Dget_type(ds.get()), H5Tclose);
  const Handle s(H5Dget_space(ds.get()), H5Sclose);
  if (!t.ok() || !s.ok()) DSV41_FAIL("'", path_, "': cannot read the type of dataset '", path, "'");
  DatasetInfo info;
  info.type = type_of(t.get());
  info.element_bytes = static_cast<int64_t>(H5Tget_size(t.get()));
  const std::optional<std::vector<int64_t>> dims = h5::space_dims(s.get());
  if (!dims) DSV41_FAIL("'", path_, "': cannot read the shape of dataset '", path, "'");
  info.dims = *dims;
  if (info.type == Type::kCompound) {
    const int n = H5Tget_nmembers(t.get());
    for (int i = 0; i < n; ++i) {
      char* name = H5Tget_member_name(t.get(), static_cast<unsigned>(i));
      const Handle mt(H5Tget_member_type(t.get(), static_cast<unsigned>(i)), H5Tclose);
      info.fields.emplace_back(name == nullptr ? "" : name, mt.ok() ? type_of(mt.get()) : Type::kOther);
      if (name != nullptr) H5free_memory(name);
    }
  }
  return info;
}

namespace {

// An open dataset with its type, space and element count.
struct OpenDataset {
  Handle ds{-1, H5Dclose};
  Handle type{-1, H5Tclose};
  Handle space{-1, H5Sclose};
  int64_t count = 0;
};

// Opens `path`, checking its type class with `accept`.
template <typename Accept>
void open_dataset(const H5Reader& r, int64_t file, const std::string& path, Accept accept, const char* wanted,
                  OpenDataset& out) {
  const H5Reader::DatasetInfo info = r.dataset_info(path);
  if (!accept(info.type)) {
    DSV41_FAIL("'", r.path(), "': dataset '", path, "' holds ", type_name(info.type), ", expected ", wanted);
  }
  out.ds.reset(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
  out.type.reset(H5Dget_type(out.ds.get()));
  out.space.reset(H5Dget_space(out.ds.get()));
  out.count = space_count(out.space.get());
  if (!out.ds.ok() || !out.type.ok() || out.count < 0) DSV41_FAIL("'", r.path(), "': cannot open dataset '", path, "'");
  // Sizes checked before reading (issue 35): a dataset read whole takes up to 8 bytes an element in
  // memory (int64 / double; a chunked dataset of 2^40 elements may sit in a small file).
  const std::string what = "'" + r.path() + "': dataset '" + path + "' (" + std::to_string(out.count) + " elements)";
  input::check_memory(input::checked_mul(static_cast<uint64_t>(out.count), 8, what), what);
}

template <typename T>
std::vector<T> read_numbers(const H5Reader& r, int64_t file, const std::string& path, bool allow_float) {
  OpenDataset d;
  open_dataset(
      r, file, path, [&](H5Reader::Type t) { return is_integer(t) || (allow_float && t == H5Reader::Type::kFloat); },
      allow_float ? "numbers" : "integers", d);
  std::vector<T> v(static_cast<size_t>(d.count));
  if (d.count > 0 && H5Dread(d.ds.get(), h5::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
    DSV41_FAIL("'", r.path(), "': cannot read dataset '", path, "'");
  }
  return v;
}

}  // namespace

std::vector<std::string> H5Reader::read_strings(const std::string& path) const {
  OpenDataset d;
  open_dataset(*this, file_, path, [](Type t) { return t == Type::kString; }, "strings", d);
  return read_string_values(
      d.type.get(), d.count,
      [&](hid_t mem, void* buf) { return H5Dread(d.ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf); },
      "'" + path_ + "': dataset '" + path + "'");
}

std::vector<int64_t> H5Reader::read_ints(const std::string& path) const {
  return read_numbers<int64_t>(*this, file_, path, false);
}
std::vector<uint64_t> H5Reader::read_uints(const std::string& path) const {
  return read_numbers<uint64_t>(*this, file_, path, false);
}
std::vector<uint16_t> H5Reader::read_u16(const std::string& path) const {
  return read_numbers<uint16_t>(*this, file_, path, false);
}
std::vector<double> H5Reader::read_doubles(const std::string& path) const {
  return read_numbers<double>(*this, file_, path, true);
}
std::vector<float> H5Reader::read_floats(const std::string& path) const {
  return read_numbers<float>(*this, file_, path, true);
}

// ---- compound members ----

namespace {

// Opens a 1-D compound dataset and returns the type of member `field` (a handle to close).
hid_t open_field(const H5Reader& r, int64_t file, const std::string& path, const std::string& field,
                 OpenDataset& d) {
  open_dataset(r, file, path, [](H5Reader::Type t) { return t == H5Reader::Type::kCompound; }, "a compound table", d);
  const int idx = H5Tget_member_index(d.type.get(), field.c_str());
  if (idx < 0) DSV41_FAIL("'", r.path(), "': table '", path, "' has no column '", field, "'");
  return H5Tget_member_type(d.type.get(), static_cast<unsigned>(idx));
}

template <typename T>
std::vector<T> read_number_field(const H5Reader& r, int64_t file, const std::string& path, const std::string& field,
                                 bool allow_float) {
  OpenDataset d;
  const Handle ft(open_field(r, file, path, field, d), H5Tclose);
  const H5Reader::Type t = type_of(ft.get());
  if (!(is_integer(t) || (allow_float && t == H5Reader::Type::kFloat))) {
    DSV41_FAIL("'", r.path(), "': table '", path, "': column '", field, "' holds ", type_name(t), ", expected ",
               allow_float ? "numbers" : "integers");
  }
  const Handle mem(H5Tcreate(H5T_COMPOUND, sizeof(T)), H5Tclose);
  H5Tinsert(mem.get(), field.c_str(), 0, h5::native_type<T>());
  std::vector<T> v(static_cast<size_t>(d.count));
  if (d.count > 0 && H5Dread(d.ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
    DSV41_FAIL("'", r.path(), "': table '", path, "': cannot read column '", field, "'");
  }
  return v;
}

}  // namespace

std::vector<std::string> H5Reader::read_field_strings(const std::string& path, const std::string& field) const {
  OpenDataset d;
  const Handle ft(open_field(*this, file_, path, field, d), H5Tclose);
  if (type_of(ft.get()) != Type::kString) {
    DSV41_FAIL("'", path_, "': table '", path, "': column '", field, "' holds ", type_name(type_of(ft.get())),
               ", expected strings");
  }
  const std::string where = "'" + path_ + "': table '" + path + "': column '" + field + "'";
  return read_string_values(
      ft.get(), d.count,
      [&](hid_t mem_str, void* buf) {
        const size_t width = H5Tget_size(mem_str);
        const Handle mem(H5Tcreate(H5T_COMPOUND, width), H5Tclose);
        H5Tinsert(mem.get(), field.c_str(), 0, mem_str);
        return H5Dread(d.ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
      },
      where);
}

std::vector<int64_t> H5Reader::read_field_ints(const std::string& path, const std::string& field) const {
  return read_number_field<int64_t>(*this, file_, path, field, false);
}
std::vector<double> H5Reader::read_field_doubles(const std::string& path, const std::string& field) const {
  return read_number_field<double>(*this, file_, path, field, true);
}

}  // namespace dsv41::reports
