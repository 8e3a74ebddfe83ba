#include "scenarios/runner/capture.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace dsv41::scenarios::runner {
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
  if (forced == nullptr || what == reference::model::name(reference::model::Component::kIndexScores)) return nullptr;
  const CapturedItem* it = forced->find(layer, what);
  if (it == nullptr) return nullptr;
  const Tensor<T>& v = (*it).*member;
  if (v.shape() != own.shape() && tail_fits(v, own)) {
    // Decoder replay: side B runs this layer on the last rows only; it takes A's last rows.
    const int64_t width = v.numel() / v.dim(0);
    scratch = Tensor<T>(own.shape(), std::vector<T>(v.data().end() - own.dim(0) * width, v.data().end()), v.name());
    return &scratch;
  }
  DSV41_CHECK(v.shape() == own.shape(), "teacher forcing: the forcing value of '", what, "' at layer ", layer,
              " (a port dump's, in conform) has shape ", reference::shape_string(v.shape()), ", the forced run computes ",
              reference::shape_string(own.shape()),
              what == reference::model::name(reference::model::Component::kTopk)
                  ? " (a top-k is [T, min(index_topk, N)], N the layer's compressed positions after the step; "
                    "read_port_dump drops a padded [T, index_topk]'s -1 columns beyond N; docs/port-dump.md)"
                  : "");
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
    for (const reference::model::ComponentInfo& i : reference::model::component_table()) n.push_back(i.name);
    return n;
  }();
  return names;
}

bool is_known_component(const std::string& name) { return reference::model::component_from_name(name).has_value(); }

