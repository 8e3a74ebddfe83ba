#include "reports/h5_writer.h"

#include <hdf5.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <type_traits>

#include "base/error.h"
#include "base/output_file.h"

namespace dsv41::reports {
namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : path) {
    if (ch == '/') {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

}  // namespace

H5Writer::H5Writer(std::string path, const std::string& what)
    : path_(std::move(path)), out_(std::make_unique<output::AtomicOutput>(path_, what)) {
  tmp_path_ = out_->temp_path();  // created empty and exclusively; HDF5 truncates and fills it
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  H5Pset_obj_track_times(fcpl, false);  // the root group: no timestamps
  file_ = H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
  H5Pclose(fcpl);
  H5Pclose(fapl);
  if (file_ < 0) DSV41_FAIL("cannot create HDF5 file '", tmp_path_, "' (for '", path_, "')");
  gcpl_ = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(gcpl_, false);
}

H5Writer::~H5Writer() {
  if (gcpl_ >= 0) H5Pclose(gcpl_);
  if (!committed_) abandon();  // out_ then removes the temp file
}

// A file that will not be committed (an error, or a writer destroyed early) is closed without
// writing to disk: libhdf5 flushes its caches when it closes a file, and when that flush fails
// (a full disk, a file-size limit) H5Fclose fails and leaves the file's id behind, pointing at a
// freed file; libhdf5's cleanup at exit then crashed on it (issue 35). So the file's descriptor
// is first pointed at an anonymous memory file (memfd; only the pages still flushed occupy
// memory, for the instant of the close), then every object id of the file is closed, then the
// file: nothing stays open in libhdf5, whatever the disk did.
void H5Writer::abandon() {
  if (file_ < 0) return;
  void* handle = nullptr;
  if (H5Fget_vfd_handle(static_cast<hid_t>(file_), H5P_DEFAULT, &handle) >= 0 && handle != nullptr) {
    const int fd = *static_cast<int*>(handle);  // the sec2 driver's descriptor
    const int sink = static_cast<int>(::syscall(SYS_memfd_create, "dsv41-discarded-h5", 0u));
    if (sink >= 0) {
      ::dup2(sink, fd);  // fd now names the memory file; the temp file is removed by out_
      ::close(sink);
    }
  }
  // A file-size limit (ulimit -f, RLIMIT_FSIZE) binds the memory file too: the soft limit is
  // lifted to the hard one for the close (the memory file is no file on disk), then restored.
  struct rlimit fsize {};
  const bool limited = ::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != fsize.rlim_max;
  if (limited) {
    const struct rlimit lifted = {fsize.rlim_max, fsize.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &lifted);
  }
  const hid_t f = static_cast<hid_t>(file_);
  const ssize_t n = H5Fget_obj_count(f, H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR | H5F_OBJ_LOCAL);
  if (n > 0) {
    std::vector<hid_t> ids(static_cast<size_t>(n));
    const ssize_t got = H5Fget_obj_ids(f, H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR | H5F_OBJ_LOCAL,
                                       static_cast<size_t>(n), ids.data());
    for (ssize_t i = 0; i < got; ++i) {
      while (H5Iis_valid(ids[static_cast<size_t>(i)]) > 0 && H5Idec_ref(ids[static_cast<size_t>(i)]) > 0) {
      }
    }
  }
  H5Fclose(f);
  file_ = -1;
  if (limited) ::setrlimit(RLIMIT_FSIZE, &fsize);
}

// A failed HDF5 call: every id of the file closed now (abandon), not at the writer's end (a
// Python DumpWriter may live on until the interpreter exits, after libhdf5's own cleanup).
void H5Writer::fail(const std::string& why) {
  abandon();
  failed_ = true;
  DSV41_FAIL("'", path_, "': ", why, "; '", path_, "' is left as it was");
}

void H5Writer::ensure_parent_groups(const std::string& path) {
  const std::vector<std::string> parts = split_path(path);
  std::string cur;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    cur += "/" + parts[i];
    if (H5Lexists(file_, cur.c_str(), H5P_DEFAULT) > 0) continue;
    const hid_t g = H5Gcreate2(file_, cur.c_str(), H5P_DEFAULT, gcpl_, H5P_DEFAULT);
    if (g < 0) fail("cannot create group '" + cur + "'");
    H5Gclose(g);
  }
}

void H5Writer::write_raw(const std::string& path, const void* data, int64_t type, size_t elem,
                         const std::vector<int64_t>& shape, size_t count) {
  write_typed(path, data, type, type, elem, shape, count);
}

