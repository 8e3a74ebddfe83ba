#include "scenarios/runner/keep.h"

#include <sstream>
#include <stdexcept>
#include <utility>

#include "base/error.h"
#include "scenarios/runner/capture.h"

namespace dsv41::scenarios::runner {
namespace {

using reports::Comparison;
using reports::StoredTensor;

// Keeps a tensor unless the same (step, layer, component, side) is kept already (a failure's
// tensors and a --save-tensors focus may name the same case).
void keep(Comparison& cmp, StoredTensor t) {
  for (const StoredTensor& u : cmp.tensors) {
    if (u.step == t.step && u.layer == t.layer && u.component == t.component && u.side == t.side) return;
  }
  cmp.tensors.push_back(std::move(t));
}

// Keeps one side's captured output, its values exactly, under its logical dtype.
void keep_item(Comparison& cmp, const CapturedItem& it, int64_t step, const std::string& side) {
  StoredTensor t;
  t.step = step;
  t.layer = it.layer;
  t.component = it.component;
  t.side = side;
  switch (it.kind) {
    case CapturedItem::kFloat:
      t.logical_dtype = it.type == judge::ValueType::kBf16 ? "bf16" : "fp32";
      t.shape = it.f.shape();
      t.values.assign(it.f.data().begin(), it.f.data().end());
      break;
    case CapturedItem::kIndex:
      t.logical_dtype = "int32";
      t.shape = it.i.shape();
      t.values.assign(it.i.data().begin(), it.i.data().end());
      break;
    case CapturedItem::kMask:
      t.logical_dtype = "uint8";
      t.shape = it.m.shape();
      t.values.assign(it.m.data().begin(), it.m.data().end());
      break;
    case CapturedItem::kIds:
      t.logical_dtype = "int64";
      t.shape = it.ids_shape;
      t.values.assign(it.ids.begin(), it.ids.end());
      break;
  }
  keep(cmp, std::move(t));
}

}  // namespace

bool Focus::matches(int64_t s, int l, const std::string& c) const {
  return (step < 0 || s == step) && (layer == -2 || l == layer) && (component.empty() || c == component);
}

Focus parse_focus(const std::string& text) {
  Focus f;
  std::stringstream ss(text);
  std::string part;
  bool any = false;
  while (std::getline(ss, part, ',')) {
    const size_t eq = part.find('=');
    DSV41_CHECK(eq != std::string::npos, "--save-tensors '", text, "': '", part, "' is not key=value");
    const std::string k = part.substr(0, eq), v = part.substr(eq + 1);
    try {
      if (k == "step") {
        f.step = std::stoll(v);
      } else if (k == "layer") {
        f.layer = std::stoi(v);
      } else if (k == "component") {
        if (!is_known_component(v)) {
          std::string names;
          for (const std::string& n : known_components()) names += (names.empty() ? "" : ", ") + n;
          DSV41_FAIL("--save-tensors '", text, "': unknown component '", v, "' (one of: ", names, ")");
        }
        f.component = v;
      } else {
        DSV41_FAIL("--save-tensors '", text, "': unknown key '", k, "' (step, layer, component)");
      }
    } catch (const std::logic_error&) {
      DSV41_FAIL("--save-tensors '", text, "': '", v, "' is not a number");
    }
    any = true;
  }
  DSV41_CHECK(any, "--save-tensors: empty (e.g. step=3,layer=6,component=topk)");
  return f;
}

void keep_focus(Comparison& cmp, const Focus& f, int64_t step, const StepCapture& a, const StepCapture& b) {
  for (const CapturedItem& it : a.items) {
    if (f.matches(step, it.layer, it.component)) keep_item(cmp, it, step, "a");
  }
  for (const CapturedItem& it : b.items) {
    if (f.matches(step, it.layer, it.component)) keep_item(cmp, it, step, "b");
  }
  for (const auto& [cap, side] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    for (const reference::model::CacheView& v : cap->caches) {
      if (!f.matches(step, v.layer, "cache." + v.kind)) continue;
      StoredTensor t;
      t.step = step;
      t.layer = v.layer;
      t.component = "cache." + v.kind;
      t.side = side;
      t.logical_dtype = "uint8";
      t.shape = {v.entries, v.entry_bytes};
      t.values.assign(v.bytes.begin(), v.bytes.end());
      keep(cmp, std::move(t));
    }
  }
  if (f.matches(step, -1, "logits")) {
    for (const auto& [cap, side] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      if (cap->logits.empty()) continue;
      CapturedItem it;
      it.layer = -1;
      it.component = "logits";
      it.type = judge::ValueType::kFp32;
      it.f = reference::Tensor<float>({cap->logit_rows, static_cast<int64_t>(cap->logits.size()) / cap->logit_rows},
                                      cap->logits, "logits");
      keep_item(cmp, it, step, side);
    }
  }
}

}  // namespace dsv41::scenarios::runner
