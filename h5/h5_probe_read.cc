// h5/h5_probe_read.cc: the probe worker's reading of one file
// (h5/internal/h5_probe_read.h): every attribute and dataset with the readers' memory types.
#include "h5/internal/h5_probe_read.h"

#include "h5/internal/h5_heap_refs.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dsv41::h5::internal {
namespace {

void set(char (&dst)[2048], const std::string& s) {
  const size_t n = std::min(s.size(), sizeof(dst) - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}
void set_error(ProbeShared* sh, const std::string& s) {
  const size_t n = std::min(s.size(), sizeof(sh->error) - 1);
  std::memcpy(sh->error, s.data(), n);
  sh->error[n] = '\0';
}

// The memory type to read a stored type with, or -1 for a class dsv41's readers never read.
// *vlen_strings: the buffer holds char* to free.
hid_t memory_type(hid_t ftype, bool* vlen_strings) {
  *vlen_strings = false;
  switch (H5Tget_class(ftype)) {
    case H5T_INTEGER:
    case H5T_FLOAT:
      return H5Tget_native_type(ftype, H5T_DIR_ASCEND);
    case H5T_STRING: {
      // The memory types of reports/h5_reader.cc: UTF-8 variable-length strings; fixed-length
      // ones of the stored width and character set, null-padded.
      const hid_t m = H5Tcopy(H5T_C_S1);
      if (H5Tis_variable_str(ftype) > 0) {
        H5Tset_size(m, H5T_VARIABLE);
        H5Tset_cset(m, H5T_CSET_UTF8);
        *vlen_strings = true;
      } else {
        H5Tset_size(m, H5Tget_size(ftype));
        H5Tset_cset(m, H5Tget_cset(ftype));
        H5Tset_strpad(m, H5T_STR_NULLPAD);
      }
      return m;
    }
    default:
      return -1;
  }
}

void free_strings(std::vector<unsigned char>& buf, size_t count) {
  std::vector<char*> ptrs(count);
  std::memcpy(ptrs.data(), buf.data(), count * sizeof(char*));
  for (char* p : ptrs) {
    if (p != nullptr) H5free_memory(p);
  }
}

// Reads attribute `name` of `loc` whole.
bool read_attribute(hid_t loc, const char* name, ProbeShared* sh, const ProbeLimits& lim) {
  const hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return false;
  const hid_t ftype = H5Aget_type(a);
  const hid_t space = H5Aget_space(a);
  bool ok = ftype >= 0 && space >= 0;
  bool vlen = false;
  const hid_t mem = ok ? memory_type(ftype, &vlen) : -1;
  if (ok && mem >= 0) {
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    const size_t elem = H5Tget_size(mem);
    ok = n >= 0 && elem > 0;
    if (ok && static_cast<uint64_t>(n) * elem > lim.full_read_bytes) {
      set_error(sh, "an attribute above the reading limit");
      ok = false;
    }
    if (ok && n > 0) {
      std::vector<unsigned char> buf(static_cast<size_t>(n) * elem, 0);
      ok = H5Aread(a, mem, buf.data()) >= 0;
      if (ok && vlen) free_strings(buf, static_cast<size_t>(n));
    }
  }
  if (mem >= 0) H5Tclose(mem);
  if (space >= 0) H5Sclose(space);
  if (ftype >= 0) H5Tclose(ftype);
  H5Aclose(a);
  return ok;
}

// Reads dataset `d` with the memory type `mem`: whole up to lim.whole_read_bytes (H5S_ALL, as
// dsv41's readers read: libhdf5 takes another path than for a slab), else in slabs of at most
// lim.slab_bytes: along the first dimension `split` whose trailing extent fits, every index
// combination of the dimensions before it (an odometer). Above lim.full_read_bytes only the
// first and the last slab are read.
bool read_dataset_as(hid_t d, hid_t space, hid_t mem, bool vlen, const ProbeLimits& lim) {
  const uint64_t slab_bytes = std::max<uint64_t>(lim.slab_bytes, 1);
  const int rank = H5Sget_simple_extent_ndims(space);
  const hssize_t total = H5Sget_simple_extent_npoints(space);
  const size_t elem = H5Tget_size(mem);
  if (rank < 0 || total < 0 || elem == 0) return false;
  if (total == 0) return true;
  if (static_cast<uint64_t>(total) * elem <= lim.whole_read_bytes) {
    std::vector<unsigned char> buf(static_cast<size_t>(total) * elem, 0);
    const bool ok = H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0;
    if (ok && vlen) free_strings(buf, static_cast<size_t>(total));
    return ok;
  }
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const auto at_dim = [](std::vector<hsize_t>& v, int k) -> hsize_t& { return v[static_cast<size_t>(k)]; };
  int split = 0;
  uint64_t trailing = elem;  // bytes of one index of dimension `split`
  for (hsize_t e : dims) trailing *= e;
  for (split = 0; split < rank; ++split) {
    trailing /= at_dim(dims, split);
    if (trailing <= slab_bytes) break;
  }
  if (split == rank) split = rank - 1;
  const hsize_t per = std::max<hsize_t>(1, slab_bytes / std::max<uint64_t>(trailing, 1));
  const bool sampled = static_cast<uint64_t>(total) * elem > lim.full_read_bytes;
  std::vector<hsize_t> start(dims.size(), 0), count(dims);
  for (int k = 0; k < split; ++k) at_dim(count, k) = 1;
  std::vector<unsigned char> buf;
  bool ok = true;
  for (int64_t slab = 0; ok; ++slab) {
    const hsize_t at = at_dim(start, split);
    at_dim(count, split) = std::min<hsize_t>(per, at_dim(dims, split) - at);
    uint64_t n = 1;
    for (hsize_t c : count) n *= c;
    bool last = at + at_dim(count, split) >= at_dim(dims, split);
    for (int k = 0; k < split; ++k) last = last && at_dim(start, k) + 1 >= at_dim(dims, k);
    if (!sampled || slab == 0 || last) {
      buf.assign(static_cast<size_t>(n) * elem, 0);
      const hid_t fs = H5Scopy(space);
      const hid_t ms = H5Screate_simple(rank, count.data(), nullptr);
      ok = fs >= 0 && ms >= 0 &&
           H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) >= 0 &&
           H5Dread(d, mem, ms, fs, H5P_DEFAULT, buf.data()) >= 0;
      if (ok && vlen) free_strings(buf, static_cast<size_t>(n));
      if (ms >= 0) H5Sclose(ms);
      if (fs >= 0) H5Sclose(fs);
    }
    if (last) break;
    // Advance along `split`, then the odometer over the dimensions before it.
    at_dim(start, split) = at + at_dim(count, split);
    if (at_dim(start, split) >= at_dim(dims, split)) {
      at_dim(start, split) = 0;
      for (int k = split - 1; k >= 0; --k) {
        if (++at_dim(start, k) < at_dim(dims, k)) break;
        at_dim(start, k) = 0;
      }
    }
  }
  return ok;
}

// Reads dataset `d` as dsv41's readers do: a number or string dataset whole; a compound table
// one column at a time (a one-member memory compound per integer, float or string member).
bool read_dataset(hid_t d, const ProbeLimits& lim) {
  const hid_t ftype = H5Dget_type(d);
  const hid_t space = H5Dget_space(d);
  bool ok = ftype >= 0 && space >= 0;
  if (ok && H5Tget_class(ftype) == H5T_COMPOUND) {
    const int members = H5Tget_nmembers(ftype);
    ok = members >= 0;
    for (int i = 0; ok && i < members; ++i) {
      const hid_t mt = H5Tget_member_type(ftype, static_cast<unsigned>(i));
      char* name = H5Tget_member_name(ftype, static_cast<unsigned>(i));
      bool vlen = false;
      const hid_t inner = mt >= 0 ? memory_type(mt, &vlen) : -1;
      if (inner >= 0 && name != nullptr) {
        const hid_t mem = H5Tcreate(H5T_COMPOUND, H5Tget_size(inner));
        ok = mem >= 0 && H5Tinsert(mem, name, 0, inner) >= 0 && read_dataset_as(d, space, mem, vlen, lim);
        if (mem >= 0) H5Tclose(mem);
      }
      if (inner >= 0) H5Tclose(inner);
      if (name != nullptr) H5free_memory(name);
      if (mt >= 0) H5Tclose(mt);
    }
  } else if (ok) {
    bool vlen = false;
    const hid_t mem = memory_type(ftype, &vlen);
    if (mem >= 0) {
      ok = read_dataset_as(d, space, mem, vlen, lim);
      H5Tclose(mem);
    }
  }
  if (space >= 0) H5Sclose(space);
  if (ftype >= 0) H5Tclose(ftype);
  return ok;
}

std::string object_label(const char* name) {
  std::string out = "/";
  if (std::strcmp(name, ".") != 0) out += name;
  return out;
}

struct VisitState {
  ProbeShared* sh;
  const ProbeLimits* lim;
  std::string object;     // the object whose attributes are read
  HeapRefCheck* heaps;    // the file's string references, checked before libhdf5 follows them
};

herr_t on_attribute(hid_t loc, const char* name, const H5A_info_t*, void* data) {
  auto* st = static_cast<VisitState*>(data);
  set(st->sh->where, "attribute '" + std::string(name) + "' of '" + st->object + "'");
  if (!read_attribute(loc, name, st->sh, *st->lim)) {
    if (st->sh->error[0] == '\0') set_error(st->sh, "HDF5 cannot read it");
    return -1;
  }
  return 0;
}

#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
using LinkInfo = H5L_info2_t;
#else
using ObjectInfo = H5O_info_t;
using LinkInfo = H5L_info_t;
#endif

herr_t on_object(hid_t file, const char* name, const ObjectInfo* info, void* data) {
  auto* top = static_cast<VisitState*>(data);
  ProbeShared* sh = top->sh;
  VisitState st{sh, top->lim, object_label(name), top->heaps};
  set(sh->where, "object '" + st.object + "'");
  const hid_t obj = H5Oopen(file, name, H5P_DEFAULT);
  if (obj < 0) {
    set_error(sh, "HDF5 cannot open it");
    return -1;
  }
  hsize_t idx = 0;
  herr_t rc = H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, on_attribute, &st);
  // A dataset's stored strings were checked in the first pass (on_object_strings).
  if (rc >= 0 && info->type == H5O_TYPE_DATASET) {
    set(sh->where, "dataset '" + st.object + "'");
    if (!read_dataset(obj, *top->lim)) {
      set_error(sh, "HDF5 cannot read it");
      rc = -1;
    }
  }
  H5Oclose(obj);
  if (rc < 0 && sh->error[0] == '\0') set_error(sh, "HDF5 cannot list its attributes");
  return rc < 0 ? -1 : 0;
}

