#include "reference/ops/dtype.h"

#include "base/error.h"

namespace dsv41::reference {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int bits;  // per element
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 32},      {DType::kBF16, "BF16", 16}, {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E8M0, "F8_E8M0", 8}, {DType::kF4, "F4", 4},      {DType::kI32, "I32", 32},
    {DType::kI64, "I64", 64},     {DType::kU8, "U8", 8},
};

const DTypeInfo& dinfo(DType d) { return kDTypes[static_cast<int>(d)]; }

}  // namespace

const char* dtype_name(DType d) { return dinfo(d).name; }

int dtype_bits(DType d) { return dinfo(d).bits; }

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& i : kDTypes) {
    if (name == i.name) return i.dtype;
  }
  DSV41_FAIL("unsupported safetensors dtype '", name,
             "' (supported: F32, BF16, F8_E4M3, F8_E8M0, F4, I32, I64, U8)");
}

int64_t stored_bytes(DType d, int64_t numel) {
  const int bits = dinfo(d).bits;
  DSV41_CHECK(bits % 8 == 0 || numel % 2 == 0, "an F4 tensor needs an even element count, got ",
              numel);
  return numel * bits / 8;
}

}  // namespace dsv41::reference
