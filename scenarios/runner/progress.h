// scenarios/runner/progress.h
//
// Progress of a long command on stderr (docs/cli.md, "Progress"): a bar redrawn in place when
// stderr is a terminal, plain lines otherwise (at most one per DSV41_PROGRESS_INTERVAL seconds,
// default 1, and always the last), nothing when quiet (-q). DSV41_PROGRESS=bar|lines|off overrides
// the choice. Used by `forward` (per chunk and layer), `run` (per event and step) and
// `replay-study` (per case).
//
// Example:
//   Progress p("forward", /*total=*/chunks * layers, quiet);
//   for (...) p.update(done, "chunk 2/4 layer 3/4");   // units done so far, what runs now
//   p.finish();                                        // clears the bar, prints the last line
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dsv41::scenarios::runner {

class Progress {
 public:
  enum class Style { kOff, kLines, kBar };

  // label: the command ("forward"); total: the units of work (<= 0: unknown, no bar or percent).
  Progress(std::string label, double total, bool quiet, std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(double total) { total_ = total; }
  // `done` units of the total are complete; `what` is what runs now.
  void update(double done, const std::string& what);
  // A line that is not progress (printed even when quiet): on a terminal the bar is cleared first
  // and redrawn by the next update.
  void note(const std::string& text);
  // The last line ("label: 100% what in S s"), once; the destructor calls it.
  void finish(const std::string& what = "done");
  bool enabled() const { return style_ != Style::kOff; }
  Style style() const { return style_; }
  double seconds() const;

  // The style for this process: DSV41_PROGRESS if set, else a bar on a terminal, lines otherwise.
  static Style style_for(std::FILE* out, bool quiet);

 private:
  std::string line(double done, const std::string& what, size_t width) const;

  std::string label_;
  double total_;
  std::FILE* out_;
  Style style_;
  double interval_ = 1.0;
  double done_ = 0;
  double last_print_ = -1e9;
  bool finished_ = false;
  bool drawn_ = false;  // a bar is on the screen
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dsv41::scenarios::runner
