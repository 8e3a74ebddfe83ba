// reference/session/session_store: every single-bit flip and every truncation of a saved file is refused
// with a dsv41::Error, never a crash or a successful load; so are wrong configs, versions (formats 1
// and 2 included) and magics, inconsistent section tables and entries the formats cannot have written
// (docs/session-store.md). Sampled bit flips come from the printed data seed (DSV41_SEED
// overrides). Fixture and layout helpers: tests/support/session_store_util.h.
#include "tests/support/session_store_util.h"

namespace dsv41::reference::session {
namespace {

// ---- corruption ----

// Flips each bit in `bits` of `file` in turn (flipping it back after) and expects every load to
// be refused with a dsv41::Error naming the file; a flip inside a section's payload must be
// reported as that section's checksum mismatch.
void expect_every_flip_refused(std::vector<uint8_t> file, const std::vector<size_t>& bits) {
  const Fixture f = fixture();
  const size_t n = n_sections(file);
  const size_t payload_start = 48 + 44 * n + 4;
  int64_t failures = 0;
  for (size_t bit : bits) {
    const size_t byte = bit / 8;
    file[byte] ^= static_cast<uint8_t>(1u << (bit % 8));
    const std::string e = error_of([&] { load_session_bytes(file, "flipped.dsv41s", f.config, *f.model); });
    std::string want = "session file 'flipped.dsv41s': ";
    if (byte >= payload_start) {
      size_t i = 0;
      while (i + 1 < n && section_offset(file, i + 1) <= byte) ++i;
      want = "section " + std::to_string(i + 1) + " of " + std::to_string(n) + " (";
    }
    if (!has(e, want) || (byte >= payload_start && !has(e, "checksum mismatch"))) {
      if (++failures <= 10) ADD_FAILURE() << "bit " << bit << " (byte " << byte << "): " << e;
    }
    file[byte] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(failures, 0);
}

std::vector<size_t> all_bits(size_t from_byte, size_t to_byte) {
  std::vector<size_t> out;
  for (size_t b = 8 * from_byte; b < 8 * to_byte; ++b) out.push_back(b);
  return out;
}

class SessionStoreCorruption : public ScratchTest {};

// The global-only file of a 12-token session (a few KB): every bit, the token tail's included.
TEST_F(SessionStoreCorruption, EveryBitFlipOfAGlobalFileIsRefused) {
  const std::vector<uint8_t> file = session_bytes(prefilled(12), fixture().config, false);
  ASSERT_EQ(section_bytes(file, find_section(file, SessionSection::kTokenTail)), 12u * 8);
  const std::vector<size_t> bits = all_bits(0, file.size());
  std::printf("[bit flips] global-only file of %zu bytes: all %zu bits flipped\n", file.size(), bits.size());
  expect_every_flip_refused(file, bits);
}

// The full file of a 13-token session (~95 KB, most of it SWA rings): every bit of the header,
// the section table and the global sections (a pending group and the token tail included), and a
// sample of the SWA sections' bits (every ring, from the data seed).
TEST_F(SessionStoreCorruption, BitFlipsOfAFullFileAreRefused) {
  const std::vector<uint8_t> file = session_bytes(prefilled(13), fixture().config, true);
  const size_t first_swa = section_offset(file, find_section(file, SessionSection::kWindowKv));
  std::vector<size_t> bits = all_bits(0, first_swa);
  const size_t exhaustive = bits.size();
  constexpr size_t kSampled = 20000;
  std::mt19937_64 rng(test::seed_for("session_store/swa_bit_flips"));
  std::uniform_int_distribution<size_t> pick(8 * first_swa, 8 * file.size() - 1);
  for (size_t k = 0; k < kSampled; ++k) bits.push_back(pick(rng));
  // The DSpark ring section (the last one): every bit of its first two slots (slot 0 filled, the
  // empty slot 13 is not among them) and of its last slot, and a seeded sample of the rest.
  const size_t dspark = find_section(file, SessionSection::kDSparkRing, fixture().config.n_layers);
  ASSERT_EQ(dspark + 1, n_sections(file));
  const size_t d0 = section_offset(file, dspark), slot = section_bytes(file, dspark) / 64;
  const std::vector<size_t> head = all_bits(d0, d0 + 2 * slot), tail = all_bits(file.size() - slot, file.size());
  bits.insert(bits.end(), head.begin(), head.end());
  bits.insert(bits.end(), tail.begin(), tail.end());
  std::uniform_int_distribution<size_t> pick_dspark(8 * d0, 8 * file.size() - 1);
  for (size_t k = 0; k < 5000; ++k) bits.push_back(pick_dspark(rng));
  bits.push_back(8 * file.size() - 1);  // the very last bit
  std::printf("[bit flips] full file of %zu bytes: all %zu bits of header, table and global sections "
              "(%zu bytes), %zu sampled bits of the SWA and DSpark ring sections (every bit of 3 of the "
              "DSpark ring's 64 slots)\n",
              file.size(), exhaustive, first_swa, bits.size() - exhaustive);
  expect_every_flip_refused(file, bits);
}

// Through real files: a flip in the first and last byte of every section.
TEST_F(SessionStoreCorruption, FlippedFilesAreRefused) {
  const Fixture f = fixture();
  const std::vector<uint8_t> good = session_bytes(prefilled(13), f.config, true);
  const std::string path = scratch() + "/flipped.dsv41s";
  for (size_t i = 0; i < n_sections(good); ++i) {
    for (size_t at : {section_offset(good, i), section_offset(good, i) + section_bytes(good, i) - 1}) {
      if (section_bytes(good, i) == 0) continue;
      std::vector<uint8_t> bad = good;
      bad[at] ^= 0x10;
      write_file(path, bad);
      const std::string e = error_of([&] { load_session(path, f.config, *f.model); });
      EXPECT_TRUE(has(e, "session file '" + path + "': section " + std::to_string(i + 1) + " of ")) << e;
      EXPECT_TRUE(has(e, "checksum mismatch")) << e;
    }
  }
}

TEST_F(SessionStoreCorruption, TruncationIsRefused) {
  const Fixture f = fixture();
  const std::vector<uint8_t> file = session_bytes(prefilled(13), f.config, true);
  const size_t table_end = 48 + 44 * n_sections(file) + 4;
  std::vector<size_t> lengths;
  for (size_t len = 0; len <= table_end; ++len) lengths.push_back(len);  // every length of the header and table
  for (size_t len = table_end + 1; len < file.size(); len += 61) lengths.push_back(len);
  for (size_t i = 0; i < n_sections(file); ++i) {  // around every section boundary
    for (size_t d : {0, 1}) lengths.push_back(section_offset(file, i) + d);
  }
  const size_t dspark = find_section(file, SessionSection::kDSparkRing, f.config.n_layers);
  const size_t slot = section_bytes(file, dspark) / static_cast<size_t>(f.config.window_size);
  for (size_t at = section_offset(file, dspark); at < file.size(); at += slot) {  // every DSpark ring slot
    for (size_t d : {0, 1, 8}) lengths.push_back(at + d);                       // and its entry
  }
  lengths.push_back(file.size() - 1);
  for (size_t len : lengths) {
    if (len >= file.size()) continue;
    const std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(len));
    const std::string e = error_of([&] { load_session_bytes(cut, "cut.dsv41s", f.config, *f.model); });
    ASSERT_TRUE(has(e, "session file 'cut.dsv41s': truncated: " + std::to_string(len) + " bytes")) << len << ": " << e;
  }
  std::printf("[truncation] %zu lengths of a %zu-byte file refused\n", lengths.size(), file.size());
  // Through a file, and trailing bytes.
  const std::string path = scratch() + "/cut.dsv41s";
  write_file(path, std::vector<uint8_t>(file.begin(), file.begin() + 100));
  EXPECT_TRUE(has(error_of([&] { load_session(path, f.config, *f.model); }), "truncated: 100 bytes"));
  std::vector<uint8_t> longer = file;
  longer.push_back(0);
  EXPECT_TRUE(has(load_error(longer, f.config), "(trailing bytes)")) << load_error(longer, f.config);
}

// ---- refusals with clear messages ----

class SessionStoreErrors : public ScratchTest {};

TEST_F(SessionStoreErrors, AnotherConfigIsRefused) {
  const Fixture f = fixture();
  const std::string path = scratch() + "/tiny.dsv41s";
  save_session(path, prefilled(12), f.config, true);
  const ModelConfig full = load_config("full");
  const std::string e = error_of([&] { load_session(path, full, *f.model); });
  EXPECT_TRUE(has(e, "session file '" + path + "': config hash mismatch: the file was saved with config " +
                         config_hash(f.config) + ", the config given has hash " + config_hash(full)))
      << e;
  EXPECT_TRUE(has(error_of([&] { read_session_header(path, full); }), "config hash mismatch"));
}

// A file of an older format as that version wrote it: `v3` without the sections of the kinds
// `dropped` (offsets shifted, counts and CRCs recomputed), labelled `version`. Format 2 had no
// DSpark rings; format 1 had no token tail either.
std::vector<uint8_t> as_older_format(const std::vector<uint8_t>& v3, uint32_t version,
                                     const std::vector<SessionSection>& dropped) {
  const size_t n = n_sections(v3);
  std::vector<size_t> kept;
  for (size_t i = 0; i < n; ++i) {
    const auto kind = static_cast<SessionSection>(get_u32(v3, table_entry(i)));
    if (std::find(dropped.begin(), dropped.end(), kind) == dropped.end()) kept.push_back(i);
  }
  std::vector<uint8_t> out(v3.begin(), v3.begin() + 48), payloads;
  size_t offset = 48 + 44 * kept.size() + 4;
  for (size_t i : kept) {
    std::vector<uint8_t> e(v3.begin() + static_cast<std::ptrdiff_t>(table_entry(i)),
                           v3.begin() + static_cast<std::ptrdiff_t>(table_entry(i) + 44));
    set_u64(e, 32, offset);
    offset += section_bytes(v3, i);
    out.insert(out.end(), e.begin(), e.end());
    const auto from = v3.begin() + static_cast<std::ptrdiff_t>(section_offset(v3, i));
    payloads.insert(payloads.end(), from, from + static_cast<std::ptrdiff_t>(section_bytes(v3, i)));
  }
  out.resize(out.size() + 4);
  out.insert(out.end(), payloads.begin(), payloads.end());
  set_u32(out, 8, version);
  set_u64(out, 32, out.size());
  set_u32(out, 40, static_cast<uint32_t>(kept.size()));
  fix_header_crc(out);
  fix_table_crc(out);
  return out;
}

TEST_F(SessionStoreErrors, WrongVersionIsRefused) {
  const ModelConfig& c = fixture().config;
  std::vector<uint8_t> b = session_bytes(prefilled(12), c, true);
  EXPECT_EQ(get_u32(b, 8), 3u);
  set_u32(b, 8, 4);
  EXPECT_TRUE(has(load_error(b, c), "unsupported format version 4 (this build reads version 3)")) << load_error(b, c);
  fix_header_crc(b);  // a well-formed header of another version
  EXPECT_TRUE(has(load_error(b, c), "unsupported format version 4"));
  set_u32(b, 8, 0);
  fix_header_crc(b);
  EXPECT_TRUE(has(load_error(b, c), "unsupported format version 0 (this build reads version 3)")) << load_error(b, c);

  // Formats 1 and 2 as they were written: refused with both versions, what changed and what to
  // do, in both modes and by the header check.
  const std::string v2_why = "(version 3 added the DSpark rings of speculative decoding)";
  const std::string v1_why = "(version 2 added the token tail that a global-only resume replays, version 3 the "
                             "DSpark rings of speculative decoding)";
  for (bool swa : {false, true}) {
    SCOPED_TRACE(swa ? "with rings" : "global only");
    const std::vector<uint8_t> v3 = session_bytes(prefilled(12), c, swa);
    for (uint32_t version : {1u, 2u}) {
      std::vector<SessionSection> dropped = {SessionSection::kDSparkRing};
      if (version == 1) dropped.push_back(SessionSection::kTokenTail);
      const std::vector<uint8_t> old = as_older_format(v3, version, dropped);
      EXPECT_EQ(n_sections(old), n_sections(v3) - (swa ? 1 : 0) - (version == 1 ? 1 : 0));
      const std::string path = scratch() + "/v" + std::to_string(version) + ".dsv41s";
      write_file(path, old);
      const std::string want = "session file '" + path + "': format version " + std::to_string(version) +
                               " is not read by this build: this build reads version 3 " +
                               (version == 1 ? v1_why : v2_why) +
                               "; re-save the session with this build (run it again and save it)";
      const std::string e = error_of([&] { load_session(path, c, *fixture().model); });
      EXPECT_TRUE(has(e, want)) << e;
      EXPECT_TRUE(has(error_of([&] { load_session(path, c, *fixture().model, ResumeMode::kGlobalOnly); }), want));
      EXPECT_TRUE(has(error_of([&] { read_session_header(path, c); }), want));
      // The same bytes labelled format 3: a valid file but for the missing sections (a format 2
      // file without rings has format 3's layout: only its version keeps it out).
      std::vector<uint8_t> relabelled = old;
      set_u32(relabelled, 8, 3);
      fix_header_crc(relabelled);
      if (version == 2 && !swa) {
        EXPECT_EQ(relabelled, v3);
      } else {
        EXPECT_TRUE(has(load_error(relabelled, c), "section table inconsistent")) << load_error(relabelled, c);
      }
    }
  }
}

TEST_F(SessionStoreErrors, WrongMagicIsRefused) {
  std::vector<uint8_t> b = session_bytes(prefilled(12), fixture().config, true);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "DSV41SES");
  b[0] = 'X';
  EXPECT_TRUE(has(load_error(b, fixture().config),
                  "session file 'patched.dsv41s': not a dsv41 session file (wrong magic \"XSV41SES\""))
      << load_error(b, fixture().config);
  const std::string path = scratch() + "/text.txt";
  std::ofstream(path) << "this is not a session file at all, but it is long enough for a header\n";
  EXPECT_TRUE(has(error_of([&] { load_session(path, fixture().config, *fixture().model); }), "wrong magic"));
  EXPECT_TRUE(has(error_of([&] { load_session(scratch() + "/absent", fixture().config, *fixture().model); }),
                  "session file '" + scratch() + "/absent': cannot open"));
  EXPECT_TRUE(has(error_of([&] { load_session(scratch(), fixture().config, *fixture().model); }), "not a regular file"));
}

TEST_F(SessionStoreErrors, HeaderAndTableChecksumsAreNamed) {
  std::vector<uint8_t> b = session_bytes(prefilled(12), fixture().config, true);
  std::vector<uint8_t> h = b;
  h[24] ^= 1;  // pos
  EXPECT_TRUE(has(load_error(h, fixture().config), "header checksum mismatch (stored 0x")) << load_error(h, fixture().config);
  std::vector<uint8_t> t = b;
  t[table_entry(3) + 24] ^= 1;  // a count
  EXPECT_TRUE(has(load_error(t, fixture().config), "section table checksum mismatch")) << load_error(t, fixture().config);
}

// Tables with valid checksums that contradict the config or pos.
TEST_F(SessionStoreErrors, InconsistentSectionTableIsRefused) {
  const ModelConfig& c = fixture().config;
  const std::vector<uint8_t> good = session_bytes(prefilled(12), c, true);
  {  // pos 14 with the entries of pos 12: layer 2 must hold 14 / 2 = 7 entries
    std::vector<uint8_t> b = good;
    set_u64(b, 24, 14);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "section table inconsistent: section 1 of 21 (compressed KV of layer 2): holds 6 "
                                      "entries, but a state at position 14 holds exactly pos / ratio = 7"))
        << load_error(b, c);
  }
  {  // the table's own count disagrees
    std::vector<uint8_t> b = good;
    set_u64(b, table_entry(1) + 24, 5);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(index keys of layer 2): holds 5 entries")) << load_error(b, c);
  }
  {  // another owner
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 4, 3);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "the table names layer 3 with ratio 2, but the config's schedule has kv source "
                                      "layer 2 with ratio 2 there"))
        << load_error(b, c);
  }
  {  // another ratio
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 8, 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "the table names layer 2 with ratio 1")) << load_error(b, c);
  }
  {  // another entry size
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 12, 288);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "entries of 288 bytes, the config's are 72")) << load_error(b, c);
  }
  {  // a gap between sections
    std::vector<uint8_t> b = good;
    set_u64(b, table_entry(2) + 32, section_offset(good, 2) + 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "starts at byte")) << load_error(b, c);
  }
  {  // the SWA flag cleared: the table has 11 sections too many (10 SWA rings, 1 DSpark ring)
    std::vector<uint8_t> b = good;
    set_u32(b, 12, 0);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "21 sections, but a state of this config without SWA rings has 10")) << load_error(b, c);
  }
  {  // the token tail: 12 ids at position 12, first position 0
    std::vector<uint8_t> b = good;
    const size_t i = find_section(b, SessionSection::kTokenTail);
    EXPECT_EQ(i, 9u);
    set_u64(b, table_entry(i) + 24, 11);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "section 10 of 21 (token tail): holds 11 entries, but a state at position 12 "
                                      "holds exactly min(pos, window_size + engram_max_ngram_size - 1) = 12"))
        << load_error(b, c);
    b = good;
    set_u64(b, table_entry(i) + 16, 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): first position 1, expected 0 at position 12")) << load_error(b, c);
    b = good;
    set_u32(b, table_entry(i) + 4, 0);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): the table names layer 0 with ratio 0, but the config's schedule "
                                      "has layer -1 with ratio 0 there"))
        << load_error(b, c);
    b = good;
    set_u32(b, table_entry(i), 4);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): the table has kind 4, the config's layout has kind 6 there"))
        << load_error(b, c);
  }
  {  // unknown flags
    std::vector<uint8_t> b = good;
    set_u32(b, 12, 3);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "unknown header flags 0x00000003")) << load_error(b, c);
  }
}

