// reference/checkpoint/safetensors.h
//
// Reader and writer of the safetensors container: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then raw tensor bytes.
// The JSON header is parsed with nlohmann::json; the raw bytes are kept as stored.
//
// Stored dtypes (the official checkpoint's):
//   F32, BF16, F8_E4M3, F8_E8M0, I32, I64, U8, and F4: packed E2M1, two per byte, element 2k in the low
//   nibble; its header shape is LOGICAL ([out, in]), so it holds numel/2 bytes.
//
// Contract: read() validates the whole file before returning (header length within the file,
// JSON object, no duplicate names, every entry's dtype known, shape non-negative, offsets in
// range, byte count = dtype size x numel, no overlaps; gaps between tensors are allowed) and every
// error names the file and, where there is one, the tensor. write() is deterministic (entries
// sorted by name, metadata sorted, header padded with spaces to a multiple of 8) and atomic
// (temp file "<path>.tmp.<pid>.<n>", then rename; nothing is left behind on failure).
//
// Example:
//   SafetensorsFile f = SafetensorsFile::read("weights.safetensors");
//   const Entry& w = f.get("layers.2.attn.wq_a.weight", DType::kF8E4M3, {128, 256});
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/ops/dtype.h"

namespace dsv41::reference::checkpoint::safetensors {

// One entry of a file: a tensor AS STORED (dtype, logical shape, raw bytes). The reference
// computes on Tensor<T> (reference/ops/tensor.h); weights.cc decodes entries into them.
struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // logical shape
  std::vector<uint8_t> bytes;   // as stored, little endian

  int64_t numel() const;
  // Decoded values as fp32 (exact for every dtype here except I64 beyond 2^24). F4 decodes the
  // E2M1 codes only (no scale).
  std::vector<float> to_f32() const;
};

class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::string& path);
  // The same object from tensors in memory (e.g. generate_weights), with the same checks on
  // names and byte counts; `label` names it in error messages.
  static SafetensorsFile from_entries(const std::string& label, std::vector<Entry> tensors,
                                      std::map<std::string, std::string> metadata = {});

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor, checked: a missing tensor, another dtype or another shape is an error naming
  // the tensor, what was expected and what the file holds.
  const Entry& get(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  const Entry& get(const std::string& name) const;

 private:
  std::string path_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (names must be unique) atomically to `path`.
void write(const std::string& path, const std::vector<Entry>& tensors,
           const std::map<std::string, std::string>& metadata);

}  // namespace dsv41::reference::checkpoint::safetensors
