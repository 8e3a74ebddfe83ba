// reference/session/session_codec.cc
//
// The session file's byte layout (docs/session-store.md): sections of a state, the header and
// section table, the payload of each section, and the checks of a header and table on reading.
#include <cstring>

#include "base/base.h"
#include "formats/cache_format.h"
#include "reference/session/session_internal.h"

namespace dsv41::reference::session {

using formats::CacheFormat;

const char* name(SessionSection s) {
  switch (s) {
    case SessionSection::kCompressedKv: return "compressed KV";
    case SessionSection::kIndexKeys: return "index keys";
    case SessionSection::kCompressorPending: return "compressor pending group";
    case SessionSection::kEngramTail: return "Engram tail";
    case SessionSection::kTokenTail: return "token tail";
    case SessionSection::kWindowKv: return "SWA ring";
    case SessionSection::kDSparkRing: return "DSpark ring";
  }
  return "unknown";
}


namespace {

// A ring section's payload (kWindowKv, kDSparkRing): per slot its i64 position, then the packed
// entry [entry_bytes - 8]. Every slot must hold the position ring_position() says.
void put_ring(std::vector<uint8_t>& p, const model::WindowKvRing& ring, const ModelConfig& c, const SessionSectionInfo& sec,
              int64_t pos) {
  const int64_t eb = sec.entry_bytes - 8;
  DSV41_CHECK(ring.window == c.window_size && ring.head_dim == c.head_dim && ring.bytes.numel() == ring.window * eb &&
                  static_cast<int64_t>(ring.positions.size()) == ring.window,
              "save_session: the ", name(sec.kind), " of layer ", sec.layer, " has window ", ring.window,
              " and head_dim ", ring.head_dim, ", the config ", c.window_size, " and ", c.head_dim);
  for (int64_t slot = 0; slot < ring.window; ++slot) {
    const int64_t at = ring.positions[static_cast<size_t>(slot)];
    DSV41_CHECK(at == ring_position(pos, ring.window, slot), "save_session: ", name(sec.kind), " of layer ",
                sec.layer, ": slot ", slot, " holds position ", at, ", a state at position ", pos, " has ",
                ring_position(pos, ring.window, slot), " there");
    put_i64(p, at);
    const uint8_t* entry = ring.bytes.row(slot);
    p.insert(p.end(), entry, entry + eb);
  }
}

}  // namespace

// The payload of one section of `state` (checked against the layout it must have).
std::vector<uint8_t> section_payload(const model::ModelState& state, const ModelConfig& c, const SessionSectionInfo& sec) {
  std::vector<uint8_t> p;
  p.reserve(static_cast<size_t>(sec.bytes()));
  const int64_t pos = state.pos;
  // The layer's state for the per-layer kinds (a DSpark ring's layer n_layers + i has none).
  const model::LayerState* ls =
      sec.layer >= 0 && sec.layer < c.n_layers ? &state.layers[static_cast<size_t>(sec.layer)] : nullptr;
  switch (sec.kind) {
    case SessionSection::kCompressedKv: {
      DSV41_CHECK(ls->compressed_kv.has_value(), "save_session: layer ", sec.layer, " has no compressed KV cache");
      const model::PackedCache& kv = *ls->compressed_kv;
      DSV41_CHECK(kv.owner_layer() == sec.layer && kv.ratio() == sec.ratio && kv.position_offset() == 0 &&
                      kv.size() == sec.count && kv.entry_bytes() == sec.entry_bytes,
                  "save_session: compressed KV cache of layer ", kv.owner_layer(), " (ratio ", kv.ratio(),
                  ", offset ", kv.position_offset(), ") holds ", kv.size(), " entries; a state at position ",
                  pos, " needs ", sec.count);
      for (int64_t e = 0; e < kv.size(); ++e) p.insert(p.end(), kv.entry(e), kv.entry(e) + kv.entry_bytes());
      break;
    }
    case SessionSection::kIndexKeys: {
      DSV41_CHECK(ls->index_keys.has_value(), "save_session: layer ", sec.layer, " has no index-key cache");
      const model::PackedCache& keys = *ls->index_keys;
      DSV41_CHECK(keys.owner_layer() == sec.layer && keys.ratio() == sec.ratio && keys.position_offset() == 0 &&
                      keys.size() == sec.count && keys.entry_bytes() == sec.entry_bytes,
                  "save_session: index-key cache of layer ", keys.owner_layer(), " (ratio ", keys.ratio(),
                  ", offset ", keys.position_offset(), ") holds ", keys.size(), " entries; a state at position ",
                  pos, " needs ", sec.count);
      for (int64_t e = 0; e < keys.size(); ++e) {
        p.insert(p.end(), keys.entry(e), keys.entry(e) + keys.entry_bytes());
      }
      break;
    }
    case SessionSection::kCompressorPending: {
      DSV41_CHECK(ls->compressor.has_value(), "save_session: layer ", sec.layer, " has no compressor");
      const model::CompressorState& cs = *ls->compressor;
      DSV41_CHECK(cs.ratio == sec.ratio && cs.dim == c.head_dim && cs.next_pos == pos,
                  "save_session: the compressor of layer ", sec.layer, " (ratio ", cs.ratio, ") is at position ",
                  cs.next_pos, ", the state at ", pos);
      for (int slot = 0; slot < cs.pending(); ++slot) {  // [kv row][score row] fp32 per slot
        for (int64_t j = 0; j < cs.dim; ++j) put_u32(p, f32_bits(cs.kv.at(slot, j)));
        for (int64_t j = 0; j < cs.dim; ++j) put_u32(p, f32_bits(cs.score.at(slot, j)));
      }
      break;
    }
    case SessionSection::kEngramTail: {
      if (sec.count == 0) break;
      DSV41_CHECK(state.engram.size() == pos && state.engram.first_position() <= sec.first_position,
                  "save_session: the Engram history holds positions ", state.engram.first_position(), " .. ",
                  state.engram.size() - 1, ", the state is at ", pos);
      for (int64_t q = sec.first_position; q < pos; ++q) put_i64(p, state.engram.at(q));
      break;
    }
    case SessionSection::kTokenTail: {
      const int64_t kept = static_cast<int64_t>(state.recent_tokens.size());
      DSV41_CHECK(kept == model::recent_token_count(c), "save_session: the state keeps ", kept, " recent tokens, the config ",
                  model::recent_token_count(c));
      for (int64_t q = sec.first_position; q < pos; ++q) {
        const int64_t token = state.recent_tokens[static_cast<size_t>(q % kept)];
        DSV41_CHECK(token >= 0 && token < c.vocab_size, "save_session: the recent tokens hold ", token,
                    " for position ", q, ", not a token of the vocab [0, ", c.vocab_size, ")");
        put_i64(p, token);
      }
      break;
    }
    case SessionSection::kWindowKv:
      put_ring(p, ls->window_kv, c, sec, pos);
      break;
    case SessionSection::kDSparkRing: {
      const size_t i = static_cast<size_t>(sec.layer - c.n_layers);
      DSV41_CHECK(i < state.dspark_window_kv.size(), "save_session: the state has ", state.dspark_window_kv.size(),
                  " DSpark rings, the config ", c.n_mtp_layers, " (a state comes from Model::new_state)");
      put_ring(p, state.dspark_window_kv[i], c, sec, pos);
      break;
    }
  }
  DSV41_CHECK(static_cast<int64_t>(p.size()) == sec.bytes(), "save_session: ", name(sec.kind), " of layer ",
              sec.layer, ": ", p.size(), " bytes, the layout says ", sec.bytes());
  return p;
}


int64_t session_fixed_bytes(int64_t n_sections) {
  return kSessionHeaderBytes + n_sections * kSessionTableEntryBytes + kSessionTableCrcBytes;
}

std::vector<SessionSectionInfo> session_layout(const ModelConfig& c, int64_t pos, bool include_swa) {
  DSV41_CHECK(pos >= 0 && pos <= c.max_seq_len, "session layout: position ", pos, " outside [0, max_seq_len ",
              c.max_seq_len, "]");
  std::vector<SessionSectionInfo> out;
  const auto add = [&out](SessionSection kind, int layer, int ratio, int64_t entry_bytes, int64_t first,
                          int64_t count) {
    SessionSectionInfo s;
    s.kind = kind;
    s.layer = layer;
    s.ratio = ratio;
    s.entry_bytes = entry_bytes;
    s.first_position = first;
    s.count = count;
    out.push_back(s);
  };
  for (const LayerInfo& info : layer_schedule(c)) {
    if (info.role != LayerRole::kFull) continue;
    const int r = info.ratio;
    add(SessionSection::kCompressedKv, info.layer, r, formats::entry_bytes(CacheFormat::kCompressedKvFp4, c.head_dim), 0,
        pos / r);
    add(SessionSection::kIndexKeys, info.layer, r, formats::entry_bytes(CacheFormat::kIndexKeysFp4, c.index_head_dim),
        0, pos / r);
    if (r > 1) {
      add(SessionSection::kCompressorPending, info.layer, r, 2 * c.head_dim * int64_t{sizeof(float)}, pos - pos % r,
          pos % r);
    }
  }
  const int64_t tail = c.engram_layer_ids.empty() ? 0 : std::min<int64_t>(pos, c.engram_max_ngram_size - 1);
  add(SessionSection::kEngramTail, -1, 0, int64_t{sizeof(int64_t)}, pos - tail, tail);
  const int64_t recent = std::min<int64_t>(pos, model::recent_token_count(c));
  add(SessionSection::kTokenTail, -1, 0, int64_t{sizeof(int64_t)}, pos - recent, recent);
  if (include_swa) {  // the local state: the SWA rings, then the DSpark rings (same slots)
    const int64_t ring_entry = 8 + formats::entry_bytes(CacheFormat::kWindowKvFp8, c.head_dim);
    const int64_t ring_first = std::max<int64_t>(0, pos - c.window_size);
    for (int l = 0; l < c.n_layers; ++l) {
      add(SessionSection::kWindowKv, l, 0, ring_entry, ring_first, c.window_size);
    }
    for (int i = 0; i < c.n_mtp_layers; ++i) {
      add(SessionSection::kDSparkRing, c.n_layers + i, 0, ring_entry, ring_first, c.window_size);
    }
  }
  int64_t offset = session_fixed_bytes(static_cast<int64_t>(out.size()));
  for (SessionSectionInfo& s : out) {
    s.offset = offset;
    offset += s.bytes();
  }
  return out;
}

std::vector<uint8_t> session_bytes(const model::ModelState& state, const ModelConfig& c, bool include_swa) {
  if (state.precision != CachePrecision::kPacked) {
    DSV41_FAIL("save_session: the state has ", name(state.precision),
               " caches (the cache precision ablation); session files hold the official packed formats only");
  }
  DSV41_CHECK(static_cast<int>(state.layers.size()) == c.n_layers, "save_session: the state has ",
              state.layers.size(), " layers, the config ", c.n_layers);
  std::vector<SessionSectionInfo> layout = session_layout(c, state.pos, include_swa);
  std::vector<std::vector<uint8_t>> payloads;
  for (SessionSectionInfo& sec : layout) {
    payloads.push_back(section_payload(state, c, sec));
    sec.crc = crc_of(payloads.back());
  }
  const int64_t file_bytes = layout.empty() ? session_fixed_bytes(0) : layout.back().offset + layout.back().bytes();

  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(file_bytes));
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(kSessionMagic[i]));
  put_u32(out, kSessionFormatVersion);
  put_u32(out, include_swa ? kSessionFlagSwa : 0u);
  put_u64(out, std::stoull(config_hash(c), nullptr, 16));
  put_i64(out, state.pos);
  put_u64(out, static_cast<uint64_t>(file_bytes));
  put_u32(out, static_cast<uint32_t>(layout.size()));
  put_u32(out, crc32c(out.data(), out.size()));
  for (const SessionSectionInfo& sec : layout) {
    put_u32(out, static_cast<uint32_t>(sec.kind));
    put_u32(out, static_cast<uint32_t>(sec.layer));
    put_u32(out, static_cast<uint32_t>(sec.ratio));
    put_u32(out, static_cast<uint32_t>(sec.entry_bytes));
    put_i64(out, sec.first_position);
    put_i64(out, sec.count);
    put_u64(out, static_cast<uint64_t>(sec.offset));
    put_u32(out, sec.crc);
  }
  put_u32(out, crc32c(out.data() + kSessionHeaderBytes, out.size() - kSessionHeaderBytes));
  for (const std::vector<uint8_t>& p : payloads) out.insert(out.end(), p.begin(), p.end());
  DSV41_CHECK(static_cast<int64_t>(out.size()) == file_bytes, "save_session: wrote ", out.size(),
              " bytes, the layout says ", file_bytes);
  return out;
}

