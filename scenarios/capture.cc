#include "scenarios/capture.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/error.h"

namespace dsv41::scenarios {
namespace {

using reference::Tensor;

// The forced value of (layer, what) from `forced`, checked against the shape the side produced.
template <typename T>
bool tail_fits(const Tensor<T>& a, const Tensor<T>& own) {
  if (a.rank() != own.rank() || a.rank() == 0 || own.dim(0) >= a.dim(0)) return false;
  for (int d = 1; d < a.rank(); ++d) {
    if (a.dim(d) != own.dim(d)) return false;
  }
  return true;
}

template <typename T>
const Tensor<T>* forced_value(const StepCapture* forced, int layer, const std::string& what,
                              const Tensor<T>& own, const Tensor<T> CapturedItem::*member, Tensor<T>& scratch) {
  if (forced == nullptr || what == reference::name(reference::Component::kIndexScores)) return nullptr;
  const CapturedItem* it = forced->find(layer, what);
  if (it == nullptr) return nullptr;
  const Tensor<T>& v = (*it).*member;
  if (v.shape() != own.shape() && tail_fits(v, own)) {
    // Decoder replay: side B runs this layer on the last rows only; it takes A's last rows.
    const int64_t width = v.numel() / v.dim(0);
    scratch = Tensor<T>(own.shape(), std::vector<T>(v.data().end() - own.dim(0) * width, v.data().end()), v.name());
    return &scratch;
  }
  DSV41_CHECK(v.shape() == own.shape(), "teacher forcing: side A's '", what, "' at layer ", layer,
              " has shape ", reference::shape_string(v.shape()), ", side B's ", reference::shape_string(own.shape()));
  return &v;
}

}  // namespace

const CapturedItem* StepCapture::find(int layer, const std::string& component) const {
  for (const CapturedItem& it : items) {
    if (it.layer == layer && it.component == component) return &it;
  }
  return nullptr;
}

const std::vector<std::string>& known_components() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const reference::ComponentInfo& i : reference::component_table()) n.push_back(i.name);
    return n;
  }();
  return names;
}

bool is_known_component(const std::string& name) { return reference::component_from_name(name).has_value(); }

ValueType hook_value_type(const std::string& c) {
  const std::optional<reference::Component> id = reference::component_from_name(c);
  return id && reference::component_info(*id).type == reference::ComponentType::kFp32 ? ValueType::kFp32
                                                                                    : ValueType::kBf16;
}

namespace {

// Records a hook's value as an item of `into`, then (teacher forcing) replaces it with forced's.
template <typename T>
void record_and_force(StepCapture& into, const StepCapture* forced, const std::string& what, int layer,
                      Tensor<T>& v, CapturedItem::Kind kind, Tensor<T> CapturedItem::*member) {
  CapturedItem it;
  it.layer = layer;
  it.component = what;
  it.kind = kind;
  it.type = hook_value_type(what);
  it.*member = v;
  into.items.push_back(std::move(it));
  Tensor<T> scratch;
  if (const Tensor<T>* f = forced_value(forced, layer, what, v, member, scratch)) v = *f;
}

}  // namespace

reference::ForwardHooks capture_hooks(StepCapture& into, const StepCapture* forced) {
  reference::ForwardHooks h;
  h.tensor = [&into, forced](reference::Component what, int layer, Tensor<float>& v) {
    if (what == reference::Component::kLogits) return;  // compared from the StepRecord (finish_capture)
    record_and_force(into, forced, reference::name(what), layer, v, CapturedItem::kFloat, &CapturedItem::f);
  };
  h.index = [&into, forced](reference::Component what, int layer, Tensor<int32_t>& v) {
    record_and_force(into, forced, reference::name(what), layer, v, CapturedItem::kIndex, &CapturedItem::i);
  };
  h.mask = [&into, forced](reference::Component what, int layer, Tensor<uint8_t>& v) {
    record_and_force(into, forced, reference::name(what), layer, v, CapturedItem::kMask, &CapturedItem::m);
  };
  return h;
}

void finish_capture(StepCapture& cap, const reference::StepRecord& rec, std::vector<reference::CacheView> caches) {
  cap.start_pos = rec.start_pos;
  cap.tokens = rec.tokens;
  // Engram ids: integer outputs, placed right before the layer's Engram output.
  for (const auto& [layer, ids] : rec.engram_ids) {
    CapturedItem it;
    it.layer = layer;
    it.component = reference::name(reference::Component::kEngramIds);
    it.kind = CapturedItem::kIds;
    it.ids = ids.data();
    it.ids_shape = ids.shape();
    std::vector<CapturedItem>::iterator at = cap.items.end();
    for (auto i = cap.items.begin(); i != cap.items.end(); ++i) {
      if (i->layer == layer && i->component == reference::name(reference::Component::kEngramOut)) {
        at = i;
        break;
      }
    }
    cap.items.insert(at, std::move(it));
  }
  cap.logits = rec.logits;
  cap.caches = std::move(caches);
}

}  // namespace dsv41::scenarios
