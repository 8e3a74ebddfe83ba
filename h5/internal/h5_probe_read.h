// h5/internal/h5_probe_read.h
//
// The reading half of h5/h5_probe.h: what the probe's worker process does with one file.
// It runs only in that process, where libhdf5 may crash, hang or be killed; h5/h5_probe.cc
// starts, feeds and watches the worker.
#pragma once

#include <atomic>
#include <cstdint>

#include "h5/h5_probe.h"

namespace dsv41::h5::internal {

// What the worker tells the parent besides its replies: one page (MAP_SHARED | MAP_ANONYMOUS)
// made before the worker is forked, written by the worker only, read by the parent after a
// reply or after the worker ended (so after a crash too).
struct ProbeShared {
  std::atomic<uint64_t> serving{0};  // the id of the request the worker has taken (0: none yet)
  char where[2048];                  // the object being read, for the parent's message
  char error[1024];                  // why a read failed
};

// The verdict of one read: a reply's code, or the worker's exit status when it ended itself.
enum ProbeCode : int {
  kOk = 0,
  kCannotOpen = 2,   // libhdf5 cannot open it: the parent's own open says why
  kReadFailed = 3,   // ProbeShared::error says what
  kForeignLink = 4,  // an external or user-defined link
  kSanitizer = 5,    // a sanitizer report in libhdf5 or here (the worker's exit status)
  kOutOfMemory = 6,  // std::bad_alloc in the probe's own buffers (the worker's exit status)
  kNotHdf5 = 7,      // not an HDF5 file (H5Fis_hdf5)
};

// Checks that `path` is an HDF5 file and opens it read-only (as h5/h5_io.h's open_read_only
// does), refuses external and user-defined links, reads every attribute and
// every dataset of an integer, float or string type as h5/h5_probe.h describes (`lim`), and
// closes the file. Returns kOk, kNotHdf5, kCannotOpen, kReadFailed or kForeignLink; sh->where names the
// object being read, sh->error says what failed. *closed_clean: libhdf5 closed the file and holds
// no open object of any file afterwards, so this process may read another file (a file left
// open would be shared with a later open of the same inode, stale metadata included). Throws
// std::bad_alloc from its own buffers.
int read_file(const char* path, ProbeShared* sh, const ProbeLimits& lim, bool* closed_clean);

}  // namespace dsv41::h5::internal
