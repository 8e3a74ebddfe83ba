// reference/session/session_internal.h
//
// Internal to the session store (reference/session/session_store.h): the little-endian fields, the
// section payload codec and the checks shared by its three files:
//   session_codec.cc    the byte layout: sections, header and table, section payloads (writing),
//                       parsing and checking a header and table
//   session_restore.cc  filling a state from a file's sections, checking every entry; global-only
//                       resume (encoder replay)
//   session_file.cc     atomic writes and whole-file reads
#pragma once

#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/crc32c.h"
#include "reference/session/session_store.h"

namespace dsv41::reference::session {

// Header fields (docs/session-store.md), byte offsets.
inline constexpr int64_t kMagicAt = 0, kVersionAt = 8, kFlagsAt = 12, kConfigHashAt = 16, kPosAt = 24,
                  kFileBytesAt = 32, kSectionCountAt = 40, kHeaderCrcAt = 44;
// Section table entry fields, byte offsets within the entry.
inline constexpr int64_t kKindAt = 0, kLayerAt = 4, kRatioAt = 8, kEntryBytesAt = 12, kFirstPositionAt = 16,
                  kCountAt = 24, kOffsetAt = 32, kCrcAt = 40;
static_assert(kHeaderCrcAt + 4 == kSessionHeaderBytes);
static_assert(kCrcAt + 4 == kSessionTableEntryBytes);

static_assert(kHeaderCrcAt + 4 == kSessionHeaderBytes);
static_assert(kCrcAt + 4 == kSessionTableEntryBytes);

// ---- little-endian fields ----

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_i64(std::vector<uint8_t>& out, int64_t v) { put_u64(out, static_cast<uint64_t>(v)); }
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}
inline int64_t get_i64(const uint8_t* p) { return static_cast<int64_t>(get_u64(p)); }

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}
inline std::string hex64(uint64_t v) {  // 16 digits, as config_hash
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}
inline std::string hex8(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}
// Bytes as a C string literal: printable ASCII kept, the rest \xNN.
inline std::string quoted(const uint8_t* p, int64_t n) {
  std::string out = "\"";
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7F && p[i] != '"' && p[i] != '\\') {
      out += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      out += buf;
    }
  }
  return out + "\"";
}

inline uint32_t crc_of(const std::vector<uint8_t>& v) { return crc32c(v.data(), v.size()); }

// "section 3 of 19 (index keys of layer 4)".
inline std::string describe(const SessionSectionInfo& s, size_t index, size_t n) {
  std::string what = name(s.kind);
  if (s.layer >= 0) what += " of layer " + std::to_string(s.layer);
  return "section " + std::to_string(index + 1) + " of " + std::to_string(n) + " (" + what + ")";
}

// The position slot `slot` of a W-slot ring holds at position pos: the latest p < pos with
// p % W == slot, or -1 (never written).
inline int64_t ring_position(int64_t pos, int window, int64_t slot) {
  if (pos <= slot) return -1;
  return slot + (pos - 1 - slot) / window * window;
}

template <typename... Args>
[[noreturn]] void refuse(const std::string& file, Args&&... why) {
  DSV41_FAIL("session file '", file, "': ", std::forward<Args>(why)...);
}

// The payload of section `sec` of `state` (checked against the layout it must have).
std::vector<uint8_t> section_payload(const model::ModelState& state, const ModelConfig& c, const SessionSectionInfo& sec);

// Writes bytes to path atomically (docs/session-store.md); throws naming the path.
void write_atomically(const std::string& path, const std::vector<uint8_t>& bytes);
// The whole file; throws naming the path.
std::vector<uint8_t> read_all(const std::string& path);

}  // namespace dsv41::reference::session
