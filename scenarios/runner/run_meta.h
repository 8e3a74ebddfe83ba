// scenarios/runner/run_meta.h
//
// What every verb that writes a report shares: the exit codes (docs/cli.md), the volatile
// metadata stamped into a report (tool version, commit, command line, time, host, threads), and
// the check of a report's output paths before any work.
//
// Example:
//   check_report_outputs(output, junit);        // before the run
//   reports::RunMeta meta;  stamp_run_meta(meta, "dsv41 run ...");
#pragma once

#include <string>

#include "base/output_file.h"

namespace dsv41::reports {
struct RunMeta;
}  // namespace dsv41::reports

namespace dsv41::scenarios::runner {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInconclusive = 3;  // evidence missing (reports::exit_code)

// The volatile metadata of a report a verb writes (tool version, commit, command line, time,
// host, threads): scenarios/runner/run_meta.cc.
void stamp_run_meta(reports::RunMeta& meta, const std::string& command_line);

// A verb's report (-o) and JUnit file (--junit, "" for none) checked before any work: each a
// regular file or a new path in an existing directory, and not the same path
// (base/output_file.h); nor any of `inputs`, the files and directories the verb reads
// (output::VerbFiles: outputs never alias inputs); scenarios/runner/run_meta.cc.
void check_report_outputs(const std::string& output, const std::string& junit, output::VerbFiles inputs = {});

}  // namespace dsv41::scenarios::runner
