// scenarios/exact/exact_eval.h
//
// The exact evaluation of the float-output ops of the ops seam (reference/seam/ops.h), and the error
// bound of each output derived from its reduction length and the precisions of its inputs
// (docs/cuda.md "Tolerances with their origin"). `dsv41 exact` (scenarios/cli/cli_exact.cc) runs it.
//
// "Exact" (per op in docs/cuda.md): the op's specified function of its stored (already rounded)
// inputs, evaluated in real arithmetic (Exact: 166-bit binary floating point, so every sum here is
// exact to well under 2^-100 of the sum of its magnitudes), with the SEMANTIC roundings the spec
// mandates (act_quant of an fp8/fp4 linear's input, the indexer's bf16 intermediate tensors,
// sparse_attn's bf16 probabilities) applied exactly, round to nearest even, to exact intermediate
// values, and WITHOUT the op's final rounding to its output dtype. Transcendentals (exp, log1p,
// sqrt) are evaluated in Exact. An implementation's error is |output - exact|.
//
// The bound of one output is an a-priori (Higham-style) bound, computed from the actual inputs:
// gamma_n(u) = n u / (1 - n u) times the sum of magnitudes of a length-n reduction, relative
// factors for each rounded operation, an interval through each semantic rounding (the largest
// distance between round(v) for v in [exact - r, exact + r] and round(exact): zero unless the
// interval straddles a rounding boundary), plus half an ulp of the output dtype for the final
// rounding. It holds for ANY summation order and any correctly rounded or 1-ulp libm, so it is the
// tolerance of an order-variant backend (derived_bounds below).
//
// Example:
//   std::vector<OpCase> cases = make_cases(Sizes::kTiny, 7);
//   for (const OpCase& c : cases) {
//     SideError e = measure(c, reference::seam::reference_ops());
//     // e.exceeded == 0 unless the backend is wrong
//   }
#pragma once

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/seam/ops.h"

namespace dsv41::scenarios::exact {

namespace mp = boost::multiprecision;
using Exact = mp::number<mp::cpp_bin_float<166, mp::digit_base_2>, mp::et_off>;

// ---- floating-point formats and exact rounding ----

struct Format {
  const char* name;
  int precision;  // significand bits, hidden bit included (fp32 24, bf16 8)
  int emin;       // exponent of the smallest normal (both: -126)
};
inline constexpr Format kF32{"fp32", 24, -126};
inline constexpr Format kBf16{"bf16", 8, -126};

inline constexpr double kU32 = 5.9604644775390625e-08;   // 2^-24, unit roundoff of fp32
inline constexpr double kU64 = 1.1102230246251565e-16;   // 2^-53, unit roundoff of double
// gamma_n(u) = n u / (1 - n u) (Higham, Accuracy and Stability, Lemma 3.1); n u < 1 required.
double gamma(int64_t n, double u);

Exact exact_of(float v);
// v rounded to nearest, ties to even, in format f (subnormals kept; no overflow handling: the
// values here are far from it). Exact, no intermediate double.
Exact round_to(const Exact& v, Format f);
// The spacing of f's values at |v| (the ulp of the binade holding |v|; subnormal spacing below).
Exact ulp_of(const Exact& v, Format f);
// x rounded by each format of `rounds` in order (e.g. {kF32, kBf16}: an fp32 value then cast to
// bf16). Monotone, so an interval [lo, hi] maps onto [round_chain(lo), round_chain(hi)]: a
// semantic rounding is carried through a bound as that interval.
Exact round_chain(Exact x, const std::vector<Format>& rounds);
// The bound of an output whose pre-rounding error is at most acc around `exact`, then rounded once
// to `out`: acc + half an ulp of out at |exact| + acc.
double finish_bound(const Exact& exact, double acc, Format out);

// ---- the derived bound of a reduction (the linear-class ops; an order-variant backend's tolerance) ----

enum class Accumulation {
  kF32Fma,           // fp32 (fused) multiply-adds in any order: gamma_n(u32) S, fp32 output
  kF64ToF32,         // exact products summed in double in any order, rounded to fp32:
                     // gamma_n(u64) S + u32 (|y| + gamma_n(u64) S)
  kQuantizedBlocks,  // 32-wide blocks each exact then rounded to fp32, fp32 sum of n/32 partials
                     // in any order: gamma_{n/32}(u32) S, S = sum_b |partial_b| (scaled)
};
// The bound on |computed - exact| of one output y of a length-n reduction, from S (the sum of
// the magnitudes the accumulation rounds: sum |x_i w_i|, or sum_b |partial_b|), |y| and the
// output format (+ half an ulp when out is bf16: the final rounding of an fp32 accumulator).
double derived_bound(Accumulation acc, int64_t n, double sum_abs, const Exact& exact, Format out);

// ---- top-k compared tie-aware ----

// Membership of each entry in the top k, given each entry's value interval [lo, hi] (exact +-
// bound; an entry with lo = -inf and hi = -inf is unreachable): 1 certainly in (fewer than k
// others can reach its lower end), -1 certainly out (k others lie wholly above it, or it is
// unreachable), 0 inside the tie band (either choice is correct). A selection is correct iff it
// takes every 1 and no -1.
std::vector<int8_t> topk_membership(const std::vector<double>& lo, const std::vector<double>& hi, int64_t k);

// ---- one op, one input set ----

struct OpCase {
  std::string op;          // "linear F8", "rms_norm", ... (docs/cuda.md's table)
  std::string inputs;      // "random", "long", "cancel", "ties", ...
  bool adversarial = false;  // excluded from the vacuity check (cancellation makes any bound relative)
  int64_t reduction = 0;   // the longest reduction length n behind one output
  std::string precisions;  // input and accumulation precisions
  std::string formula;     // the bound, as in docs/cuda.md
  Format out = kBf16;      // output dtype
  int64_t row = 1;         // outputs per row (the output's last dimension): the vacuity check's scale
  bool bounded = true;     // false: no bound derived (bound = +inf), the error is measured only
  bool flags = false;      // outputs are correctness flags (a tie-aware top-k check): exact 0, bound 0
  std::vector<Exact> exact;   // [outputs] exact values (inf allowed: masked outputs)
  std::vector<double> bound;  // [outputs] absolute bound (0: must be bit-exact)
  // [outputs] the bound of an implementation whose 32-wide block dots run on Hopper's fp8 tensor
  // cores (linear F8 of the production backend `cuda`: scenarios/judge/fp8_mma_bound.h); empty
  // for other ops. with_tensor_core_bound(c) is the case judged by it.
  std::vector<double> tensor_core_bound;
  // The op through a backend's table; outputs flattened in the order of `exact`.
  std::function<std::vector<float>(const reference::seam::Ops&)> run;
};

// What the seeded generator draws: tiny (the tiny preset's dims) or small (longer reductions).
enum class Sizes { kTiny, kSmall };
Sizes parse_sizes(const std::string& s);

// Every case of every op, inputs drawn from `seed` (splitmix64 streams, one per case).
std::vector<OpCase> make_cases(Sizes sizes, uint64_t seed);
// Per op family (scenarios/exact/exact_ops_*.cc), appended to `out`.
void add_linear_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);
void add_norm_rope_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);
void add_attention_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);
void add_moe_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);
void add_moe_experts_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);
void add_mhc_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out);