void H5Writer::write_typed(const std::string& path, const void* data, int64_t mem_type, int64_t file_type,
                           size_t elem, const std::vector<int64_t>& shape, size_t count) {
  DSV41_CHECK(!committed_, "'", path_, "': write after commit");
  DSV41_CHECK(file_ >= 0, "'", path_, "': write after a failure");
  int64_t n = 1;
  std::vector<hsize_t> dims;
  for (int64_t s : shape) {
    DSV41_CHECK(s >= 0, "'", path_, "': negative dimension for '", path, "'");
    dims.push_back(static_cast<hsize_t>(s));
    n *= s;
  }
  DSV41_CHECK(static_cast<size_t>(n) == count, "'", path_, "': dataset '", path, "' has ", count,
              " values for a shape of ", n);
  ensure_parent_groups(path);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl, false);
  if (count > 0 && count * elem > compress_above_ && !dims.empty()) {
    std::vector<hsize_t> chunk = dims;
    // Chunks of about 256 KiB along the first dimension.
    hsize_t row = elem;
    for (size_t i = 1; i < chunk.size(); ++i) row *= chunk[i];
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (256 * 1024) / std::max<hsize_t>(row, 1)));
    H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 4);
  }
  const hid_t ds = H5Dcreate2(file_, path.c_str(), static_cast<hid_t>(file_type), space, H5P_DEFAULT, dcpl,
                              H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (ds < 0) fail("cannot create dataset '" + path + "' (exists already?)");
  const herr_t rc =
      count == 0 ? 0 : H5Dwrite(ds, static_cast<hid_t>(mem_type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  const herr_t closed = H5Dclose(ds);
  if (rc < 0 || closed < 0) fail("writing dataset '" + path + "' failed (disk full or a file-size limit?)");
}

template <typename T>
void H5Writer::write_numbers(const std::string& path, const std::vector<T>& data, const std::vector<int64_t>& shape) {
  write_raw(path, data.data(), h5::native_type<T>(), sizeof(T), shape, data.size());
}

void H5Writer::write(const std::string& p, const std::vector<float>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<double>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<int32_t>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<int64_t>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<uint8_t>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<uint16_t>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}
void H5Writer::write(const std::string& p, const std::vector<uint64_t>& d, const std::vector<int64_t>& s) {
  write_numbers(p, d, s);
}

void H5Writer::write_strings(const std::string& path, const std::vector<std::string>& data) {
  std::vector<const char*> ptrs;
  for (const std::string& s : data) ptrs.push_back(s.c_str());
  const h5::Handle type(h5::vlen_utf8(), H5Tclose);
  write_raw(path, ptrs.data(), type.get(), sizeof(char*), {static_cast<int64_t>(data.size())}, data.size());
}

void H5Writer::write_fixed_strings(const std::string& path, const std::vector<std::string>& data) {
  size_t width = 1;
  for (const std::string& s : data) width = std::max(width, s.size());
  std::vector<char> buf(width * std::max<size_t>(1, data.size()), '\0');
  for (size_t i = 0; i < data.size(); ++i) std::memcpy(buf.data() + i * width, data[i].data(), data[i].size());
  const h5::Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), width);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  write_raw(path, buf.data(), type.get(), width, {static_cast<int64_t>(data.size())}, data.size());
}

void H5Writer::write_columns(const std::string& group, const std::vector<TableColumn>& columns) {
  for (const TableColumn& c : columns) {
    DSV41_CHECK(c.size() == columns.front().size(), "'", path_, "': table '", group, "': column '", c.name,
                "' has ", c.size(), " rows, column '", columns.front().name, "' ", columns.front().size());
    const std::string p = group + "/" + c.name;
    const std::vector<int64_t> shape = {static_cast<int64_t>(c.size())};
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<std::string>>) {
            write_fixed_strings(p, v);  // fixed width: compresses (a table repeats its strings)
          } else {
            write(p, v, shape);
          }
        },
        c.values);
  }
  if (columns.empty()) ensure_parent_groups(group + "/x");
}

void H5Writer::write_table(const std::string& path, const std::vector<TableColumn>& columns) {
  DSV41_CHECK(!columns.empty(), "'", path_, "': table '", path, "' has no columns");
  const size_t rows = columns.front().size();
  // The in-memory row: each member at its natural alignment.
  std::vector<size_t> offsets;
  std::deque<h5::Handle> types;  // the members' memory types
  size_t size = 0;
  for (const TableColumn& c : columns) {
    DSV41_CHECK(c.size() == rows, "'", path_, "': table '", path, "': column '", c.name, "' has ", c.size(),
                " rows, column '", columns.front().name, "' ", rows);
    const auto [type, width] = std::visit(
        [](const auto& v) -> std::pair<hid_t, size_t> {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<std::string>>) {
            return {h5::vlen_utf8(), sizeof(char*)};
          } else {
            using T = typename V::value_type;
            return {H5Tcopy(h5::native_type<T>()), sizeof(T)};
          }
        },
        c.values);
    size = (size + width - 1) / width * width;
    offsets.push_back(size);
    types.emplace_back(type, H5Tclose);
    size += width;
  }
  size = (size + 7) / 8 * 8;
  const h5::Handle mem(H5Tcreate(H5T_COMPOUND, size), H5Tclose);
  for (size_t i = 0; i < columns.size(); ++i) {
    H5Tinsert(mem.get(), columns[i].name.c_str(), offsets[i], types[i].get());
  }
  const h5::Handle file(H5Tcopy(mem.get()), H5Tclose);
  H5Tpack(file.get());
  std::vector<unsigned char> buf(rows * size);
  for (size_t i = 0; i < columns.size(); ++i) {
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          for (size_t r = 0; r < rows; ++r) {
            unsigned char* at = buf.data() + r * size + offsets[i];
            if constexpr (std::is_same_v<V, std::vector<std::string>>) {
              const char* p = v[r].c_str();
              std::memcpy(at, &p, sizeof p);
            } else {
              std::memcpy(at, &v[r], sizeof v[r]);
            }
          }
        },
        columns[i].values);
  }
  write_typed(path, buf.data(), mem.get(), file.get(), size, {static_cast<int64_t>(rows)}, rows);
}

