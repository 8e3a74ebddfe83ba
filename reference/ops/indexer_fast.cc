// reference/ops/indexer_fast.cc: index_scores' integer path (IndexScoresPath::kInteger), the same
// bits as the double path (indexer.cc's scores16) by exact integer dots: the argument of the CUDA
// twin's tensor-core path (cuda/indexer.cu), with wider codes and no condition on the weights.
//
// Encoding (encode_row). A row of d fp32 values (one (query, head) row of q, or one key) is ENCODED
// when every value is finite and, with e = the smallest exponent of a lowest set bit over its
// nonzero values (0 for an all-zero row), every value is v = c 2^e with an integer |c| <= 2047
// (int16 codes). An FP4-QDQ row (E2M1 x E8M0: every value 1 or 3 times a power of two, at most
// 12 x its block's scale / 2) is encoded whenever its 32-channel scales span at most x128
// (12 x 128 = 1536 <= 2047). A pair (query row t, key j) takes the integer path when all of t's
// head rows and j are encoded and d <= 512; every other pair takes scores16.
//
// Why the bits are the double path's, for a query head row (codes cq, exponent eq) and a key (ck, ek):
// 1. I = sum_i cq[i] ck[i] is an exact int32 in ANY order and grouping: |cq ck| <= 2047^2 < 2^22 and
//    d <= 512 terms keep every partial sum below 2^31. So the kernels below (AVX-512 VNNI, AVX-512BW,
//    AVX2 pmaddwd pairs, or a plain loop) all give the same integer: the scores do not depend on the
//    machine or the thread count.
// 2. The double path's dot is exactly I 2^(eq+ek): each product q[i] k[i] = cq ck 2^(eq+ek) has at most
//    22 significant bits with eq + ek in [-298, 254] (fp32 lowest-bit exponents are in [-149, 127]), so
//    it is exact in double; every partial sum of its index-order chain is an integer multiple of
//    2^(eq+ek) below 2^31 2^(eq+ek), exactly representable, so every addition is exact; and an exact
//    zero is +0 (the chain starts at +0; x + (-x) is +0 under round to nearest), as is 0 2^(eq+ek).
// 3. Here that double is double(I) 2^eq 2^ek (int32 -> double is exact; multiplying by powers of two
//    inside double's normal range is exact), and it is rounded to fp32 by the same single conversion
//    (round to nearest even, subnormals and overflow to inf alike). So each fp32 dot is bit-identical.
// 4. From the fp32 dot on, the same fp32 operations on the same values in the same order, per lane:
//    bf16 (bf16_lanes is formats::bf16_encode/bf16_decode on a vector), relu as dot > 0 ? dot : 0,
//    times w (one fp32 product; -ffp-contract=off, and a rounding follows), bf16, sum += term in head
//    order from +0, a final bf16. IEEE vector lanes give the scalar operations' bits.
#include "reference/ops/indexer_fast.h"

#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSV41_INDEXER_X86 1
#include <immintrin.h>
#else
#define DSV41_INDEXER_X86 0
#endif

namespace dsv41::reference::indexer_detail {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr int kMaxCode = 2047;    // |c| of an encoded value
constexpr int64_t kMaxDim = 512;  // d kMaxCode^2 < 2^31: I and every partial sum fit int32

typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));
typedef double v16d __attribute__((vector_size(128)));

// ---- encoding ----

// The exponent of the lowest set bit of a nonzero finite fp32 magnitude (bits without the sign),
// and its odd significand: |v| = odd 2^lsb.
int lowest_bit_exponent(uint32_t bits, uint32_t* odd) {
  const uint32_t ex = bits >> 23, m = bits & 0x7FFFFFu;
  const uint32_t sig = ex != 0 ? (m | 0x800000u) : m;
  const int tz = __builtin_ctz(sig);
  *odd = sig >> tz;
  return (ex != 0 ? static_cast<int>(ex) - 150 : -149) + tz;
}

