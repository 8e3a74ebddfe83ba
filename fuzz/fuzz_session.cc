// fuzz/fuzz_session.cc: reference::session::load_session_bytes (header, section table, checksums, every
// section's entries) on arbitrary bytes, against the oracle model (golden/oracle: config and
// weights, loaded once).
//
// Input: one control byte, then the file. Control bit 0: before loading, rewrite the header,
// table and section CRC-32Cs so they match (docs/session-store.md's layout), so mutations reach
// the checks behind the checksums instead of stopping at them; bit 1: ResumeMode::kGlobalOnly
// (encoder replay) instead of kFull.
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "reference/ops/config.h"
#include "base/crc32c.h"
#include "reference/model/model.h"
#include "reference/session/session_store.h"
#include "reference/checkpoint/weights.h"

namespace {

namespace ref = dsv41::reference;

struct Oracle {
  ref::ModelConfig config;
  std::unique_ptr<ref::model::Model> model;
};

const Oracle& oracle() {
  static const Oracle o = [] {
    const std::string dir = DSV41_SOURCE_DIR "/golden/oracle/";
    Oracle x;
    x.config = ref::load_config_file(dir + "config.json");
    x.model = std::make_unique<ref::model::Model>(x.config, ref::checkpoint::ModelWeights::load(dir + "weights.safetensors", x.config),
                                           ref::model::default_token_map(x.config));
    return x;
  }();
  return o;
}

uint64_t get_u64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);  // little endian host (x86-64, as the format)
  return v;
}
uint32_t get_u32(const std::vector<uint8_t>& b, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
void put_crc(std::vector<uint8_t>& b, size_t at, size_t from, size_t n) {
  const uint32_t c = dsv41::crc32c(b.data() + from, n);
  std::memcpy(b.data() + at, &c, 4);
}

// Makes every CRC-32C the file can hold consistent with the bytes it covers.
void fix_checksums(std::vector<uint8_t>& b) {
  if (b.size() < 48) return;
  put_crc(b, 44, 0, 44);
  const uint64_t n = get_u32(b, 40);
  const uint64_t table_end = 48 + 44 * n;
  if (n > (1u << 20) || table_end + 4 > b.size()) return;
  for (uint64_t i = 0; i < n; ++i) {
    const size_t e = 48 + 44 * i;
    const uint64_t entry_bytes = get_u32(b, e + 12), count = get_u64(b, e + 24), offset = get_u64(b, e + 32);
    if (count > b.size() || entry_bytes > b.size()) continue;
    const uint64_t len = entry_bytes * count;
    if (offset <= b.size() && len <= b.size() - offset) put_crc(b, e + 40, offset, len);
  }
  put_crc(b, table_end, 48, 44 * n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Oracle& o = oracle();
  const uint8_t control = data[0];
  std::vector<uint8_t> file(data + 1, data + size);
  if (control & 1) fix_checksums(file);
  const ref::session::ResumeMode mode = (control & 2) ? ref::session::ResumeMode::kGlobalOnly : ref::session::ResumeMode::kFull;
  dsv41::fuzz::accept([&] { (void)ref::session::load_session_bytes(file, "fuzz.dsv41s", o.config, *o.model, mode); });
  return 0;
}
