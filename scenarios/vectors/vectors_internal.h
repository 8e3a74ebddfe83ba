// scenarios/vectors/vectors_internal.h
//
// Shared by the vectors files (vectors_cases*.cc, vectors_port.cc, vectors_judge.cc): tensors to
// and from safetensors entries in the vector dtypes (floats F32, selections I32, ids and entry
// numbers I64, masks and cache bytes U8), and the checked readers of a case file's tensors and
// parameters (every error names the file and the key).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/ops/tensor.h"
#include "scenarios/vectors/vectors.h"

namespace dsv41::scenarios::vectors::vectors_detail {

namespace st = reference::checkpoint::safetensors;

st::Entry f32_entry(const std::string& name, const reference::Tensor<float>& t);
st::Entry i32_entry(const std::string& name, const reference::Tensor<int32_t>& t);
st::Entry i64_entry(const std::string& name, const std::vector<int64_t>& shape, const std::vector<int64_t>& v);
st::Entry u8_entry(const std::string& name, const reference::Tensor<uint8_t>& t);

// The tensor `key` of `f` as the vector dtype (F32 / I32 / I64 / U8), any shape; an error naming
// the file and key when it is missing or has another dtype.
reference::Tensor<float> get_f32(const st::SafetensorsFile& f, const std::string& key);
reference::Tensor<int32_t> get_i32(const st::SafetensorsFile& f, const std::string& key);
std::vector<int64_t> get_i64(const st::SafetensorsFile& f, const std::string& key);
reference::Tensor<uint8_t> get_u8(const st::SafetensorsFile& f, const std::string& key);
// A linear weight stored under "<prefix>.weight" (F8_E4M3, F4, BF16 or F32 [out, in]) and, for
// F8_E4M3 / F4, "<prefix>.scale" (E8M0), as reference::checkpoint::load_linear reads it.
reference::LinearWeight get_linear(const st::SafetensorsFile& f, const std::string& prefix);

// Metadata "param.<key>" as a string / integer / real; "config" as a ModelConfig.
std::string param(const st::SafetensorsFile& f, const std::string& key);
int64_t param_int(const st::SafetensorsFile& f, const std::string& key);
double param_real(const st::SafetensorsFile& f, const std::string& key);
reference::ModelConfig case_config(const st::SafetensorsFile& f);

// Reals as parameters: %.17g, which reads back to the same double (and float).
std::string real_string(double v);

// ---- the case generators (vectors_cases.cc, vectors_cases_model.cc) ----

// Inputs of one case: a std::mt19937_64 (specified by the standard, so every platform draws the
// same numbers) seeded with the case's seed; values are made here, never by a library distribution.
class CaseRng {
 public:
  explicit CaseRng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1p-53 * 2.0 - 1.0; }  // [-1, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(g_() % static_cast<uint64_t>(n)); }
  // bf16 values scale * U(-1, 1).
  reference::Tensor<float> bf16(const std::vector<int64_t>& shape, double scale, const std::string& name);

 private:
  std::mt19937_64 g_;
};

// Collects the cases of one size: begin() names a case and derives its seed, the caller adds
// inputs and parameters, finish() computes the expected outputs with run_vector_case on
// reference_ops() (the same code a port example runs) and checks that they are finite.
class CaseSet {
 public:
  CaseSet(std::string size, uint64_t seed);
  const std::string& size() const { return size_; }
  const reference::ModelConfig& config() const { return config_; }
  // T of the cases (tiny and small 5, released 2).
  int64_t tokens() const { return size_ == "released" ? 2 : 5; }
  bool released() const { return size_ == "released"; }

  VectorCase begin(const std::string& op, const std::string& variant, const std::string& description,
                   const std::string& adversarial);
  void finish(VectorCase c);
  // A generated checkpoint tensor (reference::checkpoint::generate_tensor of `ckpt` = "<checkpoint name>"),
  // stored as "in.<as>.weight" (and "in.<as>.scale" for F8_E4M3 / F4).
  void add_weight(VectorCase& c, const std::string& as, const std::string& ckpt, reference::DType dtype, int64_t out,
                  int64_t in) const;
  std::vector<VectorCase> take() { return std::move(cases_); }
  // The "out.*" tensors of the case finished last (a later case's inputs).
  std::vector<dsv41::reference::checkpoint::safetensors::Entry> last_outputs() const;

 private:
  std::string size_;
  uint64_t seed_;
  reference::ModelConfig config_;
  std::vector<VectorCase> cases_;
};

// The cases of each group of ops, appended to `set`.
void add_dense_cases(CaseSet& set);   // linears, rms_norm, rope_rows, the cache formats, compress
void add_model_cases(CaseSet& set);   // indexer, sparse attention, mHC, MoE, Engram, embed, head

}  // namespace dsv41::scenarios::vectors::vectors_detail
