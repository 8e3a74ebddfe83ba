#!/usr/bin/env bash
# The main job (README, first command): set up and build only what it runs (setup.sh main), check the formats, then run the
# built-in scenario suite on the tiny config (CPU reference, official oracle weights) and print
# its summary. The HDF5 report goes to build/report.h5 (JUnit: build/report.xml); its schema is
# checked; the HTML report with plots goes to build/report.html (its path is printed). Exit code:
# that of `dsv41 run` (0 pass, 1 divergence beyond tolerance, 2 error, 3 inconclusive), or of the
# first step that failed before it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh main   # only what this job runs: the dsv41 executable
build_dir=${DSV41_BUILD_DIR:-build}
"$build_dir/dsv41" selfcheck
"$build_dir/dsv41" bytes --config full
status=0
"$build_dir/dsv41" run -o "$build_dir/report.h5" --junit "$build_dir/report.xml" || status=$?
"$build_dir/dsv41" report check "$build_dir/report.h5"
"$build_dir/dsv41" report html "$build_dir/report.h5" -o "$build_dir/report.html"
echo "main: the report: $build_dir/report.h5 (text: $build_dir/dsv41 report show $build_dir/report.h5;" \
  "h5py: docs/report-schema.md)"
echo "main: the HTML report (open it in a browser, offline): $(realpath "$build_dir/report.html")"
exit "$status"
