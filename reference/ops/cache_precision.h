// reference/ops/cache_precision.h
//
// CachePrecision: in which precision the reference keeps its caches, the official packed formats
// or a deliberately perturbed bf16 ablation (docs/attention.md, "Cache precision ablation").
//
//   kPacked (default)  the official path, bit for bit: compressed KV FP4 E2M1 + E4M3/16 QDQ after
//                      RoPE, index keys and index queries FP4 E2M1 + E8M0/32 QDQ, window (SWA) KV
//                      FP8 E4M3 + E8M0/32 QDQ; the caches store the packed entries.
//   kBf16              every one of those QDQ steps is skipped (the values stay the bf16 they
//                      were before it) and the caches store raw bf16: 2 bytes per value, the
//                      little-endian bf16 bit pattern (formats::CacheFormat::kBf16). Approximate
//                      by design: it measures what the packed formats cost, it is not a port.
//
// A ModelState records its precision; a Model refuses a state of the other one, and session
// files hold kPacked states only.
//
// Example:
//   model.set_cache_precision(CachePrecision::kBf16);
//   ModelState s = model.new_state();                       // bf16 caches
//   formats::CacheFormat f = stored_format(CachePrecision::kBf16, formats::CacheFormat::kWindowKvFp8);
//   // f == formats::CacheFormat::kBf16
#pragma once

#include "formats/cache_format.h"

namespace dsv41::reference {

enum class CachePrecision { kPacked, kBf16 };

// "packed" / "bf16": stable names, used in reports and errors.
inline const char* name(CachePrecision p) { return p == CachePrecision::kBf16 ? "bf16" : "packed"; }

// The format a cache stores: its official packed format, or kBf16 under the ablation.
inline formats::CacheFormat stored_format(CachePrecision p, formats::CacheFormat packed) {
  return p == CachePrecision::kBf16 ? formats::CacheFormat::kBf16 : packed;
}

}  // namespace dsv41::reference
