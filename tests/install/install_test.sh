#!/usr/bin/env bash
# tests/install/install_test.sh SOURCE_DIR BUILD_DIR: dsv41 installed as a port team gets it,
# used from outside the checkout (docs/install.md). ctest runs it (label install) on the test build:
#   1. cmake --install into a temporary prefix, which is then moved (the install must be
#      relocatable): `dsv41 --version` names the moved prefix's data; `forward --dump` with the
#      built-in tiny model (no --weights: the installed data), `dsv41 conform` passes it (exit 0);
#      the installed module imports from the prefix and judges the same dump (verdict pass);
#   2. a CMake project outside dsv41 finds the installed package (find_package(dsv41)), links
#      dsv41::formats and round-trips every cache format;
#   3. pip install (the build folder reused: DSV41_PIP_BUILD_DIR) into a fresh venv
#      (--system-site-packages, --no-build-isolation --no-index: no network): the `dsv41` console
#      script and `import dsv41` from the venv, the package's own data, conform of the same dump;
#   4. from that venv, outside the checkout: the whole-model engine port with vLLM's module names
#      (examples/torch_port/engine_port.py) hooked, dumped, judged by `dsv41 conform` with JUnit,
#      and its planted bug located (issue 33's end-to-end check).
# Every check prints one line; the first failure exits 1 with what it ran.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
py=${DSV41_TEST_PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsv41_install_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"   # outside the checkout from here on
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
ok() { echo "install_test: ok: $*"; }

# 1. cmake --install, then moved.
cmake --install "$build" --prefix "$tmp/prefix0" > install.log 2>&1 || { cat install.log; fail "cmake --install"; }
mv "$tmp/prefix0" "$tmp/prefix"
p=$tmp/prefix
[[ -x $p/bin/dsv41 && -f $p/share/dsv41/golden/oracle/weights.safetensors ]] || fail "bin/dsv41 or share/dsv41 missing"
"$p/bin/dsv41" --version > version.txt
grep -qF "built-in data: $p/share/dsv41" version.txt || { cat version.txt; fail "the moved install does not read its own data"; }
ok "cmake --install, moved: $(tr '\n' ' ' < version.txt)"
prompt=$(seq -s, 1 40)
w=$p/share/dsv41/golden/oracle/weights.safetensors
"$p/bin/dsv41" forward --config tiny --weights "$w" --prompt "$prompt" --decode 2 --dump "$tmp/dump" > forward.log 2>&1 \
  || { cat forward.log; fail "installed forward --dump"; }
set +e
"$p/bin/dsv41" conform "$tmp/dump" --config tiny --weights "$w" -q -o "$tmp/conform.h5" --junit "$tmp/conform.xml" > conform.log 2>&1
rc=$?
set -e
[[ $rc == 0 && -s $tmp/conform.h5 && -s $tmp/conform.xml ]] || { cat conform.log; fail "installed conform exit $rc"; }
ok "installed forward --dump + conform: exit 0, report and JUnit written"
pydir=$(find "$p" -type d -name dsv41 -path '*-packages/*' | head -1)
[[ -n $pydir ]] || fail "no Python package under $p"
PYTHONPATH=$(dirname "$pydir") "$py" - "$tmp/dump" "$p" <<'PY' || fail "import dsv41 from the prefix"
import sys, dsv41
dump, prefix = sys.argv[1], sys.argv[2]
assert dsv41.__file__.startswith(prefix), dsv41.__file__
w = dsv41.data_file("golden/oracle/weights.safetensors")
assert w.startswith(prefix), w
r = dsv41.conform(dump, weights=w, config="tiny")
assert r["verdict"] == "pass" and r["exit_code"] == 0, (r["verdict"], r["exit_code"])
print("install_test: ok: import dsv41 from the prefix:", dsv41.__file__, "conform", r["verdict"])
PY

# 2. A CMake project outside dsv41: find_package(dsv41), dsv41::formats.
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release \
  > consumer.log 2>&1 && cmake --build "$tmp/consumer" >> consumer.log 2>&1 || { cat consumer.log; fail "consumer build"; }
"$tmp/consumer/consumer" || fail "consumer round trip"
ok "find_package(dsv41) + dsv41::formats from the prefix"

# 3. pip install into a fresh venv (no network).
"$py" -m venv --system-site-packages "$tmp/venv" > venv.log 2>&1 || { cat venv.log; fail "python3 -m venv"; }
DSV41_PIP_BUILD_DIR=$build "$tmp/venv/bin/pip" install --no-build-isolation --no-index -q "$src" > pip.log 2>&1 \
  || { tail -30 pip.log; fail "pip install"; }
"$tmp/venv/bin/dsv41" --version > vversion.txt
grep -qF "built-in data: $tmp/venv/lib/" vversion.txt || { cat vversion.txt; fail "the venv's dsv41 does not read its package's data"; }
set +e
"$tmp/venv/bin/dsv41" conform "$tmp/dump" --config tiny --weights "$w" -q > vconform.log 2>&1
rc=$?
set -e
[[ $rc == 0 ]] || { cat vconform.log; fail "the venv's dsv41 conform exit $rc"; }
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY' || fail "import dsv41 in the venv"
import sys, dsv41
assert dsv41.__file__.startswith(sys.argv[1]), dsv41.__file__
w = dsv41.data_file("golden/oracle/weights.safetensors")
assert w.startswith(sys.argv[1]), w
print("install_test: ok: pip install in a venv:", dsv41.__file__)
PY

# 4. The whole-model engine port (examples/torch_port/engine_port.py: vLLM's module names, its own
#    loop) copied outside the checkout, run by the venv's Python, hooked with the "vllm" name map,
#    dumped with dsv41.PortDumpWriter and judged by the venv's `dsv41 conform` with JUnit; its
#    planted engine bug is located. Needs torch (Debian's python3-torch, seen by the venv).
if "$tmp/venv/bin/python" -c "import torch" 2> /dev/null; then
  cp -r "$src/examples/torch_port" "$tmp/engine"
  vdata=$("$tmp/venv/bin/python" -c "import dsv41, os; print(os.path.dirname(dsv41.data_file('golden/oracle/config.json')))")
  "$tmp/venv/bin/python" "$tmp/engine/engine_port.py" --dump "$tmp/engine_dump" > engine.log 2>&1 || { cat engine.log; fail "engine_port.py"; }
  set +e
  "$tmp/venv/bin/dsv41" conform "$tmp/engine_dump" --config "$vdata/config.json" --weights "$vdata/weights.safetensors" -q \
    --no-hypotheses -o "$tmp/engine.h5" --junit "$tmp/engine.xml" > econform.log 2>&1
  rc=$?
  set -e
  [[ $rc == 0 ]] || { tail -30 econform.log; fail "the engine port's conform exit $rc"; }
  grep -q 'name="layer03.attn_out"' "$tmp/engine.xml" && ! grep -q '<failure' "$tmp/engine.xml" \
    || fail "the engine port's JUnit: no layer03.attn_out testcase, or a failure"
  "$tmp/venv/bin/python" "$tmp/engine/engine_port.py" --dump "$tmp/engine_bug" --bug sink_ignored > ebug.log 2>&1 || { cat ebug.log; fail "engine_port.py --bug"; }
  set +e
  "$tmp/venv/bin/dsv41" conform "$tmp/engine_bug" --config "$vdata/config.json" --weights "$vdata/weights.safetensors" -q \
    --no-hypotheses -o "$tmp/ebug.h5" --junit "$tmp/ebug.xml" > ebug_conform.log 2>&1
  rc=$?
  set -e
  [[ $rc == 1 ]] && grep -q "root cause (teacher-forced): step 0, layer 3, attn_out" ebug_conform.log \
    || { head -5 ebug_conform.log; fail "the engine's planted bug: exit $rc, not located at layer 3 attn_out"; }
  ok "the engine port (vLLM names) from the venv: dumped, conform exit 0 with $(grep -c '<testcase' "$tmp/engine.xml") JUnit testcases; its bug located (exit 1)"
else
  echo "install_test: skipped step 4: no torch for the venv's Python (Debian's python3-torch)"
fi
ok "all"
