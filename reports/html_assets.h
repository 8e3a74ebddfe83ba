// reports/html_assets.h: the files the HTML report embeds (reports/report_html.cc), compiled into
// the binary by a source file that reports/CMakeLists.txt generates in the build tree at configure
// time: the page's script and style (reports/html/report.js, report.css) and the plotting library
// read from its Debian package (node-d3: /usr/share/nodejs/d3/dist/d3.min.js, or the CMake cache
// variable DSV41_D3_JS). Third-party code is never copied into the repository.
#pragma once

namespace dsv41::reports::html_assets {

extern const char* const kD3Source;  // the library's minified source; nullptr when it was not found
extern const char* const kD3Name;    // "d3 5.16.0" ("" without it)
extern const char* const kPageJs;    // reports/html/report.js
extern const char* const kPageCss;   // reports/html/report.css

}  // namespace dsv41::reports::html_assets
