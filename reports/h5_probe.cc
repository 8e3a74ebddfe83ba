#include "reports/h5_probe.h"

#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// Present only in sanitized builds (weak: null otherwise).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
extern "C" void __asan_init() __attribute__((weak));

namespace dsv41::reports::h5 {
namespace {

// What the child tells the parent: the object it is reading, and an error text. One page,
// shared (MAP_SHARED | MAP_ANONYMOUS), written by the child only, read by the parent after the
// child has ended.
struct Shared {
  char where[2048];
  char error[1024];
};

// The child's exit codes.
enum ChildExit : int {
  kOk = 0,
  kCannotOpen = 2,     // the parent's own open says why
  kReadFailed = 3,     // Shared::error says what
  kForeignLink = 4,    // an external or user-defined link
  kSanitizer = 5,      // a sanitizer report in libhdf5 or here
  kOutOfMemory = 6,    // std::bad_alloc in the probe's own buffers
};


void set(char (&dst)[2048], const std::string& s) {
  const size_t n = std::min(s.size(), sizeof(dst) - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}
void set_error(Shared* sh, const std::string& s) {
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
bool read_attribute(hid_t loc, const char* name, Shared* sh, const ProbeLimits& lim) {
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
  Shared* sh;
  const ProbeLimits* lim;
  std::string object;  // the object whose attributes are read
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
  Shared* sh = top->sh;
  VisitState st{sh, top->lim, object_label(name)};
  set(sh->where, "object '" + st.object + "'");
  const hid_t obj = H5Oopen(file, name, H5P_DEFAULT);
  if (obj < 0) {
    set_error(sh, "HDF5 cannot open it");
    return -1;
  }
  hsize_t idx = 0;
  herr_t rc = H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, on_attribute, &st);
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

herr_t on_link(hid_t, const char* name, const LinkInfo* info, void* data) {
  auto* sh = static_cast<Shared*>(data);
  if (info->type == H5L_TYPE_HARD || info->type == H5L_TYPE_SOFT) return 0;
  set(sh->where, "link '/" + std::string(name) + "'");
  set_error(sh, info->type == H5L_TYPE_EXTERNAL ? "an external link (dsv41 reads no other file)"
                                                 : "a user-defined link (dsv41 follows none)");
  return 1;  // stops the visit
}

void die_quietly() { _exit(kSanitizer); }

[[noreturn]] void child_main(const char* path, Shared* sh, const ProbeLimits& lim, bool limit_memory,
                             uint64_t extra_bytes) {
  // The child's crashes are the result, not a report: default actions, no core file, no
  // sanitizer or fuzzer callbacks that would write artifacts, nothing printed.
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGALRM, SIGTERM, SIGINT}) signal(sig, SIG_DFL);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(die_quietly);
  const int devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
  }
  if (limit_memory) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const uint64_t cap = static_cast<uint64_t>(pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) + extra_bytes;
    const rlimit as{cap, cap};
    setrlimit(RLIMIT_AS, &as);
  }
  try {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) _exit(kCannotOpen);
    set(sh->where, "the links");
    const herr_t links = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_link, sh);
    if (links > 0) _exit(kForeignLink);
    if (links < 0) {
      set_error(sh, "HDF5 cannot list them");
      _exit(kReadFailed);
    }
#if H5_VERSION_GE(1, 12, 0)
    VisitState top{sh, &lim, "/"};
    const herr_t objects = H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object, &top, H5O_INFO_BASIC);
#else
    VisitState top{sh, &lim, "/"};
    const herr_t objects = H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, on_object, &top, H5O_INFO_BASIC);
#endif
    if (objects < 0) {
      if (sh->error[0] == '\0') set_error(sh, "HDF5 cannot visit the objects");
      _exit(kReadFailed);
    }
    _exit(kOk);
  } catch (...) {
    _exit(kOutOfMemory);
  }
}

