// h5/h5_heap_refs.cc: the probe worker's check of stored variable-length string references
// (h5/internal/h5_heap_refs.h), after the HDF5 file format's "Global Heap" and
// "Variable-length" encodings: a stored string is its length (4 bytes), the collection's address
// (sizeof_addr bytes) and the object's index (4 bytes); a collection is "GCOL", version 1, three
// reserved bytes, its size (sizeof_size bytes), then objects: index (2), reference count (2),
// reserved (4), size (sizeof_size), the bytes padded to 8; index 0 is the free space, last.
#include "h5/internal/h5_heap_refs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace dsv41::h5::internal {
namespace {

uint64_t align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Offsets, within one element as stored in the file, of the variable-length strings of `t` (the
// type H5Dget_type returns: in memory layout, a variable-length string a char*), given the stored
// width of one; *elem_bytes: the stored element's size. False: a type not checked here (nested
// compounds, arrays and sequences: dsv41's readers read none).
bool stored_strings(hid_t t, size_t vlen_bytes, std::vector<size_t>* offsets, size_t* elem_bytes) {
  const H5T_class_t cls = H5Tget_class(t);
  if (cls == H5T_STRING && H5Tis_variable_str(t) > 0) {
    offsets->push_back(0);
    *elem_bytes = vlen_bytes;
    return true;
  }
  if (cls != H5T_COMPOUND) return false;
  const int n = H5Tget_nmembers(t);
  if (n < 0) return false;
  std::vector<std::pair<size_t, int>> by_offset;  // libhdf5 lays members out in offset order
  for (int i = 0; i < n; ++i) by_offset.emplace_back(H5Tget_member_offset(t, static_cast<unsigned>(i)), i);
  std::sort(by_offset.begin(), by_offset.end());
  size_t shift = 0;  // stored offset - memory offset, so far
  for (const auto& [offset, i] : by_offset) {
    const hid_t mt = H5Tget_member_type(t, static_cast<unsigned>(i));
    if (mt < 0) return false;
    const H5T_class_t mc = H5Tget_class(mt);
    const bool vlen = mc == H5T_STRING && H5Tis_variable_str(mt) > 0;
    H5Tclose(mt);
    if (mc == H5T_COMPOUND || mc == H5T_ARRAY || mc == H5T_VLEN) return false;
    if (vlen) {
      offsets->push_back(offset + shift);
      shift += vlen_bytes - sizeof(char*);
    }
  }
  *elem_bytes = H5Tget_size(t) + shift;
  return true;
}

}  // namespace

HeapRefCheck::HeapRefCheck(hid_t file, const char* path) : fd_(open(path, O_RDONLY | O_CLOEXEC)) {
  struct stat st {};
  if (fd_ >= 0 && fstat(fd_, &st) == 0) file_bytes_ = static_cast<uint64_t>(st.st_size);
  const hid_t fcpl = H5Fget_create_plist(file);
  if (fcpl >= 0) {
    H5Pget_sizes(fcpl, &sizeof_addr_, &sizeof_size_);
    H5Pclose(fcpl);
  }
}

HeapRefCheck::~HeapRefCheck() {
  if (fd_ >= 0) close(fd_);
}

bool HeapRefCheck::read_at(uint64_t offset, void* buf, uint64_t bytes) const {
  if (fd_ < 0 || offset > file_bytes_ || bytes > file_bytes_ - offset) return false;
  auto* out = static_cast<unsigned char*>(buf);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd_, out + done, static_cast<size_t>(bytes - done), static_cast<off_t>(offset + done));
    if (n <= 0) return false;
    done += static_cast<uint64_t>(n);
  }
  return true;
}

uint64_t HeapRefCheck::number(const unsigned char* p, size_t bytes) const {
  uint64_t v = 0;
  for (size_t i = std::min<size_t>(bytes, 8); i-- > 0;) v = (v << 8) | p[i];
  return v;
}

