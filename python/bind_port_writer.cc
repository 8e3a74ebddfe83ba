// python/bind_port_writer.cc
//
// _core.port_write_step: one step of a port's own run written through the C++ PortDumpWriter
// (scenarios/conform/port_dump.h), from {dump key: array} alone, no dsv41 model underneath: the
// lower-level path of dsv41.PortDumpWriter (python/dsv41/port_writer.py, docs/python.md "A port's
// own loop"). The writer keeps every rule of the format (docs/port-dump.md): the same keys in every
// step, bf16 values exact, steps that follow each other, the manifest in finish(), atomic.
//
// Keys: "layerNN.<component>" / "model.<component>" (the component table: stored dtype BF16/F32 ->
// float32 or uint16 bf16 bits, I32 -> int32, U8 -> uint8, I64 -> int64), "model.logits" F32
// [rows, vocab], and caches "layerNN.cache.<kind>" uint8 [entries, entry_bytes] with an optional
// "layerNN.cache.<kind>.positions" int64 [entries]; cache_meta {cache key: (format name, dim)}
// names each cache's CacheFormat ("fp32" for cache.compressor) and values per entry.
#include <cctype>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "formats/cache_format.h"
#include "python/bindings.h"
#include "reference/model/kv_cache.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/runner/capture.h"