// v [d] fp32 -> codes [d] int16 with v[i] = codes[i] 2^e exactly, *scale = 2^e. Returns false (the row
// is not encoded; codes and scale unspecified) when a value is not finite or needs |code| > kMaxCode.
bool encode_row(const float* v, int64_t d, int16_t* codes, double* scale) {
  int emin = INT_MAX;
  for (int64_t i = 0; i < d; ++i) {
    uint32_t bits = 0, odd = 0;
    std::memcpy(&bits, v + i, 4);
    bits &= 0x7FFFFFFFu;
    if (bits >= 0x7F800000u) return false;  // inf or NaN
    if (bits != 0) emin = std::min(emin, lowest_bit_exponent(bits, &odd));
  }
  if (emin == INT_MAX) emin = 0;  // an all-zero row (+0 and -0 alike: code 0)
  for (int64_t i = 0; i < d; ++i) {
    uint32_t bits = 0, odd = 0;
    std::memcpy(&bits, v + i, 4);
    codes[i] = 0;
    if ((bits & 0x7FFFFFFFu) == 0) continue;
    const int shift = lowest_bit_exponent(bits & 0x7FFFFFFFu, &odd) - emin;  // >= 0
    if (shift > 11 || (static_cast<uint64_t>(odd) << shift) > static_cast<uint64_t>(kMaxCode)) return false;
    const int mag = static_cast<int>(odd << shift);
    codes[i] = static_cast<int16_t>((bits >> 31) != 0 ? -mag : mag);
  }
  *scale = std::ldexp(1.0, emin);  // emin in [-149, 127]: an exact double
  return true;
}

// ---- the per-lane fp32 steps (step 4 of the header) ----

// x = bf16(x) in every lane: formats::bf16_encode then bf16_decode (NaN -> the canonical 0x7FC0).
inline __attribute__((always_inline)) void bf16_lanes(v16f& x) {
  v16u b;
  std::memcpy(&b, &x, sizeof b);
  const v16u rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  const v16u nan = {0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u,
                    0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u,
                    0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u};
  b = (b & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
  std::memcpy(&x, &b, sizeof x);
}

// The scores of one query against 16 keys from their exact dots: dots [heads, 16] = I (step 1),
// q_scale [heads] = 2^eq, ks [16] = 2^ek, w [heads] -> out [16] =
// bf16(sum over heads in order of bf16(relu(bf16(fp32(I 2^eq 2^ek))) * w)).
// (Its own clones: the 16-lane double and fp32 vectors are one or two registers with AVX-512.)
#if DSV41_INDEXER_X86 && DSV41_CPU_CLONES
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void scores_from_dots(const int32_t* dots, const double* q_scale, const double* ks, const float* w, int64_t heads,
                      float* out) {
  v16d k_scale;
  std::memcpy(&k_scale, ks, sizeof k_scale);
  const v16f zero = {};
  v16f sum = {};
  for (int64_t h = 0; h < heads; ++h) {
    v16i dot;
    std::memcpy(&dot, dots + h * 16, sizeof dot);
    const v16d exact = __builtin_convertvector(dot, v16d) * q_scale[h] * k_scale;  // the double path's sum (2, 3)
    v16f d32 = __builtin_convertvector(exact, v16f);
    bf16_lanes(d32);
    v16f term = (d32 > zero ? d32 : zero) * w[h];
    bf16_lanes(term);
    sum += term;
  }
  bf16_lanes(sum);
  std::memcpy(out, &sum, sizeof sum);
}

// ---- the kernels: the exact dots of one query's head rows against a group of 16 keys ----
// qc [heads, 2 pairs] int16 (channel d padded with 0 when d is odd); kc [pairs, 16, 2] int16 (key l's
// channels 2p, 2p+1 at kc[p * 32 + 2 l], kc[p * 32 + 2 l + 1]) -> dots [heads, 16] int32 = I (step 1).
using Kernel = void (*)(const int16_t* qc, int64_t heads, const int16_t* kc, int64_t pairs, int32_t* dots);

void kernel_generic(const int16_t* qc, int64_t heads, const int16_t* kc, int64_t pairs, int32_t* dots) {
  for (int64_t h = 0; h < heads; ++h) {
    const int16_t* a = qc + h * 2 * pairs;
    int32_t dot[16] = {};
    for (int64_t p = 0; p < pairs; ++p) {
      for (int l = 0; l < 16; ++l) {
        dot[l] += int32_t{kc[p * 32 + 2 * l]} * a[2 * p] + int32_t{kc[p * 32 + 2 * l + 1]} * a[2 * p + 1];
      }
    }
    std::memcpy(dots + h * 16, dot, sizeof dot);
  }
}

#if DSV41_INDEXER_X86
// The query pair (channels 2p, 2p+1) of a head row in one int32, as pmaddwd pairs them.
inline int32_t query_pair(const int16_t* a, int64_t p) {
  int32_t pair = 0;
  std::memcpy(&pair, a + 2 * p, 4);
  return pair;
}

// NH head rows at once (independent accumulator chains; each key load serves NH heads).
template <int NH>
__attribute__((target("avx2"), always_inline)) inline void dots_avx2(const int16_t* qc, const int16_t* kc,
                                                                     int64_t pairs, int32_t* dots) {
  __m256i lo[NH], hi[NH];  // keys 0..7, 8..15
  for (int j = 0; j < NH; ++j) lo[j] = hi[j] = _mm256_setzero_si256();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kc + p * 32));
    const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kc + p * 32 + 16));
    for (int j = 0; j < NH; ++j) {
      const __m256i x = _mm256_set1_epi32(query_pair(qc + j * 2 * pairs, p));
      lo[j] = _mm256_add_epi32(lo[j], _mm256_madd_epi16(k0, x));
      hi[j] = _mm256_add_epi32(hi[j], _mm256_madd_epi16(k1, x));
    }
  }
  for (int j = 0; j < NH; ++j) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dots + j * 16), lo[j]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dots + j * 16 + 8), hi[j]);
  }
}