judge::ValueType hook_value_type(const std::string& c) {
  const std::optional<reference::model::Component> id = reference::model::component_from_name(c);
  return id && reference::model::component_info(*id).type == reference::model::ComponentType::kFp32 ? judge::ValueType::kFp32
                                                                                    : judge::ValueType::kBf16;
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

reference::model::ForwardHooks capture_hooks(StepCapture& into, const StepCapture* forced, bool skip_index_scores) {
  reference::model::ForwardHooks h;
  // Logits are compared from the StepRecord (finish_capture); a sampled replay leaves index_scores out.
  h.skipped = {reference::model::Component::kLogits};
  if (skip_index_scores) h.skipped.push_back(reference::model::Component::kIndexScores);
  h.read_only = forced == nullptr;
  // The same two checks again: a hook that wraps these (mutated_hooks) calls them directly, with
  // skipped empty so that its own defect still fires on index_scores.
  h.tensor = [&into, forced, skip_index_scores](reference::model::Component what, int layer, Tensor<float>& v) {
    if (what == reference::model::Component::kLogits) return;
    if (skip_index_scores && what == reference::model::Component::kIndexScores) return;
    record_and_force(into, forced, reference::model::name(what), layer, v, CapturedItem::kFloat, &CapturedItem::f);
  };
  h.index = [&into, forced](reference::model::Component what, int layer, Tensor<int32_t>& v) {
    record_and_force(into, forced, reference::model::name(what), layer, v, CapturedItem::kIndex, &CapturedItem::i);
  };
  h.mask = [&into, forced](reference::model::Component what, int layer, Tensor<uint8_t>& v) {
    record_and_force(into, forced, reference::model::name(what), layer, v, CapturedItem::kMask, &CapturedItem::m);
  };
  return h;
}

void finish_capture(StepCapture& cap, const reference::model::StepRecord& rec, std::vector<reference::model::CacheView> caches) {
  cap.start_pos = rec.start_pos;
  cap.tokens = rec.tokens;
  // Engram ids: integer outputs, placed right before the layer's Engram output.
  for (const auto& [layer, ids] : rec.engram_ids) {
    CapturedItem it;
    it.layer = layer;
    it.component = reference::model::name(reference::model::Component::kEngramIds);
    it.kind = CapturedItem::kIds;
    it.ids = ids.data();
    it.ids_shape = ids.shape();
    std::vector<CapturedItem>::iterator at = cap.items.end();
    for (auto i = cap.items.begin(); i != cap.items.end(); ++i) {
      if (i->layer == layer && i->component == reference::model::name(reference::model::Component::kEngramOut)) {
        at = i;
        break;
      }
    }
    cap.items.insert(at, std::move(it));
  }
  // A selecting layer (Full, Reindex) at a step where it has no compressed position yet,
  // N = (start_pos + T) / ratio = 0 (e.g. a first step of one token at ratio 2), observes no hook;
  // its StepRecord selection is [T, 0]. It is recorded as a [T, 0] "topk" and a [T, 0]
  // "index_scores" item before the layer's "attn_out", so every step holds the same items (a port
  // dump's promise, docs/port-dump.md). index_scores not, where the hooks skip it
  // (capture_hooks(skip_index_scores)): then a layer with N > 0 has none either.
  const std::string topk = reference::model::name(reference::model::Component::kTopk);
  const std::string scores = reference::model::name(reference::model::Component::kIndexScores);
  bool scores_skipped = false;
  for (const auto& [layer, sel] : rec.topk) {
    if (sel.rank() == 2 && sel.dim(1) > 0 && cap.find(layer, scores) == nullptr) scores_skipped = true;
  }
  for (const auto& [topk_layer, sel] : rec.topk) {
    const int layer = topk_layer;  // a plain local: clang 14 cannot capture a structured binding
    if (sel.rank() != 2 || sel.dim(1) != 0 || cap.find(layer, topk) != nullptr) continue;
    std::vector<CapturedItem> empty(scores_skipped ? 1 : 2);
    for (CapturedItem& it : empty) it.layer = layer;
    empty.back().component = topk;
    empty.back().kind = CapturedItem::kIndex;
    empty.back().i = Tensor<int32_t>({sel.dim(0), 0}, "topk");
    if (!scores_skipped) {
      empty.front().component = scores;
      empty.front().kind = CapturedItem::kFloat;
      empty.front().type = hook_value_type(scores);
      empty.front().f = Tensor<float>({sel.dim(0), 0}, "index_scores");
    }
    auto at = std::find_if(cap.items.begin(), cap.items.end(), [&](const CapturedItem& i) {
      return i.layer == layer && i.component == reference::model::name(reference::model::Component::kAttnOut);
    });
    cap.items.insert(at, std::make_move_iterator(empty.begin()), std::make_move_iterator(empty.end()));
  }
  cap.logits = rec.logits;
  cap.caches = std::move(caches);
}

namespace {

// The first `rows` rows of a [T, ...] tensor.
template <typename T>
Tensor<T> head_rows(const Tensor<T>& v, int64_t rows) {
  DSV41_CHECK(v.rank() >= 1 && v.dim(0) >= rows, "round capture: '", v.name(), "' has ", v.rank() ? v.dim(0) : 0,
              " rows, ", rows, " kept");
  std::vector<int64_t> shape = v.shape();
  shape[0] = rows;
  const int64_t width = v.dim(0) ? v.numel() / v.dim(0) : 0;
  return Tensor<T>(shape, std::vector<T>(v.data().begin(), v.data().begin() + rows * width), v.name());
}

// Row-concatenation of [T_j, ...] tensors; a rank-2 tensor's columns padded to the widest with `pad`.
template <typename T>
Tensor<T> cat_rows(const std::vector<const Tensor<T>*>& parts, T pad, bool may_pad, const std::string& what) {
  std::vector<int64_t> shape = parts.front()->shape();
  int64_t rows = 0, width = 0;
  for (const Tensor<T>* p : parts) {
    rows += p->dim(0);
    width = std::max(width, p->rank() == 2 ? p->dim(1) : 0);
    std::vector<int64_t> tail = p->shape(), first = shape;
    tail[0] = first[0] = 0;
    if (p->rank() == 2 && may_pad) tail[1] = first[1] = 0;
    DSV41_CHECK(tail == first, "round capture: '", what, "' has shape ", reference::shape_string(p->shape()),
                " in one step and ", reference::shape_string(shape), " in another");
  }
  shape[0] = rows;
  if (shape.size() == 2 && may_pad) shape[1] = width;
  std::vector<T> out;
  for (const Tensor<T>* p : parts) {
    const int64_t w = p->dim(0) ? p->numel() / p->dim(0) : 0;
    const T* data = p->data().data();
    for (int64_t r = 0; r < p->dim(0); ++r) {
      out.insert(out.end(), data + r * w, data + (r + 1) * w);
      if (shape.size() == 2) out.insert(out.end(), static_cast<size_t>(shape[1] - w), pad);
    }
  }
  return Tensor<T>(shape, std::move(out), parts.front()->name());
}

// The first `cols` columns of a [T, N] tensor.
template <typename T>
void cut_columns(Tensor<T>& v, int64_t cols) {
  if (v.rank() != 2 || v.dim(1) <= cols) return;
  std::vector<T> out;
  const T* data = v.data().data();
  for (int64_t r = 0; r < v.dim(0); ++r) out.insert(out.end(), data + r * v.dim(1), data + r * v.dim(1) + cols);
  v = Tensor<T>({v.dim(0), cols}, std::move(out), v.name());
}

bool per_token(const CapturedItem& it) {
  return it.component != reference::model::name(reference::model::Component::kAccept);
}

}  // namespace

StepCapture first_rows(const StepCapture& cap, int64_t rows) {
  DSV41_CHECK(rows >= 1 && rows <= cap.tokens, "round capture: keep ", rows, " of a step of ", cap.tokens, " tokens");
  StepCapture out;
  out.start_pos = cap.start_pos;
  out.tokens = rows;
  for (const CapturedItem& it : cap.items) {
    CapturedItem c = it;
    if (per_token(it)) {
      switch (it.kind) {
        case CapturedItem::kFloat: c.f = head_rows(it.f, rows); break;
        case CapturedItem::kIndex: c.i = head_rows(it.i, rows); break;
        case CapturedItem::kMask: c.m = head_rows(it.m, rows); break;
        case CapturedItem::kIds: {
          DSV41_CHECK(!it.ids_shape.empty() && it.ids_shape[0] >= rows, "round capture: '", it.component, "' rows");
          const int64_t width = it.ids_shape[0] ? static_cast<int64_t>(it.ids.size()) / it.ids_shape[0] : 0;
          c.ids.resize(static_cast<size_t>(rows * width));
          c.ids_shape[0] = rows;
          break;
        }
      }
    }
    out.items.push_back(std::move(c));
  }
  return out;
}

StepCapture concat_rows(const std::vector<StepCapture>& steps) {
  DSV41_CHECK(!steps.empty(), "round capture: no steps");
  StepCapture out;
  out.start_pos = steps.front().start_pos;
  for (const StepCapture& s : steps) out.tokens += s.tokens;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t n = 0; n < steps.front().items.size(); ++n) {
    const CapturedItem& first = steps.front().items[n];
    std::vector<const CapturedItem*> parts;
    for (const StepCapture& s : steps) {
      DSV41_CHECK(s.items.size() == steps.front().items.size() && s.items[n].layer == first.layer &&
                      s.items[n].component == first.component,
                  "round capture: the one-token steps of a round hold different items ('", first.component,
                  "' at layer ", first.layer, " is not in every step)");
      parts.push_back(&s.items[n]);
    }
    CapturedItem c = first;
    const std::string what = first.component + " (layer " + std::to_string(first.layer) + ")";
    switch (first.kind) {
      case CapturedItem::kFloat: {
        std::vector<const Tensor<float>*> t;
        for (const CapturedItem* p : parts) t.push_back(&p->f);
        c.f = cat_rows(t, neg_inf, first.component == reference::model::name(reference::model::Component::kIndexScores), what);
        break;
      }
      case CapturedItem::kIndex: {
        std::vector<const Tensor<int32_t>*> t;
        for (const CapturedItem* p : parts) t.push_back(&p->i);
        c.i = cat_rows(t, int32_t{-1}, first.component == reference::model::name(reference::model::Component::kTopk), what);
        break;
      }
      case CapturedItem::kMask: {
        std::vector<const Tensor<uint8_t>*> t;
        for (const CapturedItem* p : parts) t.push_back(&p->m);
        c.m = cat_rows(t, uint8_t{0}, true, what);
        break;
      }
      case CapturedItem::kIds: {
        c.ids.clear();
        c.ids_shape[0] = 0;
        for (const CapturedItem* p : parts) {
          DSV41_CHECK(p->ids_shape.size() == first.ids_shape.size(), "round capture: '", what, "' ranks differ");
          c.ids.insert(c.ids.end(), p->ids.begin(), p->ids.end());
          c.ids_shape[0] += p->ids_shape[0];
        }
        break;
      }
    }
    out.items.push_back(std::move(c));
  }
  return out;
}

void align_columns(StepCapture& a, StepCapture& b) {
  for (CapturedItem& ia : a.items) {
    for (CapturedItem& ib : b.items) {
      if (ib.layer != ia.layer || ib.component != ia.component || ib.kind != ia.kind) continue;
      if (ia.component != reference::model::name(reference::model::Component::kIndexScores) &&
          ia.component != reference::model::name(reference::model::Component::kCandidates)) {
        break;
      }
      if (ia.kind == CapturedItem::kFloat && ia.f.rank() == 2 && ib.f.rank() == 2) {
        const int64_t n = std::min(ia.f.dim(1), ib.f.dim(1));
        cut_columns(ia.f, n);
        cut_columns(ib.f, n);
      } else if (ia.kind == CapturedItem::kMask && ia.m.rank() == 2 && ib.m.rank() == 2) {
        const int64_t n = std::min(ia.m.dim(1), ib.m.dim(1));
        cut_columns(ia.m, n);
        cut_columns(ib.m, n);
      }
      break;
    }
  }
}

}  // namespace dsv41::scenarios::runner
