// reference/session/session_store.h
//
// The persistent store of one session's state: save_session writes a ModelState to a file,
// load_session reads it back into a state that continues exactly where the saved one stopped
// (forward_chunk on it gives the same bits as a run that never paused), or, in global-only mode,
// into a state whose SWA rings are rebuilt by encoder replay (approximate by design,
// docs/sessions.md). docs/session-store.md documents the file byte for byte.
//
// What a file holds:
//   global (always)   per kv source, in layer order: its compressed-KV entries and its index-key
//                     entries as the PACKED cache bytes (288 / 68 B per entry at the released
//                     dims), and for ratio > 1 its compressor's pending partial group (the
//                     pending slots only, fp32 kv and score rows); the Engram n-gram tail (the
//                     last engram_max_ngram_size - 1 compressed ids before pos: the hash of a
//                     later position never reads further back); the token tail (the raw ids of
//                     the last min(pos, recent_token_count(c)) positions: what encoder replay
//                     reads); pos; the config hash.
//   local (optional)  every layer's SWA ring: per slot its position and packed FP8 entry; with a
//                     DSpark config (n_mtp_layers > 0) also each DSpark block's ring
//                     (ModelState::dspark_window_kv), the same way, so the next Model::draft of a
//                     resumed session is the uninterrupted one's bit for bit. Without the local
//                     state a session resumes only in global-only mode (encoder replay rebuilds
//                     both kinds of ring).
// Size: fixed bytes (header, section table, the pending / Engram / token / ring sections) plus
// exactly global_bytes_for_tokens(byte_accounting(c), pos) bytes of cache entries
// (byte_accounting.h).
//
// Integrity: little-endian; a versioned 48-byte header with its own CRC-32C (base/crc32c.h),
// a section table with its own CRC-32C, and a CRC-32C per section, so every single-bit error is
// detected. Loading refuses, with a dsv41::Error "session file '<path>': <reason>", a wrong magic,
// an unsupported version, a config hash mismatch (both hashes printed), a checksum mismatch
// (naming the header, the table or the section), a truncated file, a section table that does not
// match the config and pos (owner layers, ratios, entry sizes, counts: a kv source at position P
// holds exactly P / ratio entries), and entries the formats cannot have written (a scale byte
// outside the quantizer's range, an SWA or DSpark ring slot holding the wrong position, a
// non-finite pending value, an Engram id outside the compressed vocab, a token id outside the
// vocab); files of an older format (1: no token tail, 2: no DSpark rings) are refused with both
// versions and what changed: re-save them with this build.
//
// Session files hold the official packed formats only: saving a CachePrecision::kBf16 state, or
// loading into a model set to kBf16 caches, is a dsv41::Error (the ablation's states are kept in
// memory: ModelState is copyable).
//
// Writes are atomic: the bytes go to "<path>.tmp.<pid>.<n>" (created exclusively), which is fsynced
// and renamed over <path>; on any failure the temp file is removed and an existing file at
// <path> is left as it was.
//
// Example:
//   save_session("s.dsv41s", state, config, /*include_swa=*/true);
//   LoadedSession l = load_session("s.dsv41s", config, model);
//   StepRecord r = model.forward_chunk(l.state, more_tokens);  // = the uninterrupted run
//   LoadedSession g = load_session("s.dsv41s", config, model, ResumeMode::kGlobalOnly);
//   model.forward_chunk(g.state, more_tokens);  // approximate unless pos <= window_size
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/model/model.h"

namespace dsv41::reference::session {

inline constexpr char kSessionMagic[9] = "DSV41SES";  // the first 8 bytes of every file
inline constexpr uint32_t kSessionFormatVersion = 3;  // 2: + the token tail; 3: + the DSpark rings
inline constexpr int64_t kSessionHeaderBytes = 48;      // magic .. header CRC
inline constexpr int64_t kSessionTableEntryBytes = 44;  // one section table entry
inline constexpr int64_t kSessionTableCrcBytes = 4;     // the CRC after the table
inline constexpr uint32_t kSessionFlagSwa = 1u;         // header flags bit 0: the local state (SWA and
                                                        //   DSpark rings) included

enum class SessionSection : uint32_t {
  kCompressedKv = 1,       // a kv source's compressed-KV entries
  kIndexKeys = 2,          // a kv source's index-key entries
  kCompressorPending = 3,  // a ratio > 1 kv source's pending partial group
  kEngramTail = 4,         // the Engram n-gram tail
  kWindowKv = 5,           // one layer's SWA ring
  kTokenTail = 6,          // the raw token ids of the last positions (format 2)
  kDSparkRing = 7,         // one DSpark block's ring, layer n_layers + i (format 3)
};
const char* name(SessionSection s);

// One section table entry (docs/session-store.md); a section's payload is count x entry_bytes.
struct SessionSectionInfo {
  SessionSection kind = SessionSection::kCompressedKv;
  int layer = -1;              // owner layer (kv sources), ring layer (SWA), n_layers + i (DSpark
                               //   block i), -1 (Engram, tokens)
  int ratio = 0;               // the owner's compress ratio (0 for Engram, tokens and the rings)
  int64_t entry_bytes = 0;     // bytes per entry
  int64_t first_position = 0;  // see session_layout
  int64_t count = 0;           // entries
  int64_t offset = 0;          // byte offset of the payload in the file
  uint32_t crc = 0;            // CRC-32C of the payload