template <int NH>
__attribute__((target("avx512bw"), always_inline)) inline void dots_avx512bw(const int16_t* qc, const int16_t* kc,
                                                                             int64_t pairs, int32_t* dots) {
  __m512i acc[NH];
  for (int j = 0; j < NH; ++j) acc[j] = _mm512_setzero_si512();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i k = _mm512_loadu_si512(kc + p * 32);
    for (int j = 0; j < NH; ++j) {
      acc[j] = _mm512_add_epi32(acc[j], _mm512_madd_epi16(k, _mm512_set1_epi32(query_pair(qc + j * 2 * pairs, p))));
    }
  }
  for (int j = 0; j < NH; ++j) _mm512_storeu_si512(dots + j * 16, acc[j]);
}

template <int NH>
__attribute__((target("avx512bw,avx512vnni"), always_inline)) inline void dots_avx512vnni(const int16_t* qc,
                                                                                          const int16_t* kc,
                                                                                          int64_t pairs, int32_t* dots) {
  __m512i acc[NH];
  for (int j = 0; j < NH; ++j) acc[j] = _mm512_setzero_si512();
  for (int64_t p = 0; p < pairs; ++p) {  // vpdpwssd: pmaddwd and the add in one instruction
    const __m512i k = _mm512_loadu_si512(kc + p * 32);
    for (int j = 0; j < NH; ++j) {
      acc[j] = _mm512_dpwssd_epi32(acc[j], k, _mm512_set1_epi32(query_pair(qc + j * 2 * pairs, p)));
    }
  }
  for (int j = 0; j < NH; ++j) _mm512_storeu_si512(dots + j * 16, acc[j]);
}

// The heads in blocks of 8, then 4, then one at a time.
#define DSV41_KERNEL_OVER_HEADS(DOTS)                                                        \
  int64_t h = 0;                                                                             \
  for (; h + 8 <= heads; h += 8) DOTS<8>(qc + h * 2 * pairs, kc, pairs, dots + h * 16);      \
  for (; h + 4 <= heads; h += 4) DOTS<4>(qc + h * 2 * pairs, kc, pairs, dots + h * 16);      \
  for (; h < heads; ++h) DOTS<1>(qc + h * 2 * pairs, kc, pairs, dots + h * 16);

__attribute__((target("avx2"))) void kernel_avx2(const int16_t* qc, int64_t heads, const int16_t* kc, int64_t pairs,
                                                 int32_t* dots) {
  DSV41_KERNEL_OVER_HEADS(dots_avx2)
}
__attribute__((target("avx512bw"))) void kernel_avx512bw(const int16_t* qc, int64_t heads, const int16_t* kc,
                                                         int64_t pairs, int32_t* dots) {
  DSV41_KERNEL_OVER_HEADS(dots_avx512bw)
}
__attribute__((target("avx512bw,avx512vnni"))) void kernel_avx512vnni(const int16_t* qc, int64_t heads,
                                                                      const int16_t* kc, int64_t pairs,
                                                                      int32_t* dots) {
  DSV41_KERNEL_OVER_HEADS(dots_avx512vnni)
}
#undef DSV41_KERNEL_OVER_HEADS
#endif

