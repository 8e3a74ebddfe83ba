// python/bind_formats.cc
//
// dsv41.formats (docs/python.md, "Formats"; docs/formats.md): the scalar codecs, the four block
// recipes and the packed cache entries of formats/, over numpy arrays. The scalar codecs and the
// recipes read the input buffer and write the output array directly (no intermediate copy); the
// cache-entry functions go through the checked host API (formats/cache_format.h), so a NaN/Inf
// element, a dim that is not a multiple of the block or a byte buffer of the wrong size is a
// dsv41.Error with the CLI's message.
#include <functional>
#include <map>
#include <string>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"
#include "python/bindings.h"

namespace dsv41::python {

namespace {

using formats::CacheFormat;

py::array f32_input(const py::handle& h, const char* what) {
  py::array a = as_array(h);
  if (!a || !a.dtype().is(py::dtype::of<float>())) {
    DSV41_FAIL(what, ": expected a float32 array, got ", a ? dtype_str(a) : std::string("no array"));
  }
  return a;
}

py::array u8_input(const py::handle& h, const char* what) {
  py::array a = as_array(h);
  if (!a || !a.dtype().is(py::dtype::of<uint8_t>())) {
    DSV41_FAIL(what, ": expected a uint8 array of codes, got ", a ? dtype_str(a) : std::string("no array"));
  }
  return a;
}

// Elementwise float32 -> code array of the same shape.
template <typename Code>
py::array encode_all(const py::handle& x, const char* what, Code (*fn)(float)) {
  py::array a = f32_input(x, what);
  py::array_t<Code> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  const float* in = static_cast<const float*>(a.data());
  Code* o = out.mutable_data();
  for (py::ssize_t i = 0; i < a.size(); ++i) o[i] = fn(in[i]);
  return out;
}

template <typename Code>
py::array decode_all(const py::handle& c, const char* what, float (*fn)(uint32_t)) {
  py::array a = as_array(c);
  if (!a || !a.dtype().is(py::dtype::of<Code>())) {
    DSV41_FAIL(what, ": expected a ", py::str(py::dtype::of<Code>()).cast<std::string>(), " array of codes, got ",
               a ? dtype_str(a) : std::string("no array"));
  }
  py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  const Code* in = static_cast<const Code*>(a.data());
  float* o = out.mutable_data();
  for (py::ssize_t i = 0; i < a.size(); ++i) o[i] = fn(in[i]);
  return out;
}

uint8_t enc_e2m1(float x) { return formats::e2m1_encode(x); }
uint8_t enc_e4m3(float x) { return formats::e4m3_encode_satfinite(x); }
uint8_t enc_e8m0(float x) { return formats::e8m0_encode_ceil(x); }
uint16_t enc_bf16(float x) { return formats::bf16_encode(x); }
float dec_e2m1(uint32_t c) { return formats::e2m1_decode(c); }
float dec_e4m3(uint32_t c) { return formats::e4m3_decode(c); }
float dec_e8m0(uint32_t c) { return formats::e8m0_decode(c); }
float dec_bf16(uint32_t c) { return formats::bf16_decode(c); }

// The block recipes of formats/qdq.h by name.
struct Recipe {
  int block;
  bool (*quantize)(const float*, uint8_t*, uint8_t*);
  float (*dequant)(uint8_t, uint8_t);
};
const std::map<std::string, Recipe>& recipes() {
  static const std::map<std::string, Recipe> m = {
      {"compressed_kv", {formats::kCompressedKvBlock, formats::quantize_compressed_kv_block, formats::dequant_fp4_e4m3}},
      {"index", {formats::kIndexBlock, formats::quantize_index_block, formats::dequant_fp4_e8m0}},
      {"fp8", {formats::kFp8Block, formats::quantize_fp8_block, formats::dequant_fp8_e8m0}},
  };
  return m;
}
const Recipe& recipe(const std::string& name) {
  const auto it = recipes().find(name);
  if (it == recipes().end()) DSV41_FAIL("unknown block recipe '", name, "' (known: compressed_kv, index, fp8)");
  return it->second;
}

py::tuple quantize_blocks(const std::string& name, const py::handle& x) {
  const Recipe& r = recipe(name);
  py::array a = f32_input(x, "quantize_blocks x");
  DSV41_CHECK(a.ndim() >= 1 && a.shape(a.ndim() - 1) % r.block == 0, "recipe ", name, ": the last dimension (",
              a.ndim() ? a.shape(a.ndim() - 1) : 0, ") must be a multiple of its block ", r.block);
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  std::vector<py::ssize_t> sshape = shape;
  sshape.back() /= r.block;
  py::array_t<uint8_t> codes(shape), scales(sshape);
  const float* in = static_cast<const float*>(a.data());
  const py::ssize_t blocks = a.size() / r.block;
  const py::ssize_t per_row = shape.back() / r.block;
  for (py::ssize_t b = 0; b < blocks; ++b) {
    if (!r.quantize(in + b * r.block, scales.mutable_data() + b, codes.mutable_data() + b * r.block)) {
      DSV41_FAIL("recipe ", name, ": block ", b % per_row, " of row ", b / per_row,
                 " holds NaN or Inf (the official code has no defined result for it)");
    }
  }
  return py::make_tuple(codes, scales);
}

py::array dequantize_blocks(const std::string& name, const py::handle& c, const py::handle& s) {
  const Recipe& r = recipe(name);
  py::array codes = u8_input(c, "dequantize_blocks codes");
  py::array scales = u8_input(s, "dequantize_blocks scales");
  DSV41_CHECK(codes.ndim() >= 1 && codes.shape(codes.ndim() - 1) % r.block == 0 && scales.size() * r.block == codes.size(),
              "recipe ", name, ": ", codes.size(), " codes and ", scales.size(), " scales; expected one scale per ",
              r.block, " codes");
  py::array_t<float> out(std::vector<py::ssize_t>(codes.shape(), codes.shape() + codes.ndim()));
  const uint8_t* cp = static_cast<const uint8_t*>(codes.data());
  const uint8_t* sp = static_cast<const uint8_t*>(scales.data());
  for (py::ssize_t i = 0; i < codes.size(); ++i) out.mutable_data()[i] = r.dequant(cp[i], sp[i / r.block]);
  return out;
}

// [rows, dim] float32 -> rows and dim, checked.
std::pair<int, int> rows_dim(const py::array& a, const char* what) {
  DSV41_CHECK(a.ndim() == 2, what, ": expected a 2-d array [rows, dim], got ", a.ndim(), " dimensions");
  return {static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1))};
}

