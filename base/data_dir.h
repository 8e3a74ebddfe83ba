// base/data_dir.h
//
// Where dsv41 reads its built-in data: the tiny oracle model (golden/oracle: config, weights and
// the official outputs), the official runs (golden/runs) and the model configs
// (scenarios/configs). The same relative paths under one root, wherever dsv41 runs from
// (docs/install.md):
//   1. $DSV41_DATA_DIR, when set (it must hold golden/oracle/config.json);
//   2. an installed layout, relative to the file holding this code (the `dsv41` executable or the
//      Python module's _core.so), so that an install can move: <dir>/data or <dir>/../data (the
//      Python package of `pip install`), else <ancestor>/share/dsv41 for the 5 folders above
//      <dir> (`cmake --install`, the .deb: <prefix>/bin/dsv41, <prefix>/lib/python3/...);
//   3. the source tree the build came from (a build used in its checkout).
// The first root holding golden/oracle/config.json wins. None → dsv41::Error naming every
// candidate (so a moved binary says where it looked).
//
// Example:
//   const std::string w = dsv41::data::file("golden/oracle/weights.safetensors");
#pragma once

#include <string>
#include <vector>

namespace dsv41::data {

// The data root (see above); throws dsv41::Error when no candidate holds the marker file.
std::string root();

// root() + "/" + relative (the file need not exist: the caller opens it and reports its errors).
std::string file(const std::string& relative);

// The candidate roots in the order root() tries them, each with why it is a candidate
// ("$DSV41_DATA_DIR", "the install prefix of <obj>", ...): for messages and `dsv41 --version`.
struct Candidate {
  std::string path;
  std::string origin;
};
std::vector<Candidate> candidates();

}  // namespace dsv41::data