// ---- one backend's error on one case ----

struct SideError {
  std::string backend;
  std::vector<float> output;
  double max_abs = 0.0;      // max |output - exact| (finite outputs)
  double max_ulps = 0.0;     // max |output - exact| / ulp_out(exact)
  double max_rel = 0.0;      // max |output - exact| / |exact| over exact != 0
  double mean_ulps = 0.0;
  double used = 0.0;         // max |output - exact| / bound over bound > 0
  int64_t exceeded = 0;      // outputs with |output - exact| > bound (or NaN, or a masked mismatch)
  int64_t nonfinite = 0;     // NaN outputs
};
SideError measure(const OpCase& c, const reference::seam::Ops& ops, const std::string& backend);

// Not vacuous: on a non-adversarial case, the bound is at most 1.5 bf16 ulps of the largest |exact|
// of its row (one bf16 ulp plus the final half ulp) for at least 90% of the finite outputs: a
// bf16 output's bound then admits at most the neighbouring values at the row's scale, and an
// fp32 output's bound still resolves everything the next bf16 rounding can see. (Adversarial
// cases cancel on purpose: no relative bound there.)
struct BoundStats {
  double median_ulps = 0.0;  // median bound / ulp_out(exact)
  double max_ulps = 0.0;
  double tight_fraction = 0.0;  // fraction of outputs with bound <= 1.5 ulp_bf16(row max |exact|)
  bool vacuous = false;
};
BoundStats bound_stats(const OpCase& c);

// c with `bound` replaced by its tensor_core_bound (c itself when it has none): the case as
// `dsv41 exact` judges it when a side runs the production kernels (every side, then, by the
// looser bound, which contains the exact one).
OpCase with_tensor_core_bound(const OpCase& c);

// "equal" when both outputs are bit-identical, else the side with the smaller mean error in ulps
// ("a", "b"), with how many outputs each side is strictly closer on.
struct Closer {
  std::string verdict;  // "equal", or the closer side's name
  int64_t a_closer = 0, b_closer = 0;
};
Closer closer(const OpCase& c, const SideError& a, const SideError& b);

}  // namespace dsv41::scenarios::exact
