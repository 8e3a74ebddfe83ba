// base/input_file.cc: the input-file policy (base/input_file.h).
#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace dsv41::input {

std::string file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

std::string bytes_text(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

InputFile::InputFile(int fd, uint64_t size, std::string path, std::string what)
    : fd_(fd), size_(size), path_(std::move(path)), what_(std::move(what)) {}

InputFile::InputFile(InputFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), size_(o.size_), path_(std::move(o.path_)), what_(std::move(o.what_)) {}

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile InputFile::open(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO for reading blocks until a writer comes; with it the open returns
  // at once and fstat says what the path is. A directory opens read-only too, and is refused below.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    DSV41_FAIL(what, " '", path, "': cannot open (", std::strerror(err), ")");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DSV41_FAIL(what, " '", path, "': cannot stat (", std::strerror(err), ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    DSV41_FAIL(what, " '", path, "': is ", file_type_name(st.st_mode), ", not a regular file");
  }
  // Back to blocking reads (a regular file never blocks, but keep the usual semantics).
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return InputFile(fd, static_cast<uint64_t>(st.st_size), path, what);
}

void InputFile::check_size(uint64_t max_bytes) const {
  if (size_ > max_bytes) {
    DSV41_FAIL(what_, " '", path_, "': ", size_, " bytes (", bytes_text(size_), "), over the limit of ", max_bytes,
               " bytes (", bytes_text(max_bytes), ") for a ", what_, " (docs/cli.md \"Limits\")");
  }
}

void InputFile::read_at(uint64_t offset, void* buf, size_t n) const {
  auto* p = static_cast<unsigned char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      DSV41_FAIL(what_, " '", path_, "': reading ", n, " bytes at offset ", offset, " failed (", std::strerror(errno),
                 ")");
    }
    if (got == 0) {
      DSV41_FAIL(what_, " '", path_, "': ends at byte ", offset + done, ", before the ", n, " bytes at offset ", offset,
                 " (the file shrank while being read?)");
    }
    done += static_cast<size_t>(got);
  }
}

namespace {

template <typename Bytes>
Bytes read_whole(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const InputFile f = InputFile::open(path, what);
  f.check_size(max_bytes);
  Bytes out(static_cast<size_t>(f.size()), typename Bytes::value_type{});
  if (!out.empty()) f.read_at(0, out.data(), out.size());
  return out;
}

}  // namespace

std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return read_whole<std::string>(path, what, max_bytes);
}

std::vector<uint8_t> read_binary_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return read_whole<std::vector<uint8_t>>(path, what, max_bytes);
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    DSV41_FAIL(what, " '", path, "': cannot open (", std::strerror(err), ")");
  }
  if (!S_ISREG(st.st_mode)) DSV41_FAIL(what, " '", path, "': is ", file_type_name(st.st_mode), ", not a regular file");
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  uint64_t out = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page), &out)) return UINT64_MAX;
  return out;
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) DSV41_FAIL(what, ": ", a, " x ", b, " overflows 64 bits");
  return out;
}

uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) DSV41_FAIL(what, ": ", a, " + ", b, " overflows 64 bits");
  return out;
}

void check_memory(uint64_t bytes, const std::string& what, uint64_t limit) {
  const uint64_t phys = physical_memory_bytes();
  if (limit != 0 && bytes > limit) {
    DSV41_FAIL(what, ": needs ", bytes, " bytes (", bytes_text(bytes), "), over the limit of ", limit, " bytes (",
               bytes_text(limit), ")");
  }
  if (phys != 0 && bytes > phys) {
    DSV41_FAIL(what, ": needs ", bytes, " bytes (", bytes_text(bytes), "), more than this machine's physical memory (",
               phys, " bytes, ", bytes_text(phys), ")");
  }
}

}  // namespace dsv41::input