namespace dsv41::python {

namespace {

using scenarios::runner::CapturedItem;

constexpr const char* kCache = "cache.";
constexpr const char* kPositions = ".positions";

// "layer03.attn_out" -> (3, "attn_out"); "model.logits" -> (-1, "logits").
std::pair<int, std::string> parse_key(const std::string& key) {
  if (key.rfind("model.", 0) == 0) return {-1, key.substr(6)};
  if (key.size() > 8 && key.rfind("layer", 0) == 0 && std::isdigit(static_cast<unsigned char>(key[5])) &&
      std::isdigit(static_cast<unsigned char>(key[6])) && key[7] == '.') {
    return {std::stoi(key.substr(5, 2)), key.substr(8)};
  }
  DSV41_FAIL("port value '", key, "': not a dump key (layerNN.<component>, model.<component>, layerNN.cache.<kind>)");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// values -> the capture the writer takes; positions of caches are matched after all caches are read.
scenarios::runner::StepCapture build_capture(int64_t start_pos, int64_t n_tokens, const py::dict& values,
                                             const std::map<std::string, std::pair<std::string, int64_t>>& cache_meta) {
  scenarios::runner::StepCapture cap;
  cap.start_pos = start_pos;
  cap.tokens = n_tokens;
  std::map<std::string, std::vector<int64_t>> positions;  // cache key -> [entries]
  for (const auto& [k, v] : values) {
    const std::string key = py::str(k).cast<std::string>();
    if (key.rfind("step.", 0) == 0) {
      DSV41_FAIL("port value '", key, "': the step record is written from write_step's tokens and start_pos");
    }
    if (ends_with(key, kPositions)) {
      positions[key.substr(0, key.size() - std::string(kPositions).size())] = to_int<int64_t>(v, key).data();
      continue;
    }
    auto [layer, component] = parse_key(key);
    if (component.rfind(kCache, 0) == 0) {
      reference::model::CacheView view;
      view.kind = component.substr(std::string(kCache).size());
      view.layer = layer;
      const auto meta = cache_meta.find(key);
      DSV41_CHECK(meta != cache_meta.end(), "port value '", key, "': no cache format and dim given for it");
      const auto& [format, dim] = meta->second;
      view.format = format == "fp32" ? formats::CacheFormat::kBf16 : formats::cache_format_from_name(format);
      DSV41_CHECK(format != "fp32" || view.kind == "compressor", "port value '", key,
                  "': format fp32 is the compressor's pending rows only (cache.compressor)");
      view.dim = dim;
      reference::Tensor<uint8_t> t = to_int<uint8_t>(v, key);
      DSV41_CHECK(t.rank() == 2, "port value '", key, "': shape ", reference::shape_string(t.shape()),
                  "; a cache is [entries, entry_bytes] uint8");
      view.entries = t.shape()[0];
      view.entry_bytes = t.shape()[1];
      view.bytes = t.data();
      cap.caches.push_back(std::move(view));
      continue;
    }
    if (layer == -1 && component == "logits") {
      reference::Tensor<float> t = to_f32(v, key);
      DSV41_CHECK(t.rank() == 2, "port value '", key, "': shape ", reference::shape_string(t.shape()),
                  "; logits are [rows, vocab]");
      cap.logit_rows = t.shape()[0];
      cap.logits = t.data();
      continue;
    }
    DSV41_CHECK(scenarios::runner::is_known_component(component), "port value '", key, "': component '", component,
                "' is not in the component table (docs/port-dump.md)");
    CapturedItem it;
    it.layer = layer;
    it.component = component;
    switch (scenarios::conform::dump_dtype(component)) {
      case reference::DType::kBF16:
      case reference::DType::kF32:
        it.kind = CapturedItem::kFloat;
        it.type = scenarios::runner::hook_value_type(component);
        it.f = to_f32(v, key);
        break;
      case reference::DType::kI32:
        it.kind = CapturedItem::kIndex;
        it.i = to_int<int32_t>(v, key);
        break;
      case reference::DType::kU8:
        it.kind = CapturedItem::kMask;
        it.m = to_int<uint8_t>(v, key);
        break;
      default: {  // I64 ids
        it.kind = CapturedItem::kIds;
        reference::Tensor<int64_t> t = to_int<int64_t>(v, key);
        it.ids_shape = t.shape();
        it.ids = t.data();
        break;
      }
    }
    cap.items.push_back(std::move(it));
  }
  for (auto& [key, pos] : positions) {
    reference::model::CacheView* hit = nullptr;
    for (reference::model::CacheView& c : cap.caches) {
      if (scenarios::conform::dump_key(c.layer, kCache + c.kind) == key) hit = &c;
    }
    DSV41_CHECK(hit != nullptr, "port value '", key, kPositions, "': no cache '", key, "' in the step");
    DSV41_CHECK(static_cast<int64_t>(pos.size()) == hit->entries, "port value '", key, kPositions, "': ", pos.size(),
                " positions for ", hit->entries, " entries");
    hit->positions = std::move(pos);
  }
  return cap;
}

// laid_out: [(layer, kind, uint8 array, {meta name: str}, int32 block table or None, int64 positions
// or None)], dsv41.PortDumpWriter.cache's staged caches.
std::vector<scenarios::conform::LaidOutCache> laid_out_caches(const py::list& laid_out) {
  std::vector<scenarios::conform::LaidOutCache> out;
  for (const py::handle& h : laid_out) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
    DSV41_CHECK(t.size() == 6, "laid-out cache: a tuple of 6, got ", t.size());
    scenarios::conform::LaidOutCache c;
    c.layer = t[0].cast<int>();
    c.kind = t[1].cast<std::string>();
    const std::string key = scenarios::conform::dump_key(c.layer, kCache + c.kind);
    reference::Tensor<uint8_t> bytes = to_int<uint8_t>(t[2], key);
    c.shape = bytes.shape();
    c.bytes = bytes.data();
    c.meta = t[3].cast<std::map<std::string, std::string>>();
    if (!t[4].is_none()) c.block_table = to_int<int32_t>(t[4], key + ".block_table").data();
    if (!t[5].is_none()) c.positions = to_int<int64_t>(t[5], key + kPositions).data();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

void register_port_writer(py::module_& m) {
  m.def("port_write_step",
        [](scenarios::conform::PortDumpWriter& w, const std::vector<int64_t>& tokens, int64_t start_pos,
           const std::string& event, const py::dict& values, int64_t kept,
           const std::map<std::string, std::pair<std::string, int64_t>>& cache_meta, const py::list& laid_out) {
          DSV41_CHECK(!tokens.empty(), "write_step: no tokens");
          scenarios::runner::StepCapture cap =
              build_capture(start_pos, static_cast<int64_t>(tokens.size()), values, cache_meta);
          w.add_step(cap, tokens, event, kept, laid_out_caches(laid_out));
        },
        py::arg("writer"), py::arg("tokens"), py::arg("start_pos"), py::arg("event"), py::arg("values"),
        py::arg("kept"), py::arg("cache_meta"), py::arg("laid_out") = py::list(),
        "one step of a port's own run from {dump key: array} (dsv41.PortDumpWriter.write_step)");
  m.def("set_tool", [](scenarios::conform::PortDumpWriter& w, const std::string& tool) { w.set_tool(tool); },
        py::arg("writer"), py::arg("tool"), "the manifest's tool (who produced the values)");
  m.def("set_accumulation",
        [](scenarios::conform::PortDumpWriter& w, const std::string& acc) { w.set_accumulation(acc); },
        py::arg("writer"), py::arg("accumulation"), "the manifest's accumulation (fp32, fp8-tensor-core)");
}

}  // namespace dsv41::python
