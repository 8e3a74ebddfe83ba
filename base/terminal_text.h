// base/terminal_text.h
//
// Text dsv41 prints that holds names a user or a file chose (scenario names, comparison notes,
// error messages quoting a path or a key) goes through terminal_safe() first: a name carrying
// terminal escape codes ("\x1b]0;...", "\x1b[2J") would otherwise drive the terminal of whoever
// runs `dsv41 run` or `dsv41 report show` on it (issue 35; docs/errors.md "Classes"). Every
// control character but the newline and the tab (C0, DEL, and the C1 controls U+0080..U+009F
// as UTF-8) is shown as \xNN, one per byte; other text, UTF-8 included, is unchanged.
//
// Example:
//   std::cout << terminal_safe(format_summary(report));   // "\x1b[31m" prints as \x1b[31m
#pragma once

#include <string>
#include <string_view>

namespace dsv41 {

inline std::string terminal_safe(std::string_view text) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  const auto escape = [&](unsigned char b) {
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) {
      escape(b);
    } else if (b == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      escape(b);  // a C1 control (U+0080..U+009F): CSI is U+009B
      escape(static_cast<unsigned char>(text[++i]));
    } else {
      out += static_cast<char>(b);
    }
  }
  return out;
}

}  // namespace dsv41