double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double deadline_s(uint64_t file_bytes, const ProbeLimits& lim) {
  if (lim.timeout_s > 0) return lim.timeout_s;
  if (const char* env = std::getenv("DSV41_H5_PROBE_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return 30.0 + static_cast<double>(file_bytes) / 50e6;
}

std::string signal_text(int sig) {
  const char* name = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (name != nullptr ? std::string(", SIG") + name : std::string());
}

// FNV-1a of the file's bytes (of its first and last MiB above 16 MiB): a file rewritten in
// place within one tick of the modification time keeps its other key fields.
uint64_t fingerprint(const std::string& path, off_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const off_t whole = off_t{16} << 20, part = off_t{1} << 20;
  std::vector<unsigned char> buf(static_cast<size_t>(part));
  for (const auto& [from, len] : size <= whole ? std::vector<std::pair<off_t, off_t>>{{0, size}}
                                                : std::vector<std::pair<off_t, off_t>>{{0, part}, {size - part, part}}) {
    off_t done = 0;
    while (done < len) {
      const ssize_t n = pread(fd, buf.data(), static_cast<size_t>(std::min(part, len - done)), from + done);
      if (n <= 0) break;
      for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[static_cast<size_t>(i)]) * 0x100000001b3ull;
      done += n;
    }
  }
  close(fd);
  return h;
}

}  // namespace

ProbeResult probe_file(const std::string& path, const ProbeLimits& lim) {
  const ProbeLimits defaults;
  const bool remember = lim.whole_read_bytes == defaults.whole_read_bytes && lim.slab_bytes == defaults.slab_bytes &&
                        lim.full_read_bytes == defaults.full_read_bytes && lim.timeout_s == defaults.timeout_s;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
  using Key = std::tuple<dev_t, ino_t, off_t, time_t, long, uint64_t>;
  const Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, fingerprint(path, st.st_size)};
  static std::mutex mu;
  static std::set<Key> probed;
  const std::lock_guard<std::mutex> lock(mu);
  if (remember && probed.count(key) != 0) return {};

  void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return {false, std::string("cannot prepare a reading process: ") + std::strerror(errno)};
  auto* sh = new (page) Shared{};
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const bool limit_memory = __asan_init == nullptr;
  const uint64_t extra = (uint64_t{2} << 30) + 8 * size;
  const double limit = deadline_s(size, lim);
  // The child holds the write end of a pipe and never writes: its exit closes it, which wakes
  // the parent's poll at once (no polling delay, no signal of the caller's, such as a fuzzer's
  // alarm, taken over).
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    const int e = errno;
    munmap(page, sizeof(Shared));
    return {false, std::string("cannot prepare a reading process: ") + std::strerror(e)};
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(wake[0]);
    child_main(path.c_str(), sh, lim, limit_memory, extra);
  }
  close(wake[1]);
  if (pid < 0) {
    const int e = errno;
    close(wake[0]);
    munmap(page, sizeof(Shared));
    return {false, std::string("cannot start a reading process: ") + std::strerror(e)};
  }
  const double t0 = now_s();
  bool timed_out = false;
  for (;;) {
    const double left = limit - (now_s() - t0);
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{wake[0], POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min(left * 1000.0 + 1.0, 3.6e6)));
    if (r > 0) break;                       // the child ended (or wrote, which it never does)
    if (r < 0 && errno != EINTR) break;     // cannot wait: fall through to waitpid
  }
  close(wake[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string where = sh->where[0] != '\0' ? std::string(sh->where) : "the file";
  const std::string error = sh->error;
  munmap(page, sizeof(Shared));

  ProbeResult out;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", limit);
  if (timed_out) {
    out = {false, "libhdf5 did not finish reading " + where + " within " + secs +
                      " s (a corrupt or crafted file; DSV41_H5_PROBE_TIMEOUT sets the limit)"};
  } else if (WIFSIGNALED(status)) {
    out = {false, "libhdf5 crashed (" + signal_text(WTERMSIG(status)) + ") reading " + where +
                      ": the file is corrupt or crafted"};
  } else if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case kOk:
      case kCannotOpen: break;
      case kReadFailed: out = {false, where + ": " + error + " (the file is corrupt, or needs more than the reading limit)"}; break;
      case kForeignLink: out = {false, where + " is " + error}; break;
      case kSanitizer: out = {false, "libhdf5 failed a memory-safety check reading " + where + ": the file is corrupt or crafted"}; break;
      case kOutOfMemory: out = {false, "reading " + where + " ran out of memory"}; break;
      default: out = {false, "the reading process ended with code " + std::to_string(WEXITSTATUS(status)) + " at " + where};
    }
  }
  if (out.ok && remember) probed.insert(key);
  return out;
}

}  // namespace dsv41::reports::h5
