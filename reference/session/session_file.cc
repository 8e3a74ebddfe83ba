// reference/session/session_file.cc
//
// Session files on disk: atomic writes (base/output_file.h) and whole-file
// reads, for the session store (reference/session/session_store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include "base/input_file.h"
#include "base/output_file.h"
#include "reference/session/session_internal.h"

namespace dsv41::reference::session {


// Writes bytes to path atomically under the output-file policy (base/output_file.h: a unique
// temp file beside the target, fsync, rename, directory fsync; never over a non-regular file).
void write_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  output::write_file_atomically(path, "session file", bytes.data(), bytes.size());
}

std::vector<uint8_t> read_all(const std::string& path) {
  // The input-file policy (base/input_file.h): opened without blocking, a regular file only (a
  // FIFO given to --resume is refused at once), no larger than the machine's memory.
  const input::InputFile f = input::InputFile::open(path, "session file");
  input::check_memory(f.size(), "session file '" + path + "'");
  std::vector<uint8_t> bytes(static_cast<size_t>(f.size()));
  if (!bytes.empty()) f.read_at(0, bytes.data(), bytes.size());
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