py::array pack(const std::string& format, const py::handle& x) {
  const CacheFormat f = formats::cache_format_from_name(format);
  py::array a = f32_input(x, "pack x");
  const auto [rows, dim] = rows_dim(a, "pack x");
  const float* p = static_cast<const float*>(a.data());
  std::vector<uint8_t> bytes = formats::pack_rows(f, std::vector<float>(p, p + a.size()), rows, dim);
  return to_numpy(std::move(bytes), {rows, formats::entry_bytes(f, dim)});
}

py::array unpack(const std::string& format, const py::handle& b, int dim) {
  const CacheFormat f = formats::cache_format_from_name(format);
  py::array a = u8_input(b, "unpack bytes");
  const int eb = formats::entry_bytes(f, dim);
  DSV41_CHECK(a.ndim() == 2 && a.shape(1) == eb, "unpack: expected bytes [entries, ", eb, "] (format ", format,
              ", dim ", dim, "), got shape ", reference::shape_string(shape_of(a)));
  const int rows = static_cast<int>(a.shape(0));
  const uint8_t* p = static_cast<const uint8_t*>(a.data());
  return to_numpy(formats::unpack_rows(f, std::vector<uint8_t>(p, p + a.size()), rows, dim), {rows, dim});
}

py::array qdq(const std::string& format, const py::handle& x) {
  const CacheFormat f = formats::cache_format_from_name(format);
  py::array a = f32_input(x, "qdq x");
  const auto [rows, dim] = rows_dim(a, "qdq x");
  const float* p = static_cast<const float*>(a.data());
  return to_numpy(formats::qdq_rows(f, std::vector<float>(p, p + a.size()), rows, dim), {rows, dim});
}

}  // namespace

