// tests/determinism/probe.cc
//
// dsv41_determinism_probe_<variant>: runs the oracle forward (golden/oracle: the tiny config, the
// oracle weights, the prefill prompt and the 8 decode tokens of decode.h5) and prints ONE line on
// stdout with a 64-bit FNV-1a hash over every output of the run:
//
//   fnv1a64=<16 hex digits> threads=<n> variant=<O3|O2|O0> prompt=<T> decode=<n>
//
// What is hashed, in this order (integers as 8 little-endian bytes, floats as their fp32 bits):
//   per step (prefill, then each decode step): start_pos, tokens, the logits, and every tensor of
//     StepRecord::topk, ::candidates, ::engram_ids, ::experts (map key, shape, values);
//   the final ModelState: pos; per layer the SWA ring (packed bytes, slot positions), the
//     compressor's partial group (fp32 kv / score slots, next_pos), the compressed-KV and
//     index-key caches (owner, ratio, offset, size and the packed bytes of every entry);
//     the Engram history ids.
// Every field is preceded by a tag, so two different runs cannot hash the same by shifting bytes
// between fields.
//
// The same source is linked once per optimisation level of the reference (tests/determinism/
// CMakeLists.txt); determinism_check.cmake runs the variants and asserts one hash. The product
// promise it checks: identical bits for any thread count, build type and run.
//
// Usage: probe [ORACLE_DIR [PROMPT_LEN]]
//   ORACLE_DIR  default: the source tree's golden/oracle
//   PROMPT_LEN  use the first PROMPT_LEN prompt tokens (default: all 333)
// The thread count comes from DSV41_THREADS (reference/ops/numerics.h). Errors: message on stderr,
// exit status 1.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "golden/golden_io.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reference/checkpoint/weights.h"

#ifndef DSV41_PROBE_VARIANT
#define DSV41_PROBE_VARIANT "unknown"
#endif

namespace dsv41::determinism {
namespace {

using reference::model::ModelState;
using reference::model::StepRecord;
using reference::Tensor;

// FNV-1a, 64 bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
class Fnv1a64 {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= 0x100000001b3ULL;
    }
  }
  void u64(uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(v >> (8 * i));
    bytes(le, sizeof le);
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void tag(const char* s) { bytes(s, std::strlen(s) + 1); }  // with its NUL: tags are delimited

  void value(uint8_t v) { u64(v); }
  void value(int32_t v) { i64(v); }
  void value(int64_t v) { i64(v); }
  void value(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  template <typename T>
  void values(const std::vector<T>& v) {
    u64(v.size());
    for (const T& x : v) value(x);
  }
  void raw(const std::vector<uint8_t>& v) {
    u64(v.size());
    bytes(v.data(), v.size());
  }
  template <typename T>
  void tensors(const char* name, const std::map<int, Tensor<T>>& m) {
    tag(name);
    u64(m.size());
    for (const auto& [layer, t] : m) {
      i64(layer);
      values(t.shape());
      values(t.data());
    }
  }

  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

void hash_step(Fnv1a64& h, const StepRecord& r) {
  h.tag("step");
  h.i64(r.start_pos);
  h.i64(r.tokens);
  h.tag("logits");
  h.values(r.logits);
  h.tensors("topk", r.topk);
  h.tensors("candidates", r.candidates);
  h.tensors("engram_ids", r.engram_ids);
  h.tensors("experts", r.experts);
}

// Entries [0, size) of a packed cache (compressed_kv or index_keys).
void hash_cache(Fnv1a64& h, const char* name, const reference::model::PackedCache& c) {
  h.tag(name);
  h.i64(c.owner_layer());
  h.i64(c.ratio());
  h.i64(c.position_offset());
  h.i64(c.size());
  h.i64(c.entry_bytes());
  for (int64_t e = 0; e < c.size(); ++e) h.bytes(c.entry(e), static_cast<size_t>(c.entry_bytes()));
}

void hash_state(Fnv1a64& h, const ModelState& s) {
  h.tag("state");
  h.i64(s.pos);
  h.u64(s.layers.size());
  // The tags are the names of the first version of this probe ("swa" = window_kv, "kv_cache" =
  // compressed_kv, "key_cache" = index_keys): kept, so that the hash of a run never changes.
  for (const reference::model::LayerState& l : s.layers) {
    h.tag("swa");
    h.i64(l.window_kv.window);
    h.i64(l.window_kv.head_dim);
    h.raw(l.window_kv.bytes.data());
    h.values(l.window_kv.positions);
    if (l.compressor) {
      h.tag("compressor");
      h.i64(l.compressor->ratio);
      h.i64(l.compressor->next_pos);
      h.values(l.compressor->kv.data());
      h.values(l.compressor->score.data());
    }
    if (l.compressed_kv) hash_cache(h, "kv_cache", *l.compressed_kv);
    if (l.index_keys) hash_cache(h, "key_cache", *l.index_keys);
  }
  h.tag("engram");
  h.i64(s.engram.pad_id());
  h.values(s.engram.ids());
}

int run(int argc, char** argv) {
  const std::string dir = (argc > 1 ? std::string(argv[1]) : std::string(DSV41_ORACLE_DIR)) + "/";
  const reference::ModelConfig config = reference::load_config_file(dir + "config.json");
  const golden::H5File prefill(dir + "prefill.h5");
  const golden::H5File decode(dir + "decode.h5");
  std::vector<int64_t> prompt = prefill.read<int64_t>("prefill/tokens/value").data;
  if (argc > 2) {
    const long n = std::strtol(argv[2], nullptr, 10);
    DSV41_CHECK(n >= 1 && static_cast<size_t>(n) <= prompt.size(), "PROMPT_LEN ", argv[2],
                " is outside [1, ", prompt.size(), "]");
    prompt.resize(static_cast<size_t>(n));
  }
  std::vector<int64_t> steps;
  for (int k = 0; decode.has("decode/step" + std::to_string(k)); ++k) {
    steps.push_back(decode.read<int64_t>("decode/step" + std::to_string(k) + "/input_token/value").data.at(0));
  }
  DSV41_CHECK(steps.size() == 8, "decode.h5 has ", steps.size(), " steps, expected 8");

  const reference::model::Model model(config, reference::checkpoint::ModelWeights::load(dir + "weights.safetensors", config),
                               prefill.read<int64_t>("prefill/state/engram/token_map/value").data);
  const auto t0 = std::chrono::steady_clock::now();
  ModelState state = model.new_state();
  Fnv1a64 h;
  hash_step(h, model.prefill(state, prompt));
  for (int64_t token : steps) hash_step(h, model.decode(state, token));
  hash_state(h, state);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("fnv1a64=%016llx threads=%d variant=%s prompt=%zu decode=%zu\n",
              static_cast<unsigned long long>(h.digest()), reference::reference_threads(),
              DSV41_PROBE_VARIANT, prompt.size(), steps.size());
  std::fprintf(stderr, "forward (prefill + decode): %.3f s\n", secs);
  return 0;
}

}  // namespace
}  // namespace dsv41::determinism

int main(int argc, char** argv) {
  try {
    return dsv41::determinism::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "determinism probe: %s\n", e.what());
    return 1;
  }
}
