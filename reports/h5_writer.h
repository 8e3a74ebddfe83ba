// reports/h5_writer.h
//
// H5Writer: writes HDF5 files that an engineer opens with h5py — groups created on demand from
// '/'-separated paths, typed datasets with their shape (chunked + gzip above 64 KiB), and string
// or numeric attributes. Writes are atomic: everything goes to "<path>.tmp.<pid>", and commit()
// flushes, closes and renames it over <path>; a writer destroyed without commit() removes its
// temp file, so a failed run never leaves a half-written or truncated report behind.
//
// Example:
//   H5Writer w("out.h5");
//   w.write("/logits", logits_data, {steps, vocab});
//   w.attr("/", "tool", "dsv41 0.1.0");
//   w.commit();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::reports {

class H5Writer {
 public:
  explicit H5Writer(std::string path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  void write(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<double>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<int32_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<int64_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<uint8_t>& data, const std::vector<int64_t>& shape);
  void write(const std::string& path, const std::vector<uint16_t>& data, const std::vector<int64_t>& shape);
  // A 1-D dataset of variable-length UTF-8 strings.
  void write_strings(const std::string& path, const std::vector<std::string>& data);

  void attr(const std::string& object_path, const std::string& name, const std::string& value);
  void attr(const std::string& object_path, const std::string& name, int64_t value);
  void attr(const std::string& object_path, const std::string& name, double value);

  // Flushes, closes and atomically renames the temp file to the final path.
  void commit();

  const std::string& path() const { return path_; }

 private:
  void ensure_parent_groups(const std::string& path);
  void write_raw(const std::string& path, const void* data, int64_t type, size_t elem,
                 const std::vector<int64_t>& shape, size_t count);
  int64_t open_object(const std::string& path);

  std::string path_;
  std::string tmp_path_;
  int64_t file_ = -1;
  bool committed_ = false;
};

}  // namespace dsv41::reports
