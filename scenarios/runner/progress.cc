// scenarios/runner/progress.cc: Progress, the shared progress display of long commands.
#include "scenarios/runner/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "base/terminal_text.h"

namespace dsv41::scenarios::runner {

Progress::Style Progress::style_for(std::FILE* out, bool quiet) {
  if (quiet) return Style::kOff;
  if (const char* env = std::getenv("DSV41_PROGRESS")) {
    const std::string v = env;
    if (v == "off") return Style::kOff;
    if (v == "lines") return Style::kLines;
    if (v == "bar") return Style::kBar;
  }
  return isatty(fileno(out)) ? Style::kBar : Style::kLines;
}

Progress::Progress(std::string label, double total, bool quiet, std::FILE* out)
    : label_(std::move(label)), total_(total), out_(out), style_(style_for(out, quiet)),
      t0_(std::chrono::steady_clock::now()) {
  if (const char* env = std::getenv("DSV41_PROGRESS_INTERVAL")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (end != env && v >= 0 && std::isfinite(v)) interval_ = v;
  }
}

Progress::~Progress() { finish(); }

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string Progress::line(double done, const std::string& what, size_t width) const {
  char head[96];
  const double s = seconds();
  std::string text;
  if (style_ == Style::kBar && total_ > 0) {
    const int cells = 24, full = static_cast<int>(std::clamp(done / total_, 0.0, 1.0) * cells);
    text.assign(1, '[');
    text.append(static_cast<size_t>(full), '#');
    text.append(static_cast<size_t>(cells - full), '.');
    text.append("] ");
  } else {
    std::snprintf(head, sizeof head, "[%7.1fs] ", s);
    text = head;
  }
  text += label_ + ": ";
  if (total_ > 0) {
    std::snprintf(head, sizeof head, "%3.0f%% ", std::clamp(done / total_, 0.0, 1.0) * 100);
    text += head;
  }
  text += terminal_safe(what);  // scenario names are anyone's (base/terminal_text.h)
  if (style_ == Style::kBar) {
    std::snprintf(head, sizeof head, " (%.1f s)", s);
    text += head;
  }
  if (text.size() > width) text = text.substr(0, width);
  return text;
}

void Progress::update(double done, const std::string& what) {
  if (style_ == Style::kOff || finished_) return;
  done_ = done;
  const double now = seconds();
  if (now - last_print_ < (style_ == Style::kBar ? 0.1 : interval_)) return;
  last_print_ = now;
  if (style_ == Style::kBar) {
    const char* cols = std::getenv("COLUMNS");
    const size_t width = cols && std::atoi(cols) > 20 ? static_cast<size_t>(std::atoi(cols)) - 1 : 100;
    std::fprintf(out_, "\r%s\x1b[K", line(done, what, width).c_str());
    drawn_ = true;
  } else {
    std::fprintf(out_, "%s\n", line(done, what, 200).c_str());
  }
  std::fflush(out_);
}

void Progress::note(const std::string& text) {
  if (drawn_) std::fprintf(out_, "\r\x1b[K");
  drawn_ = false;
  last_print_ = -1e9;  // redraw at the next update
  std::fprintf(out_, "%s\n", terminal_safe(text).c_str());
  std::fflush(out_);
}

void Progress::finish(const std::string& what) {
  if (style_ == Style::kOff || finished_) return;
  finished_ = true;
  if (drawn_) std::fprintf(out_, "\r\x1b[K");
  char tail[64];
  std::snprintf(tail, sizeof tail, " in %.1f s", seconds());
  const Style keep = style_;
  style_ = Style::kLines;  // the last line is a plain one
  std::fprintf(out_, "%s\n", line(total_ > 0 ? total_ : done_, what + tail, 200).c_str());
  style_ = keep;
  std::fflush(out_);
}

}  // namespace dsv41::scenarios::runner