struct KernelEntry {
  const char* name;
  Kernel fn;
  bool (*runs_here)();
};

const std::vector<KernelEntry>& all_kernels() {  // best last
  static const std::vector<KernelEntry> kernels = {
      {"generic", kernel_generic, [] { return true; }},
#if DSV41_INDEXER_X86
      {"avx2", kernel_avx2, [] { return __builtin_cpu_supports("avx2") != 0; }},
      {"avx512bw", kernel_avx512bw, [] { return __builtin_cpu_supports("avx512bw") != 0; }},
      {"avx512vnni", kernel_avx512vnni,
       [] { return __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("avx512vnni") != 0; }},
#endif
  };
  return kernels;
}

std::atomic<int> g_forced_kernel{-1};  // set_integer_path_kernel's choice; -1: the best that runs here

Kernel chosen_kernel() {
  const std::vector<KernelEntry>& k = all_kernels();
  const int forced = g_forced_kernel.load();
  if (forced >= 0) return k[static_cast<size_t>(forced)].fn;
  for (size_t i = k.size(); i-- > 0;) {
    if (k[i].runs_here()) return k[i].fn;
  }
  return kernel_generic;
}

}  // namespace

bool integer_path_fits(int64_t d) { return d >= 1 && d <= kMaxDim; }

// ---- the keys, encoded once per call (index_select_by_rows: once for all its tiles) ----

EncodedKeys encode_keys(const Tensor<float>& keys, int64_t reached) {
  const int64_t d = keys.dim(1), groups = (reached + 15) / 16;
  EncodedKeys k;
  k.reached = reached;
  k.pairs = (d + 1) / 2;
  k.codes.assign(static_cast<size_t>(groups * k.pairs * 32), 0);
  k.scale.assign(static_cast<size_t>(groups * 16), 0.0);
  k.encoded.assign(static_cast<size_t>(groups), 1);
  parallel_for(groups, [&](int64_t g) {  // groups are independent
    std::vector<int16_t> row(static_cast<size_t>(d));
    for (int64_t l = 0; l < 16 && g * 16 + l < reached; ++l) {
      if (!encode_row(keys.row(g * 16 + l), d, row.data(), &k.scale[static_cast<size_t>(g * 16 + l)])) {
        k.encoded[static_cast<size_t>(g)] = 0;
        continue;
      }
      int16_t* kc = k.codes.data() + g * k.pairs * 32;
      for (int64_t i = 0; i < d; ++i) kc[(i / 2) * 32 + 2 * l + i % 2] = row[static_cast<size_t>(i)];
    }
  });
  return k;
}

std::vector<std::string> integer_path_kernels() {
  std::vector<std::string> names;
  for (const KernelEntry& k : all_kernels()) {
    if (k.runs_here()) names.emplace_back(k.name);
  }
  return names;
}

void set_integer_path_kernel(const std::string& name) {
  if (name.empty()) {
    g_forced_kernel.store(-1);
    return;
  }
  const std::vector<KernelEntry>& k = all_kernels();
  for (size_t i = 0; i < k.size(); ++i) {
    if (name == k[i].name) {
      DSV41_CHECK(k[i].runs_here(), "set_integer_path_kernel: kernel '", name, "' does not run on this CPU");
      g_forced_kernel.store(static_cast<int>(i));
      return;
    }
  }
  DSV41_FAIL("set_integer_path_kernel: no kernel named '", name, "' (generic, avx2, avx512bw, avx512vnni)");
}

