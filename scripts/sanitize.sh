#!/usr/bin/env bash
# ASan + UBSan run of a CI-sized subset of the test suite (issue 14, deliverable 4). It shares
# the instrumented clang build of scripts/fuzz.sh (build-fuzz: every library built with
# -fsanitize=address,undefined, no recovery, CUDA off), so the libraries are compiled once for
# both. The subset (docs/errors.md, "Sanitizers"): the format codecs, the parsers and stores
# (config, safetensors, weights, sessions, reports, port dumps), the reference ops and the
# forward/speculative model tests, and the dsv41 CLI tests; not the exhaustive float sweeps
# nor the end-to-end suite, agreement and conformance runs (scripts/test.sh runs them all,
# unsanitized). Any ASan or UBSan report, or a leak, fails the test that triggered it.
# Environment:
#   DSV41_SANITIZE_TESTS    test executables to build and run (default below)
#   DSV41_SANITIZE_EXCLUDE  ctest -E regex of test cases left out (default below)
# Extra arguments go to ctest (e.g. -R Config).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DSV41_FUZZ_DIR:-build-fuzz}
default_tests="formats_minifloat_test formats_qdq_adversarial_test formats_cache_format_test
  config_test config_rules_test safetensors_test weights_test session_store_test
  session_store_corruption_test attention_test compressor_test indexer_test model_chunking_test
  speculative_test round_defects_test judge_test h5_io_test h5_probe_test report_test port_dump_test cli_test errors_catalogue_test"
read -r -a tests <<<"$(echo ${DSV41_SANITIZE_TESTS:-$default_tests})"
./scripts/fuzz.sh --build-only dsv41 "${tests[@]}"

# Left out: the executables not built (ctest lists them as <name>_NOT_BUILT) and the three
# end-to-end tests that run the dsv41 executable on every golden run (minutes under ASan), and
# Scale.* (the million-token twin: 46 s unsanitized, many minutes under ASan).
exclude=${DSV41_SANITIZE_EXCLUDE:-'_NOT_BUILT|^Agree\.EveryOfficialRunTeacherForced$|^Selftest\.Ci$|^Determinism\.|^Scale\.'}
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
cd "$build_dir"
echo "sanitize: ${#tests[@]} test executables; ASAN_OPTIONS=$ASAN_OPTIONS"
ctest --output-on-failure -j "$(nproc)" -E "$exclude" "$@"
