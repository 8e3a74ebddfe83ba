// reference/session_file.cc
//
// Session files on disk: atomic writes (temp file, fsync, rename, directory fsync) and whole-file
// reads, for the session store (reference/session_store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "reference/session_internal.h"

namespace dsv41::reference {

namespace session {

// Writes bytes to path through "<path>.tmp.<pid>": create exclusively, write, fsync, rename,
// fsync the directory. On failure removes the temp file (only if it created it) and throws.
void write_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    DSV41_FAIL("cannot write session file '", path, "': cannot create '", tmp, "': ", std::strerror(errno));
  }
  const auto fail = [&](const char* step, int err) {
    ::unlink(tmp.c_str());
    DSV41_FAIL("cannot write session file '", path, "': ", step, " '", tmp, "' failed: ", std::strerror(err));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write to", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync of", err);
  }
  if (::close(fd) != 0) fail("close of", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename over the target of", errno);
  // Make the rename itself durable (best effort: not every file system lets a directory sync).
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<uint8_t> read_all(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DSV41_FAIL("cannot open session file '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DSV41_FAIL("session file '", path, "' is not a regular file");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      DSV41_FAIL("cannot read session file '", path, "': ", std::strerror(err));
    }
    if (n == 0) break;  // shrank while reading: the size check reports it
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

}  // namespace session

using namespace session;

void save_session(const std::string& path, const ModelState& state, const ModelConfig& c, bool include_swa) {
  write_atomically(path, session_bytes(state, c, include_swa));
}

SessionHeader read_session_header(const std::string& path, const ModelConfig& c) {
  return parse_session_header(read_all(path), path, c);
}

LoadedSession load_session(const std::string& path, const ModelConfig& c, const Model& model, ResumeMode mode) {
  return load_session_bytes(read_all(path), path, c, model, mode);
}

}  // namespace dsv41::reference