// Entries the formats cannot have written, with every checksum valid.
TEST_F(SessionStoreErrors, CorruptEntriesAreRefused) {
  const ModelConfig& c = fixture().config;
  const std::vector<uint8_t> good = session_bytes(prefilled(13), c, true);
  const auto patched = [&](SessionSection kind, int layer, size_t at, std::vector<uint8_t> value) {
    std::vector<uint8_t> b = good;
    const size_t i = find_section(b, kind, layer);
    std::copy(value.begin(), value.end(), b.begin() + static_cast<std::ptrdiff_t>(section_offset(b, i) + at));
    fix_section_crc(b, i);
    return load_error(b, c);
  };
  const size_t kv_scale = static_cast<size_t>(c.head_dim / 2), key_scale = static_cast<size_t>(c.index_head_dim / 2);
  std::string e = patched(SessionSection::kCompressedKv, 4, 72 + kv_scale + 1, {0xFF});
  EXPECT_TRUE(has(e, "(compressed KV of layer 4): compressed KV cache of layer 4: entry 1 block 1 has scale byte 0xff, "
                     "not an E4M3 scale the quantizer writes [0x01, 0x7e]"))
      << e;
  e = patched(SessionSection::kCompressedKv, 2, kv_scale, {0x00});
  EXPECT_TRUE(has(e, "entry 0 block 0 has scale byte 0x00")) << e;
  e = patched(SessionSection::kIndexKeys, 6, key_scale, {0xFF});
  EXPECT_TRUE(has(e, "(index keys of layer 6): index-key cache of layer 6: entry 0 block 0 has scale byte 0xff")) << e;
  e = patched(SessionSection::kWindowKv, 3, 0, {1});  // slot 0 claims position 1
  EXPECT_TRUE(has(e, "(SWA ring of layer 3): slot 0 holds position 1, but at position 13 slot 0 holds 0")) << e;
  e = patched(SessionSection::kWindowKv, 3, 8 + 5, {0x7F});
  EXPECT_TRUE(has(e, "slot 0 (position 0) byte 5 is 0x7f: an E4M3 NaN code")) << e;
  e = patched(SessionSection::kWindowKv, 3, 8 + static_cast<size_t>(c.head_dim), {0xFF});
  EXPECT_TRUE(has(e, "is 0xff: not an E8M0 scale the quantizer writes")) << e;
  const size_t empty_slot = 20 * (8 + static_cast<size_t>(c.head_dim + c.head_dim / 32));
  e = patched(SessionSection::kWindowKv, 3, empty_slot + 8, {0x01});
  EXPECT_TRUE(has(e, "slot 20 (position -1) byte 0 is 0x01: an empty slot holds zeros")) << e;
  // The DSpark ring (layer n_layers = 10), validated as the SWA rings are.
  e = patched(SessionSection::kDSparkRing, 10, 0, {1});
  EXPECT_TRUE(has(e, "section 21 of 21 (DSpark ring of layer 10): slot 0 holds position 1, but at position 13 slot 0 "
                     "holds 0"))
      << e;
  e = patched(SessionSection::kDSparkRing, 10, 13 * 140, {13, 0, 0, 0, 0, 0, 0, 0});  // empty slot 13 claims 13
  EXPECT_TRUE(has(e, "(DSpark ring of layer 10): slot 13 holds position 13, but at position 13 slot 13 holds -1")) << e;
  e = patched(SessionSection::kDSparkRing, 10, 2 * 140 + 8 + 5, {0xFF});
  EXPECT_TRUE(has(e, "(DSpark ring of layer 10): slot 2 (position 2) byte 5 is 0xff: an E4M3 NaN code")) << e;
  e = patched(SessionSection::kDSparkRing, 10, 12 * 140 + 8 + static_cast<size_t>(c.head_dim) + 3, {0xFF});
  EXPECT_TRUE(has(e, "(DSpark ring of layer 10): slot 12 (position 12) byte 131 is 0xff: not an E8M0 scale the "
                     "quantizer writes"))
      << e;
  e = patched(SessionSection::kDSparkRing, 10, 63 * 140 + 8 + 7, {0x01});
  EXPECT_TRUE(has(e, "(DSpark ring of layer 10): slot 63 (position -1) byte 7 is 0x01: an empty slot holds zeros")) << e;
  e = patched(SessionSection::kEngramTail, -1, 8, {0x00, 0x10, 0, 0, 0, 0, 0, 0});
  EXPECT_TRUE(has(e, "(Engram tail): position 11 holds compressed id 4096, outside [0, engram_compressed_vocab_size 512)"))
      << e;
  e = patched(SessionSection::kTokenTail, -1, 8 * 12, {0x00, 0x04, 0, 0, 0, 0, 0, 0});
  EXPECT_TRUE(has(e, "section 10 of 21 (token tail): position 12 holds token id 1024, outside the vocab [0, 1024)")) << e;
  e = patched(SessionSection::kTokenTail, -1, 0, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  EXPECT_TRUE(has(e, "(token tail): position 0 holds token id -1, outside the vocab [0, 1024)")) << e;
  e = patched(SessionSection::kCompressorPending, 4, 4 * 7, {0x00, 0x00, 0xC0, 0x7F});
  EXPECT_TRUE(has(e, "(compressor pending group of layer 4): slot 0: kv channel 7 is not finite (bits 0x7fc00000)")) << e;
}

}  // namespace
}  // namespace dsv41::reference::session