void register_formats(py::module_& top) {
  py::module_ m = top.def_submodule("formats", "codecs, block recipes and packed cache entries (formats/)");
  m.def("e2m1_encode", [](py::handle x) { return encode_all<uint8_t>(x, "e2m1_encode", enc_e2m1); },
        "float32 array -> uint8 E2M1 codes (round to nearest even, saturating at +-6; NaN -> 0x7)");
  m.def("e4m3_encode", [](py::handle x) { return encode_all<uint8_t>(x, "e4m3_encode", enc_e4m3); },
        "float32 array -> uint8 E4M3FN codes (round to nearest even, saturating at +-448; NaN -> 0x7F)");
  m.def("e8m0_encode_ceil", [](py::handle x) { return encode_all<uint8_t>(x, "e8m0_encode_ceil", enc_e8m0); },
        "float32 array -> uint8 E8M0 codes, rounded UP to a power of two (|x|; NaN -> 0xFF)");
  m.def("bf16_encode", [](py::handle x) { return encode_all<uint16_t>(x, "bf16_encode", enc_bf16); },
        "float32 array -> uint16 bf16 bits (round to nearest even, IEEE overflow to Inf; NaN -> 0x7FC0)");
  m.def("e2m1_decode", [](py::handle c) { return decode_all<uint8_t>(c, "e2m1_decode", dec_e2m1); },
        "uint8 E2M1 codes (low 4 bits) -> float32 values (exact)");
  m.def("e4m3_decode", [](py::handle c) { return decode_all<uint8_t>(c, "e4m3_decode", dec_e4m3); },
        "uint8 E4M3FN codes -> float32 values (exact; 0x7F/0xFF NaN)");
  m.def("e8m0_decode", [](py::handle c) { return decode_all<uint8_t>(c, "e8m0_decode", dec_e8m0); },
        "uint8 E8M0 codes -> float32 2^(c-127) (exact; 0x00 is 2^-127, 0xFF NaN)");
  m.def("bf16_decode", [](py::handle c) { return decode_all<uint16_t>(c, "bf16_decode", dec_bf16); },
        "uint16 bf16 bits -> float32 values (exact)");
  m.def("round_to_bf16",
        [](py::handle x) {
          return encode_all<float>(x, "round_to_bf16", +[](float v) { return formats::round_to_bf16(v); });
        },
        "float32 array -> float32 array of bf16 values (round to nearest even): the rounding point of every "
        "bf16 tensor");
  m.def("quantize_blocks", &quantize_blocks, py::arg("recipe"), py::arg("x"),
        "recipe 'compressed_kv' (E2M1 + E4M3 scale per 16), 'index' (E2M1 + E8M0 ceil per 32) or 'fp8' (E4M3 + "
        "E8M0 ceil per 32; the SWA KV and activation quant); x: [..., n] float32, n a multiple of the block -> "
        "(codes uint8 [..., n] (one code per element, not packed), scales uint8 [..., n / block]). A block with "
        "NaN/Inf is an error.");
  m.def("dequantize_blocks", &dequantize_blocks, py::arg("recipe"), py::arg("codes"), py::arg("scales"),
        "codes uint8 [..., n], scales uint8 [..., n / block] -> float32 [..., n]: bf16(code * scale), the value "
        "the official code keeps");
  m.def("cache_formats", [] {
    std::vector<std::string> v;
    for (CacheFormat f : {CacheFormat::kCompressedKvFp4, CacheFormat::kIndexKeysFp4, CacheFormat::kWindowKvFp8,
                          CacheFormat::kBf16}) {
      v.push_back(formats::info(f).name);
    }
    return v;
  }, "the cache format names: compressed_kv, index_keys, window_kv entries and bf16 (docs/formats.md)");
  m.def("entry_bytes", [](const std::string& f, int dim) { return formats::entry_bytes(formats::cache_format_from_name(f), dim); },
        py::arg("format"), py::arg("dim"), "bytes of one packed entry of `dim` values");
  m.def("pack", &pack, py::arg("format"), py::arg("x"),
        "x: [rows, dim] float32 (bf16 values) -> uint8 [rows, entry_bytes]: the packed entries (docs/formats.md "
        "layouts: element 2k in the low nibble, scales after the values)");
  m.def("unpack", &unpack, py::arg("format"), py::arg("bytes"), py::arg("dim"),
        "bytes: uint8 [rows, entry_bytes] -> float32 [rows, dim] (bf16 values, exact)");
  m.def("qdq", &qdq, py::arg("format"), py::arg("x"),
        "unpack(pack(x)): x [rows, dim] float32 -> float32 [rows, dim], the value the official bf16 cache keeps");
}

}  // namespace dsv41::python