// The first pass: every dataset's stored strings checked (HeapRefCheck) before libhdf5 reads
// anything through a heap collection. Attributes come first in the second pass, and their strings
// (which dsv41's writer keeps in the same collections as the datasets') cannot be reached through
// libhdf5's API; a collection that only an attribute names is not checked.
herr_t on_object_strings(hid_t file, const char* name, const ObjectInfo* info, void* data) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  auto* top = static_cast<VisitState*>(data);
  ProbeShared* sh = top->sh;
  const std::string object = object_label(name);
  set(sh->where, "dataset '" + object + "'");
  const hid_t obj = H5Oopen(file, name, H5P_DEFAULT);
  if (obj < 0) {
    set_error(sh, "HDF5 cannot open it");
    return -1;
  }
  const std::string corrupt = top->heaps->check(obj);
  H5Oclose(obj);
  if (!corrupt.empty()) {
    set_error(sh, "a corrupt variable-length string, " + corrupt);
    return -1;
  }
  return 0;
}

herr_t on_link(hid_t, const char* name, const LinkInfo* info, void* data) {
  auto* sh = static_cast<ProbeShared*>(data);
  if (info->type == H5L_TYPE_HARD || info->type == H5L_TYPE_SOFT) return 0;
  set(sh->where, "link '/" + std::string(name) + "'");
  set_error(sh, info->type == H5L_TYPE_EXTERNAL ? "an external link (dsv41 reads no other file)"
                                                 : "a user-defined link (dsv41 follows none)");
  return 1;  // stops the visit
}

}  // namespace

