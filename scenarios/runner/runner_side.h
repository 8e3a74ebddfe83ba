// scenarios/runner/runner_side.h (internal to the runner): one side of a comparison, its backend(s),
// sessions and measurements (scenarios/runner/runner.cc). A sampled replay runs side B's steps on a worker
// thread beside side A's (docs/scale.md): each SideRunner is used by one thread at a time.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/runner/backend.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

// One side of a comparison: its backend(s) and sessions.
class SideRunner {
 public:
  SideRunner(Side side, const BackendResources& r) : side_(std::move(side)), resources_(r) {}

  Backend& backend(const std::string& session) {
    const std::string key = side_.path == CachePath::kAlone ? session : std::string();
    auto it = backends_.find(key);
    if (it == backends_.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      it = backends_.emplace(key, make_backend(side_.backend, resources_)).first;
      const double dt = since(t0);
      setup_seconds += dt;
      if (timed_depth_ > 0) setup_in_timed_ += dt;  // also inside seconds_: not a step's time
      it->second->reset_device_peak();  // the high-water mark of this comparison
    }
    return *it->second;
  }

  // Runs f, adding its wall time to this side's and sampling its device memory after it.
  template <typename F>
  auto timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    ++timed_depth_;
    struct Done {
      SideRunner* self;
      std::chrono::steady_clock::time_point t0;
      ~Done() {
        --self->timed_depth_;
        self->account(t0);
      }
    } done{this, t0};
    return f();
  }

  // This side's measurements (reports::SideMeasure) so far.
  reports::SideMeasure measure(const std::string& which) const {
    reports::SideMeasure m;
    m.side = which;
    m.spec = side_.text();
    m.seconds = seconds_;
    m.peak_device_bytes = peak_device_;
    m.device_in_use_bytes = in_use_device_;
    return m;
  }

  // side B of a sampled replay: the session continues from `saved` (side A's state, with its rings)
  // and its pending decoder replay (when the step after a resume is replayed).
  void load(const std::string& name, const SavedState& saved, bool pending_decoder) {
    timed([&] {
      sessions_[name] = backend(name).restore(saved, reference::session::ResumeMode::kFull);
      return 0;
    });
    pending_decoder_[name] = pending_decoder;
  }
  bool pending_decoder(const std::string& name) const {
    const auto it = pending_decoder_.find(name);
    return it != pending_decoder_.end() && it->second;
  }
  SavedState save_full(const std::string& name) {
    return timed([&] { return backend(name).save(session(name), /*include_swa=*/true); });
  }

  // One step nobody compares (sampled replay, side A between the sampled steps): no hooks, no
  // cache download; returns the last position's logits.
  std::vector<float> step_unrecorded(const std::string& name, const std::vector<int64_t>& tokens, int64_t step_index,
                                     bool prompt) {
    BackendSession& s = session(name);
    reference::model::StepOptions o;
    o.logits_only = true;
    if (prompt && pending_decoder_[name] && side_.path == CachePath::kDecoder) o.decoder_replay_rows = side_.decoder_rows;
    if (prompt) pending_decoder_[name] = false;
    return timed([&] { return backend(name).step(s, tokens, o, {}, step_index).logits; });
  }

  BackendSession& session(const std::string& name) {
    auto it = sessions_.find(name);
    if (it == sessions_.end()) it = sessions_.emplace(name, backend(name).new_session()).first;
    return *it->second;
  }

  // One step; records the capture (forced by `forced` when given).
  StepCapture step(const std::string& name, const std::vector<int64_t>& tokens, int64_t step_index,
                   const StepCapture* forced, bool prompt) {
    BackendSession& s = session(name);
    reference::model::StepOptions o;
    // Decoder replay applies to the first prompt step after a resume (a decode step in between
    // leaves it pending).
    if (prompt && pending_decoder_[name] && side_.path == CachePath::kDecoder) o.decoder_replay_rows = side_.decoder_rows;
    if (prompt) pending_decoder_[name] = false;
    StepCapture cap;
    const reference::model::ForwardHooks h = capture_hooks(cap, forced, skip_index_scores_);
    timed([&] {
      const reference::model::StepRecord rec = backend(name).step(s, tokens, o, h, step_index);
      finish_capture(cap, rec, backend(name).caches(s));
      return 0;
    });
    return cap;
  }

  // Sampled replay: captures leave index_scores out ([T, reachable keys] fp32: 17 GB for a chunk of
  // 4096 queries at 2^20 keys); the selections made from them are compared.
  void skip_index_scores() { skip_index_scores_ = true; }

  // The session pauses and resumes by this side's cache path; returns the caches after it.
  StepCapture resume(const std::string& name, bool views = true) {
    return timed([&] { return resume_untimed(name, views); });
  }
  StepCapture resume_untimed(const std::string& name, bool views) {
    Backend& b = backend(name);
    BackendSession& s = session(name);
    StepCapture cap;
    cap.start_pos = s.pos();
    switch (side_.path) {
      case CachePath::kCold:
      case CachePath::kAlone:
        break;
      case CachePath::kFull: {
        const SavedState saved = b.save(s, /*include_swa=*/true);
        sessions_[name] = b.restore(saved, reference::session::ResumeMode::kFull);
        break;
      }
      case CachePath::kGlobal:
      case CachePath::kDecoder: {
        const SavedState saved = b.save(s, /*include_swa=*/false);
        sessions_[name] = b.restore(saved, reference::session::ResumeMode::kGlobalOnly);
        pending_decoder_[name] = true;
        break;
      }
    }
    if (views) cap.caches = b.caches(*sessions_[name]);
    return cap;
  }

  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Wall time of this side (RunOptions::time_sides): making its backends (inside a timed call or
  // not: a backend is made on its session's first use, which may come before its first step);
  // the rest of its timed work (steps, rounds, saves and loads).
  double setup_seconds = 0;
  double step_seconds() const { return seconds_ - setup_in_timed_; }

  // What any of this side's backends could not show ("" when nothing is missing).
  std::string missing_evidence() const {
    for (const auto& [key, b] : backends_) {
      const std::string m = b->missing_evidence();
      if (!m.empty()) return m;
    }
    return "";
  }

 private:
  Side side_;
  const BackendResources& resources_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  std::map<std::string, std::unique_ptr<BackendSession>> sessions_;
  std::map<std::string, bool> pending_decoder_;
  bool skip_index_scores_ = false;
  double seconds_ = 0;
  double setup_in_timed_ = 0;  // the part of setup_seconds inside seconds_
  int timed_depth_ = 0;
  int64_t peak_device_ = -1, in_use_device_ = -1;

  void account(std::chrono::steady_clock::time_point t0) {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& [key, b] : backends_) {
      if (const std::optional<DeviceMemory> m = b->device_memory()) {
        peak_device_ = std::max(peak_device_, m->peak_alloc_bytes);
        in_use_device_ = std::max(in_use_device_, m->in_use_bytes);
      }
    }
  }
};

}  // namespace dsv41::scenarios::runner
