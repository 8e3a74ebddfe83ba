// h5/internal/h5_heap_refs.h
//
// The probe worker's check of variable-length strings before libhdf5 reads them
// (h5/h5_probe.h). A stored variable-length string is a length and a global-heap reference
// (the address of a heap collection and an object index); libhdf5 1.10.8 (H5HG_read, the
// collection's parser) takes both on trust, with assertions only: a corrupt index reads past the
// collection's object table, a corrupt object size copies past the string's buffer. Whether that
// crashes depends on what lies past them, so a worker can survive a read that kills the caller's
// process (found by fuzz_report: docs/errors.md, "Fuzzing"): the probe must refuse such a file
// whether or not the worker crashed.
//
// check(dataset): for a dataset stored contiguously whose type is a variable-length string or a
// compound with such members (what dsv41's readers read), reads the stored references from the
// file and checks each non-empty one: the collection lies inside the file, has the signature
// "GCOL", version 1 and a size its objects fit in exactly; the index names one of its objects; the
// object's size is the string's length. Compact and chunked datasets are not checked (dsv41 writes
// its string tables contiguously); nor are attributes (their references sit in object headers).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>

namespace dsv41::h5::internal {

class HeapRefCheck {
 public:
  HeapRefCheck(hid_t file, const char* path);
  ~HeapRefCheck();
  HeapRefCheck(const HeapRefCheck&) = delete;
  HeapRefCheck& operator=(const HeapRefCheck&) = delete;

  // Empty when every reference of dataset `d` is sound (or `d` is not checked); else why not.
  std::string check(hid_t d);

 private:
  // One collection, parsed once: object index -> object size; `bad` says why it is unusable.
  struct Collection {
    std::map<uint32_t, uint64_t> objects;
    std::string bad;
  };
  const Collection& collection(uint64_t addr);
  bool read_at(uint64_t offset, void* buf, uint64_t bytes) const;
  uint64_t number(const unsigned char* p, size_t bytes) const;  // little-endian

  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  size_t sizeof_addr_ = 8;  // the file's address and length widths (its creation properties)
  size_t sizeof_size_ = 8;
  std::map<uint64_t, Collection> collections_;
};

}  // namespace dsv41::h5::internal