int read_file(const char* path, ProbeShared* sh, const ProbeLimits& lim, bool* closed_clean) {
  *closed_clean = false;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (H5Fis_hdf5(path) <= 0) {
    *closed_clean = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0;
    return kNotHdf5;
  }
  const hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    *closed_clean = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0;
    return kCannotOpen;
  }
  int code = kOk;
  set(sh->where, "the links");
  const herr_t links = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_link, sh);
  if (links > 0) {
    code = kForeignLink;
  } else if (links < 0) {
    set_error(sh, "HDF5 cannot list them");
    code = kReadFailed;
  } else {
    HeapRefCheck heaps(file, path);
    VisitState top{sh, &lim, "/", &heaps};
#if H5_VERSION_GE(1, 12, 0)
    herr_t objects = H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object_strings, &top, H5O_INFO_BASIC);
    if (objects >= 0) objects = H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object, &top, H5O_INFO_BASIC);
#else
    herr_t objects = H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object_strings, &top, H5O_INFO_BASIC);
    if (objects >= 0) objects = H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object, &top, H5O_INFO_BASIC);
#endif
    if (objects < 0) {
      if (sh->error[0] == '\0') set_error(sh, "HDF5 cannot visit the objects");
      code = kReadFailed;
    }
  }
  // Closing is part of reading (the readers close what they open): a crash or hang here is the
  // file's too. `where` keeps the object last read unless the file was read cleanly.
  if (code == kOk) set(sh->where, "the file (closing it)");
  const herr_t closed = H5Fclose(file);
  *closed_clean = closed >= 0 && H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0;
  return code;
}

}  // namespace dsv41::h5::internal
