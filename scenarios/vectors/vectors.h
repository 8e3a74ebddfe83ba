// scenarios/vectors/vectors.h
//
// Conformance vectors (docs/port-dump.md, "Conformance vectors"): per-component
// test cases a port runs one kernel at a time, without a model, weights file or dump.
//
//   write_vector_set    `dsv41 vectors -o DIR`: DIR/vectors.json (the manifest, written last) and
//                       one safetensors file per case: the op (a reference::seam::Ops method name), the
//                       config size (tiny, small, released), the op's scalar parameters, the inputs
//                       "in.<name>", the expected outputs "out.<name>", the tolerance and its
//                       origin, the seed and the adversarial property the case pins down
//   run_vector_case     the reference "port": a case's inputs through an Ops table -> the outputs
//                       (the expected outputs are made by this very function on reference_ops(),
//                       and it is the documented example of what a port does with a case)
//   run_port_on_vectors writes a port's outputs: PORT_DIR/<case file>, "out.*" keys only
//   conform_vectors     `dsv41 conform --vectors DIR --port-out PORT_DIR`: every case's out.* against
//                       the port's, nothing recomputed; one scenario per case in a RunReport
//
// Exit codes of the judgement (reports::exit_code of the verdict): 0 every case passes, 1 a case
// fails, 2 a bad vector or port file (a dsv41::Error naming the file and key), 3 a case (or one of
// its outputs) the port did not supply and nothing failed: not covered is never passed, so partial
// coverage is 3 (judge a subset with `only`).
//
// Example:
//   write_vector_set("vec", {"tiny"}, 0, "dsv41 vectors -o vec");
//   run_port_on_vectors(reference::seam::reference_ops(), "vec", "port");   // what a port does
//   reports::RunReport r = conform_vectors("vec", "port", "");
//   return reports::exit_code(r.verdict);                              // 0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/seam/ops.h"
#include "reference/checkpoint/safetensors.h"
#include "reports/report.h"

namespace dsv41::scenarios::vectors {

inline constexpr const char* kVectorsFormat = "dsv41 vectors";
inline constexpr int kVectorsVersion = 1;
inline constexpr const char* kVectorsManifest = "vectors.json";
inline constexpr const char* kVectorsMode = "vectors";

// The sizes, in order: the tiny preset, scenarios/configs/small.json, the released config (the
// "full" preset = shared/oracle/config_full.json).
const std::vector<std::string>& vector_sizes();
reference::ModelConfig vector_size_config(const std::string& size);

// One case as written (the file's metadata and tensors).
struct VectorCase {
  std::string name;         // "<size>.<op>.<variant>": the file is "<name>.safetensors"
  std::string op;           // the reference::seam::Ops method (the component name used everywhere)
  std::string size;         // tiny, small or released
  uint64_t seed = 0;        // the case's input seed (derived from the set's seed and the name)
  std::string description;  // what the case computes
  std::string adversarial;  // the adversarial property it pins down ("" none)
  double tolerance = 0;     // max |expected - port| allowed; 0 = bit-exact
  std::string tolerance_origin;
  std::map<std::string, std::string> params;       // the op's scalar parameters (strings)
  std::vector<reference::checkpoint::safetensors::Entry> tensors;  // "in.<name>" then "out.<name>"
};

// The cases of one size (inputs and expected outputs), deterministic in (size, seed).
std::vector<VectorCase> make_vector_cases(const std::string& size, uint64_t seed);

// The safetensors metadata of a case (format, version, op, size, seed, ..., "param.<k>").
std::map<std::string, std::string> vector_metadata(const VectorCase& c);

struct VectorSetSummary {
  int64_t cases = 0;
  int64_t bytes = 0;  // the files' total size
};
// Writes the cases of `sizes` into `dir` (new or empty): the case files, then the manifest.
// Atomic per file. A dsv41::Error for an unknown size or a non-empty dir.
VectorSetSummary write_vector_set(const std::string& dir, const std::vector<std::string>& sizes, uint64_t seed,
                                  const std::string& command_line);

// The manifest's view of a set: the cases (name, op, size, file), checked against the files.
struct VectorSetEntry {
  std::string name, op, size, file, adversarial;
};
struct VectorSet {
  std::string dir, tool, git_commit;
  uint64_t seed = 0;
  std::vector<VectorSetEntry> cases;
};
// A dsv41::Error naming the file (and key) for a missing or malformed manifest, another format or
// version, or a listed file that is missing.
VectorSet read_vector_set(const std::string& dir);

// A case file's inputs through `ops` -> the outputs "out.<name>", in the case's dtypes and shapes.
// A dsv41::Error naming the file and key for a missing or misshaped input or parameter.
std::vector<reference::checkpoint::safetensors::Entry> run_vector_case(const reference::seam::Ops& ops,
                                                           const reference::checkpoint::safetensors::SafetensorsFile& file);

// A port's outputs for every case of the set (`only`: the cases whose op is `only`), written as
// PORT_DIR/<case file> holding only "out.*" keys (and the metadata format/version/case).
void run_port_on_vectors(const reference::seam::Ops& ops, const std::string& vectors_dir, const std::string& port_dir,
                         const std::string& only = "");

// The judgement (see above). only: "" every case, else an op name (the other cases are skipped,
// not reported).
// require: a partial port's ops (empty: every case must be covered). A case of another op that the
// port did not cover is skipped: verdict measured (nothing asserted), its note "not covered: ...
// (not required)"; a required op with no case in the set is a dsv41::Error.
reports::RunReport conform_vectors(const std::string& vectors_dir, const std::string& port_dir,
                                   const std::string& only, const std::vector<std::string>& require = {});

// Whether conform_vectors skipped this case's comparison (not covered, not required).
bool skipped_case(const reports::Comparison& c);

// The JUnit of a vectors judgement: one testcase per case (classname dsv41.vectors.<size>, name the
// case): pass, fail (first divergence), <skipped> (not covered, not required), inconclusive (not
// covered; required, or no --require).
std::vector<reports::JunitSuite> vectors_junit_suites(const reports::RunReport& r);

}  // namespace dsv41::scenarios::vectors
