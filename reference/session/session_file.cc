// reference/session/session_file.cc
//
// Session files on disk: atomic writes (base/output_file.h) and whole-file
// reads, for the session store (reference/session/session_store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include "base/output_file.h"
#include "reference/session/session_internal.h"

namespace dsv41::reference::session {


// Writes bytes to path atomically under the output-file policy (base/output_file.h: a unique
// temp file beside the target, fsync, rename, directory fsync; never over a non-regular file).
void write_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  output::write_file_atomically(path, "session file", bytes.data(), bytes.size());
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



void save_session(const std::string& path, const model::ModelState& state, const ModelConfig& c, bool include_swa) {
  write_atomically(path, session_bytes(state, c, include_swa));
}

SessionHeader read_session_header(const std::string& path, const ModelConfig& c) {
  return parse_session_header(read_all(path), path, c);
}

LoadedSession load_session(const std::string& path, const ModelConfig& c, const model::Model& model, ResumeMode mode) {
  return load_session_bytes(read_all(path), path, c, model, mode);
}

}  // namespace dsv41::reference::session