const HeapRefCheck::Collection& HeapRefCheck::collection(uint64_t addr) {
  const auto found = collections_.find(addr);
  if (found != collections_.end()) return found->second;
  Collection& c = collections_[addr];
  const uint64_t header = align8(8 + sizeof_size_);
  std::vector<unsigned char> head(static_cast<size_t>(header));
  if (!read_at(addr, head.data(), header)) {
    c.bad = "its heap collection lies outside the file";
    return c;
  }
  if (std::memcmp(head.data(), "GCOL", 4) != 0 || head[4] != 1) {
    c.bad = "its heap collection has no valid signature";
    return c;
  }
  const uint64_t size = number(head.data() + 8, sizeof_size_);
  if (size < header || size > file_bytes_) {
    c.bad = "its heap collection's size is corrupt";
    return c;
  }
  std::vector<unsigned char> image(static_cast<size_t>(size));
  if (!read_at(addr, image.data(), size)) {
    c.bad = "its heap collection lies outside the file";
    return c;
  }
  // The walk libhdf5 makes when it loads the collection (H5HG's deserialize, 1.10): object after
  // object up to the collection's end, the free space (index 0) included and not necessarily
  // last; a tail shorter than an object header is free space. libhdf5 only asserts that each
  // object ends inside the collection; an object that does not (a corrupt size, or a size grown
  // past the free space) makes it read past its buffer, and one of size 0 makes it loop. Such a
  // collection is refused whole, whichever of its objects a string names.
  const uint64_t object_header = 8 + sizeof_size_;
  for (uint64_t p = header; p < size;) {
    if (size - p < object_header) break;  // libhdf5: free space
    const auto idx = static_cast<uint32_t>(number(image.data() + p, 2));
    const uint64_t bytes = number(image.data() + p + 8, sizeof_size_);
    // What libhdf5 steps over: an object's header and its bytes padded to 8; the free space's
    // size counts its header.
    const uint64_t need = idx > 0 ? (bytes > size ? size + 1 : object_header + align8(bytes)) : bytes;
    if (need > size - p) {
      c.bad = "an object of its heap collection overruns it";
      return c;
    }
    if (need == 0) {
      c.bad = "its heap collection's free space has size 0";
      return c;
    }
    if (idx > 0) c.objects[idx] = bytes;
    p += need;
  }
  return c;
}

std::string HeapRefCheck::check(hid_t d) {
  const haddr_t at = H5Dget_offset(d);
  if (at == HADDR_UNDEF) return {};  // compact, chunked or never written
  const hid_t type = H5Dget_type(d), space = H5Dget_space(d);
  std::vector<size_t> offsets;
  size_t elem = 0;
  const size_t vlen_bytes = 4 + sizeof_addr_ + 4;
  const bool checked = type >= 0 && stored_strings(type, vlen_bytes, &offsets, &elem);
  const hssize_t count = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  if (!checked || offsets.empty() || count <= 0 || elem == 0) return {};
  const uint64_t stored = H5Dget_storage_size(d);
  if (stored / elem < static_cast<uint64_t>(count)) return {};  // not a layout known here
  // In blocks of elements, so that a large table needs no buffer of its whole size.
  const uint64_t per_block = std::max<uint64_t>(1, (uint64_t{1} << 20) / elem);
  std::vector<unsigned char> buf;
  for (uint64_t first = 0; first < static_cast<uint64_t>(count); first += per_block) {
    const uint64_t n = std::min<uint64_t>(per_block, static_cast<uint64_t>(count) - first);
    buf.resize(static_cast<size_t>(n * elem));
    if (!read_at(at + first * elem, buf.data(), n * elem)) return "its data lies outside the file";
    for (uint64_t e = 0; e < n; ++e) {
      for (size_t off : offsets) {
        const unsigned char* ref = buf.data() + e * elem + off;
        const uint64_t length = number(ref, 4);
        const uint64_t addr = number(ref + 4, sizeof_addr_);
        const auto idx = static_cast<uint32_t>(number(ref + 4 + sizeof_addr_, 4));
        if (addr == 0) continue;  // a null string
        const std::string element = "element " + std::to_string(first + e) + ": ";
        const Collection& c = collection(addr);
        if (!c.bad.empty()) return element + c.bad;
        const auto object = c.objects.find(idx);
        if (object == c.objects.end()) return element + "its heap object index is not in its collection";
        if (object->second != length) return element + "its length differs from its heap object's";
      }
    }
  }
  return {};
}

}  // namespace dsv41::h5::internal