SessionHeader parse_session_header(const std::vector<uint8_t>& bytes, const std::string& file, const ModelConfig& c) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  const uint8_t* b = bytes.data();
  // 1. The header: magic, version, its checksum, then what it says.
  if (size < kSessionHeaderBytes) {
    refuse(file, "truncated: ", size, " bytes, the header alone has ", kSessionHeaderBytes);
  }
  if (std::memcmp(b + kMagicAt, kSessionMagic, 8) != 0) {
    refuse(file, "not a dsv41 session file (wrong magic ", quoted(b + kMagicAt, 8), ", want ",
           quoted(reinterpret_cast<const uint8_t*>(kSessionMagic), 8), ")");
  }
  SessionHeader h;
  h.version = get_u32(b + kVersionAt);
  if (h.version >= 1 && h.version < kSessionFormatVersion) {
    const char* added = h.version == 1 ? "version 2 added the token tail that a global-only resume replays, version 3 "
                                         "the DSpark rings of speculative decoding"
                                       : "version 3 added the DSpark rings of speculative decoding";
    refuse(file, "format version ", h.version, " is not read by this build: this build reads version ",
           kSessionFormatVersion, " (", added, "); re-save the session with this build (run it again and save it)");
  }
  if (h.version != kSessionFormatVersion) {
    refuse(file, "unsupported format version ", h.version, " (this build reads version ", kSessionFormatVersion, ")");
  }
  const uint32_t header_crc = crc32c(b, kHeaderCrcAt);
  if (get_u32(b + kHeaderCrcAt) != header_crc) {
    refuse(file, "header checksum mismatch (stored ", hex32(get_u32(b + kHeaderCrcAt)), ", computed ",
           hex32(header_crc), ")");
  }
  const uint64_t stated = get_u64(b + kFileBytesAt);
  if (static_cast<uint64_t>(size) < stated) {
    refuse(file, "truncated: ", size, " bytes, the header says the file has ", stated);
  }
  if (static_cast<uint64_t>(size) > stated) {
    refuse(file, size, " bytes, but the header says the file has ", stated, " (trailing bytes)");
  }
  h.file_bytes = size;
  const uint32_t flags = get_u32(b + kFlagsAt);
  if ((flags & ~kSessionFlagSwa) != 0) refuse(file, "unknown header flags ", hex32(flags));
  h.has_swa = (flags & kSessionFlagSwa) != 0;
  h.config_hash = hex64(get_u64(b + kConfigHashAt));
  const std::string want_hash = config_hash(c);
  if (h.config_hash != want_hash) {
    refuse(file, "config hash mismatch: the file was saved with config ", h.config_hash,
           ", the config given has hash ", want_hash);
  }
  h.pos = get_i64(b + kPosAt);
  if (h.pos < 0 || h.pos > c.max_seq_len) {
    refuse(file, "section table inconsistent: position ", h.pos, " outside [0, max_seq_len ", c.max_seq_len, "]");
  }

  // 2. The section table: its checksum, then every entry against the layout of (config, pos).
  const int64_t n = get_u32(b + kSectionCountAt);
  const int64_t table_end = kSessionHeaderBytes + n * kSessionTableEntryBytes;
  if (table_end + kSessionTableCrcBytes > size) {
    refuse(file, "section table inconsistent: ", n, " sections need ", table_end + kSessionTableCrcBytes,
           " bytes of header and table, the file has ", size);
  }
  const uint32_t table_crc = crc32c(b + kSessionHeaderBytes, static_cast<size_t>(table_end - kSessionHeaderBytes));
  if (get_u32(b + table_end) != table_crc) {
    refuse(file, "section table checksum mismatch (stored ", hex32(get_u32(b + table_end)), ", computed ",
           hex32(table_crc), ")");
  }
  const std::vector<SessionSectionInfo> want = session_layout(c, h.pos, h.has_swa);
  if (n != static_cast<int64_t>(want.size())) {
    refuse(file, "section table inconsistent: ", n, " sections, but a state of this config ",
           h.has_swa ? "with" : "without", " SWA rings has ", want.size());
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* e = b + kSessionHeaderBytes + i * kSessionTableEntryBytes;
    const SessionSectionInfo& w = want[static_cast<size_t>(i)];
    const std::string where = describe(w, static_cast<size_t>(i), want.size());
    SessionSectionInfo s;
    const uint32_t kind = get_u32(e + kKindAt);
    s.layer = static_cast<int32_t>(get_u32(e + kLayerAt));
    s.ratio = static_cast<int32_t>(get_u32(e + kRatioAt));
    s.entry_bytes = get_u32(e + kEntryBytesAt);
    s.first_position = get_i64(e + kFirstPositionAt);
    s.count = get_i64(e + kCountAt);
    s.offset = get_i64(e + kOffsetAt);
    s.crc = get_u32(e + kCrcAt);
    s.kind = w.kind;
    if (kind != static_cast<uint32_t>(w.kind)) {
      refuse(file, "section table inconsistent: ", where, ": the table has kind ", kind,
             ", the config's layout has kind ", static_cast<uint32_t>(w.kind), " there");
    }
    if (s.layer != w.layer || s.ratio != w.ratio) {
      refuse(file, "section table inconsistent: ", where, ": the table names layer ", s.layer, " with ratio ",
             s.ratio, ", but the config's schedule has ",
             w.kind == SessionSection::kDSparkRing                      ? "DSpark block layer "
             : w.layer < 0 || w.kind == SessionSection::kWindowKv ? "layer "
                                                                   : "kv source layer ",
             w.layer, " with ratio ", w.ratio, " there");
    }
    if (s.entry_bytes != w.entry_bytes) {
      refuse(file, "section table inconsistent: ", where, ": entries of ", s.entry_bytes, " bytes, the config's are ",
             w.entry_bytes);
    }
    if (s.count != w.count) {
      const char* rule = w.kind == SessionSection::kCompressedKv || w.kind == SessionSection::kIndexKeys
                             ? "pos / ratio"
                         : w.kind == SessionSection::kCompressorPending ? "pos % ratio"
                         : w.kind == SessionSection::kEngramTail        ? "min(pos, engram_max_ngram_size - 1)"
                         : w.kind == SessionSection::kTokenTail
                             ? (c.engram_layer_ids.empty() ? "min(pos, window_size)"
                                                           : "min(pos, window_size + engram_max_ngram_size - 1)")
                             : "window_size";
      refuse(file, "section table inconsistent: ", where, ": holds ", s.count, " entries, but a state at position ",
             h.pos, " holds exactly ", rule, " = ", w.count);
    }
    if (s.first_position != w.first_position) {
      refuse(file, "section table inconsistent: ", where, ": first position ", s.first_position, ", expected ",
             w.first_position, " at position ", h.pos);
    }
    if (s.offset != w.offset) {
      refuse(file, "section table inconsistent: ", where, ": starts at byte ", s.offset, ", expected ", w.offset,
             " (sections follow the table and each other without gaps)");
    }
    h.sections.push_back(s);
  }
  const int64_t end = want.empty() ? session_fixed_bytes(0) : want.back().offset + want.back().bytes();
  if (end != size) {
    refuse(file, "section table inconsistent: the sections end at byte ", end, ", the file has ", size, " bytes");
  }

  // 3. Every section's checksum.
  for (size_t i = 0; i < h.sections.size(); ++i) {
    const SessionSectionInfo& s = h.sections[i];
    const uint32_t crc = crc32c(b + s.offset, static_cast<size_t>(s.bytes()));
    if (crc != s.crc) {
      refuse(file, describe(s, i, h.sections.size()), ": checksum mismatch (stored ", hex32(s.crc), ", computed ",
             hex32(crc), ")");
    }
  }
  return h;
}

}  // namespace dsv41::reference::session