void H5Writer::group(const std::string& path) {
  DSV41_CHECK(!committed_, "'", path_, "': write after commit");
  ensure_parent_groups(path + "/x");
}

int64_t H5Writer::open_object(const std::string& path) {
  if (path != "/" && H5Lexists(file_, path.c_str(), H5P_DEFAULT) <= 0) {
    ensure_parent_groups(path + "/x");
  }
  const hid_t obj = H5Oopen(file_, path.c_str(), H5P_DEFAULT);
  if (obj < 0) fail("cannot open object '" + path + "' for an attribute");
  return obj;
}

// Every string attribute is variable-length UTF-8: h5py reads it as str (a fixed-length one comes
// back as bytes), in every file dsv41 writes (docs/report-schema.md, docs/forward-output.md).
void H5Writer::attr(const std::string& object_path, const std::string& name, const std::string& value) {
  text_attr(object_path, name, value);
}

void H5Writer::text_attr(const std::string& object_path, const std::string& name, const std::string& value) {
  const h5::Handle type(h5::vlen_utf8(), H5Tclose);
  const char* p = value.c_str();
  scalar_attr(object_path, name, type.get(), &p);
}

void H5Writer::scalar_attr(const std::string& object_path, const std::string& name, int64_t type,
                           const void* value) {
  const hid_t obj = static_cast<hid_t>(open_object(object_path));
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(obj, name.c_str(), static_cast<hid_t>(type), space, H5P_DEFAULT, H5P_DEFAULT);
  const herr_t rc = a < 0 ? -1 : H5Awrite(a, static_cast<hid_t>(type), value);
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  H5Oclose(obj);
  if (rc < 0) fail("cannot write attribute '" + name + "' on '" + object_path + "'");
}

void H5Writer::attr(const std::string& object_path, const std::string& name, int64_t value) {
  scalar_attr(object_path, name, h5::native_type<int64_t>(), &value);
}
void H5Writer::attr(const std::string& object_path, const std::string& name, double value) {
  scalar_attr(object_path, name, h5::native_type<double>(), &value);
}
void H5Writer::attr(const std::string& object_path, const std::string& name, uint64_t value) {
  scalar_attr(object_path, name, h5::native_type<uint64_t>(), &value);
}

void H5Writer::attr(const std::string& object_path, const std::string& name, const std::vector<int64_t>& value) {
  const hid_t obj = static_cast<hid_t>(open_object(object_path));
  const hsize_t n = value.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t a = H5Acreate2(obj, name.c_str(), h5::native_type<int64_t>(), space, H5P_DEFAULT, H5P_DEFAULT);
  const herr_t rc = a < 0 ? -1 : (n == 0 ? 0 : H5Awrite(a, h5::native_type<int64_t>(), value.data()));
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  H5Oclose(obj);
  if (rc < 0) fail("cannot write attribute '" + name + "' on '" + object_path + "'");
}

void H5Writer::close_file() {
  DSV41_CHECK(!committed_, "'", path_, "': closed after commit");
  if (file_ < 0) return;  // closed already
  // Flushed first: a failure here leaves the file open, and abandon() closes it without the disk.
  if (H5Fflush(static_cast<hid_t>(file_), H5F_SCOPE_GLOBAL) < 0) {
    abandon();
    failed_ = true;
    DSV41_FAIL("'", path_, "': writing the HDF5 file failed (disk full or a file-size limit?); '", path_,
               "' is left as it was");
  }
  // After a complete flush (its truncate included) the close writes nothing more. (Were it to
  // fail, its id could not be touched again: libhdf5 has freed the file behind it.)
  const bool closed = H5Fclose(static_cast<hid_t>(file_)) >= 0;
  file_ = -1;
  if (!closed) {
    failed_ = true;
    DSV41_FAIL("'", path_, "': closing the HDF5 file failed; '", path_, "' is left as it was");
  }
}

void H5Writer::commit() {
  DSV41_CHECK(!committed_, "'", path_, "': committed twice");
  DSV41_CHECK(!failed_, "'", path_, "': commit after a failure");
  close_file();
  out_->commit();  // fsync, rename (only over a regular file), directory fsync
  committed_ = true;
}

}  // namespace dsv41::reports