void integer_path_rows(const Tensor<float>& q, const Tensor<float>& keys, const EncodedKeys& k,
                       const Tensor<float>& weights, const std::vector<int64_t>& reach, const Tensor<uint8_t>* pool,
                       const ScoreRows& rows, IndexScoresTally& tally) {
  const int64_t heads = q.dim(1), d = q.dim(2), n = rows.width;
  DSV41_CHECK(integer_path_fits(d), "index_scores: the integer path takes 1 <= Di <= ", kMaxDim, ", not ", d);
  const int64_t reached = k.reached;
  const int64_t pairs = k.pairs;
  const Kernel kernel = chosen_kernel();
  // Blocks of queries share each key group while it is in cache (one query per block when there are
  // too few queries to give every thread blocks of 8).
  const int64_t t_count = rows.t1 - rows.t0;
  const int64_t block = t_count >= 8 * reference_threads() ? 8 : 1;
  const int64_t blocks = (t_count + block - 1) / block;
  std::vector<int64_t> fast(static_cast<size_t>(blocks), 0), slow(static_cast<size_t>(blocks), 0);
  parallel_for(blocks, [&](int64_t b) {
    const int64_t t0 = rows.t0 + b * block, t1 = std::min(rows.t1, t0 + block);
    if (rows.fill) std::fill(rows.out + (t0 - rows.t0) * n, rows.out + (t1 - rows.t0) * n, -kInfinity);
    std::vector<int16_t> q_codes(static_cast<size_t>((t1 - t0) * heads * 2 * pairs), 0);  // [block, heads, 2 pairs]
    std::vector<double> q_scale(static_cast<size_t>((t1 - t0) * heads), 0.0);             // [block, heads]
    std::vector<uint8_t> q_encoded(static_cast<size_t>(t1 - t0), 1);                      // [block]
    int64_t block_reach = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const size_t r = static_cast<size_t>(t - t0);
      for (int64_t h = 0; h < heads && q_encoded[r] != 0; ++h) {
        const size_t row = r * static_cast<size_t>(heads) + static_cast<size_t>(h);
        if (!encode_row(q.row(t, h), d, q_codes.data() + row * static_cast<size_t>(2 * pairs), &q_scale[row])) {
          q_encoded[r] = 0;
        }
      }
      block_reach = std::max(block_reach, reach[static_cast<size_t>(t)]);
    }
    DSV41_CHECK(block_reach <= reached, "index_scores: keys encoded up to ", reached, ", a query reaches ", block_reach);
    std::vector<int32_t> dots(static_cast<size_t>(heads * 16));  // [heads, 16] one group's exact dots
    std::vector<float> kt(static_cast<size_t>(d * 16));  // [d, 16]: group kt_group transposed for scores16
    int64_t kt_group = -1;
    for (int64_t g = 0; g * 16 < block_reach; ++g) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t reach_t = reach[static_cast<size_t>(t)];
        if (g * 16 >= reach_t) continue;
        const int64_t width = std::min<int64_t>(16, reach_t - g * 16);
        const uint8_t* in_pool = pool != nullptr ? pool->row(t) : nullptr;  // [N] or null: every key
        if (group_outside_pool(in_pool, g * 16, width)) continue;  // -inf, as the double path leaves it
        const size_t r = static_cast<size_t>(t - t0);
        float s16[16];
        if (q_encoded[r] != 0 && k.encoded[static_cast<size_t>(g)] != 0) {
          kernel(q_codes.data() + r * static_cast<size_t>(heads * 2 * pairs), heads,
                 k.codes.data() + g * pairs * 32, pairs, dots.data());
          scores_from_dots(dots.data(), q_scale.data() + r * static_cast<size_t>(heads), k.scale.data() + g * 16,
                           weights.row(t), heads, s16);
          fast[static_cast<size_t>(b)] += 1;
        } else {
          if (kt_group != g) {  // as the double path lays the group out (zeros past `reached`)
            std::fill(kt.begin(), kt.end(), 0.0f);
            for (int64_t l = 0; l < 16 && g * 16 + l < reached; ++l) {
              for (int64_t i = 0; i < d; ++i) kt[static_cast<size_t>(i * 16 + l)] = keys.row(g * 16 + l)[i];
            }
            kt_group = g;
          }
          scores16(heads > 0 ? q.row(t, 0) : nullptr, weights.row(t), kt.data(), heads, d, s16);
          slow[static_cast<size_t>(b)] += 1;
        }
        store_group(s16, in_pool, g * 16, width, rows.out + (t - rows.t0) * n);
      }
    }
    if (rows.done) rows.done(t0, t1);
  });
  for (int64_t b = 0; b < blocks; ++b) {
    tally.integer_groups += fast[static_cast<size_t>(b)];
    tally.double_groups += slow[static_cast<size_t>(b)];
  }
}

}  // namespace dsv41::reference::indexer_detail
