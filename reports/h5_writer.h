// reports/h5_writer.h
//
// H5Writer: writes HDF5 files that an engineer opens with h5py — groups created on demand from
// '/'-separated paths, typed datasets with their shape (chunked + gzip above 64 KiB), and string
// or numeric attributes, tables (reports/table.h) as compound datasets or as groups of column
// datasets. Object timestamps are off, so the same writes give the same file contents (what
// h5diff compares). Writes are atomic (base/output_file.h): the constructor checks <path> (a
// regular file or a new path, never a device, FIFO or directory) and everything goes to a unique
// temp file beside it; commit() flushes, closes, fsyncs and renames it over <path>; a writer
// destroyed without commit() removes its temp file, so a failed run never leaves a half-written
// or truncated report behind. Built on the
// shared HDF5 layer (h5/h5_io.h); HDF5's error printing is off while the writer exists (its
// checks report every failure as a dsv41::Error).
//
// Example:
//   H5Writer w("out.h5");
//   w.write("/logits", logits_data, {steps, vocab});
//   w.attr("/", "tool", "dsv41 0.1.0");
//   w.commit();
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/output_file.h"
#include "h5/h5_io.h"
#include "reports/table.h"

namespace dsv41::reports {

class H5Writer {
 public:
  // `what` names the file in errors ("report (-o)", "port dump (--dump)", …).
  explicit H5Writer(std::string path, const std::string& what = "HDF5 file");
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  void write(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<double>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<int32_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<int64_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<uint8_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<uint16_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<uint64_t>& data, const std::vector<int64_t>& shape);
  // A 1-D dataset of variable-length UTF-8 strings.
  void write_strings(const std::string& path, const std::vector<std::string>& data);
  // A 1-D dataset of fixed-width UTF-8 strings (NUL-padded to the longest; at least 1 byte):
  // chunked and compressed like numbers, which variable-length strings cannot be.
  void write_fixed_strings(const std::string& path, const std::vector<std::string>& data);
  // A 1-D compound dataset, one member per column in the given order, one element per row
  // (columns of equal length; strings variable-length UTF-8). pandas reads it in one call:
  // pd.DataFrame(f[path][()]).
  void write_table(const std::string& path, const std::vector<TableColumn>& columns);
  // A group of 1-D datasets <group>/<column name>, all of the same length.
  void write_columns(const std::string& group, const std::vector<TableColumn>& columns);
  // The group `path` and its parents (no-op when it exists).
  void group(const std::string& path);
  // Datasets of more than `bytes` bytes are chunked and gzip-compressed (default 64 KiB; 0:
  // every non-empty dataset).
  void set_compress_above(size_t bytes) { compress_above_ = bytes; }

  // A string attribute: variable-length UTF-8, as text_attr (h5py reads it as str).
  void attr(const std::string& object_path, const std::string& name, const std::string& value);
  void attr(const std::string& object_path, const std::string& name, int64_t value);
  void attr(const std::string& object_path, const std::string& name, double value);
  void attr(const std::string& object_path, const std::string& name, uint64_t value);
  // A 1-D int64 attribute (e.g. a shape).
  void attr(const std::string& object_path, const std::string& name, const std::vector<int64_t>& value);
  // A variable-length UTF-8 string attribute (h5py reads it as str).
  void text_attr(const std::string& object_path, const std::string& name, const std::string& value);

  // Flushes and closes the temp file: every byte written, nothing published yet (a writer that
  // publishes several outputs together writes them all, then commits them all). On a failure (a
  // full disk) every id of the file is closed first (abandon) and a dsv41::Error thrown.
  void close_file();
  // close_file() (when not done), then atomically renames the temp file to the final path.
  void commit();

  const std::string& path() const { return path_; }

 private:
  void ensure_parent_groups(const std::string& path);
  void write_raw(const std::string& path, const void* data, int64_t type, size_t elem,
                 const std::vector<int64_t>& shape, size_t count);
  // As write_raw, with a stored type that differs from the memory type.
  void write_typed(const std::string& path, const void* data, int64_t mem_type, int64_t file_type,
                   size_t elem, const std::vector<int64_t>& shape, size_t count);
  void scalar_attr(const std::string& object_path, const std::string& name, int64_t type, const void* value);
  int64_t open_object(const std::string& path);
  // Closes every id of a file that will not be committed, without writing to disk (h5_writer.cc).
  void abandon();
  // abandon(), then a dsv41::Error "'<path>': <why>; '<path>' is left as it was".
  [[noreturn]] void fail(const std::string& why);
  template <typename T>
  void write_numbers(const std::string& path, const std::vector<T>& data, const std::vector<int64_t>& shape);

  h5::QuietErrors quiet_;  // for the writer's lifetime
  std::string path_;
  std::unique_ptr<output::AtomicOutput> out_;  // the temp file and the rename
  std::string tmp_path_;
  int64_t file_ = -1;
  int64_t gcpl_ = -1;  // group creation: no timestamps
  size_t compress_above_ = 64 * 1024;
  bool committed_ = false;
  bool failed_ = false;
};

}  // namespace dsv41::reports