  int64_t bytes() const { return entry_bytes * count; }
};

// The sections of a state of config c at position pos, in file order, with offsets (crc unset):
//   per kv source (layer order): kCompressedKv (first_position 0 = the compressed position of
//     entry 0, count pos / ratio), kIndexKeys (same), and for ratio > 1 kCompressorPending
//     (first_position = pos - pos % ratio, the token of slot 0; count pos % ratio);
//   kEngramTail (count min(pos, engram_max_ngram_size - 1), 0 without Engram layers;
//     first_position pos - count);
//   kTokenTail (count min(pos, recent_token_count(c)), first_position pos - count);
//   with include_swa, per layer kWindowKv (first_position max(0, pos - window), count window),
//     then per DSpark block i (n_mtp_layers > 0) kDSparkRing, layer n_layers + i, the same way.
std::vector<SessionSectionInfo> session_layout(const ModelConfig& c, int64_t pos, bool include_swa);

// Header + section table + table CRC of a file with n sections.
int64_t session_fixed_bytes(int64_t n_sections);

// What the header and section table of a valid file say.
struct SessionHeader {
  uint32_t version = 0;
  bool has_swa = false;
  std::string config_hash;  // 16 hex digits, as config_hash()
  int64_t pos = 0;
  int64_t file_bytes = 0;
  std::vector<SessionSectionInfo> sections;
};

// The file's bytes for `state` of config c (the state must be consistent: caches holding
// pos / ratio entries, the compressor at pos, the Engram history up to pos, the recent tokens
// of the token tail's positions).
std::vector<uint8_t> session_bytes(const model::ModelState& state, const ModelConfig& c, bool include_swa);
// Writes session_bytes atomically to path.
void save_session(const std::string& path, const model::ModelState& state, const ModelConfig& c,
                  bool include_swa);

// Checks everything but the entries' contents (header, table, checksums, sizes, against c) and
// returns the header; cheap, so a caller can refuse a bad file before loading weights.
// `name` names the file in errors.
SessionHeader parse_session_header(const std::vector<uint8_t>& bytes, const std::string& name,
                                   const ModelConfig& c);
SessionHeader read_session_header(const std::string& path, const ModelConfig& c);

// How a session's local state (the SWA and DSpark rings) is rebuilt on loading (docs/sessions.md).
enum class ResumeMode {
  kFull,        // the file's rings; without them every slot is empty and a step (or draft) fails
  kGlobalOnly,  // encoder replay: the file's rings, if any, are ignored; the Engram history is
                // rebuilt from the token tail and Model::replay_local_state replays its last
                // min(pos, window_size) tokens (both kinds of ring). Exact when pos <= window_size.
};

struct LoadedSession {
  model::ModelState state;       // at header.pos. kFull: SWA and DSpark rings empty (every slot -1)
                          // unless has_swa; kGlobalOnly: the replayed rings
  bool has_swa = false;   // the file holds the rings (flags bit 0)
  ResumeMode mode = ResumeMode::kFull;
  int64_t replayed_tokens = 0;  // kGlobalOnly: the tokens encoder replay ran (min(pos, window_size))
  SessionHeader header;
};

// model must have been built from c. `name` names the bytes' file in errors.
LoadedSession load_session_bytes(const std::vector<uint8_t>& bytes, const std::string& name,
                                  const ModelConfig& c, const model::Model& model, ResumeMode mode = ResumeMode::kFull);
LoadedSession load_session(const std::string& path, const ModelConfig& c, const model::Model& model,
                           ResumeMode mode = ResumeMode::kFull);

}  // namespace dsv41::reference::session
