#!/usr/bin/env bash
# tests/install/deb_test.sh DEB: the .deb installs and runs (docs/install.md). Needs root: it
# installs the package with apt-get (which pulls its Debian dependencies), runs the installed
# `dsv41` and `import dsv41` from outside the checkout, and removes the package again, whatever
# the outcome. .ci/run calls it after scripts/package.sh.
set -euo pipefail
deb=$(realpath "$1")
[ "$(id -u)" = 0 ] || { echo "deb_test: needs root (it installs $deb)"; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsv41_deb_test.XXXXXX")
cleanup() { apt-get remove -y -q dsv41 > /dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
cd "$tmp"
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$deb" > apt.log 2>&1 || { tail -20 apt.log; fail "apt-get install $deb"; }
/usr/bin/dsv41 --version | tee version.txt
grep -qF "built-in data: /usr/share/dsv41" version.txt || fail "the installed dsv41 does not read /usr/share/dsv41"
/usr/bin/dsv41 forward --config tiny --weights /usr/share/dsv41/golden/oracle/weights.safetensors --prompt "$(seq -s, 1 40)" --decode 2 --dump "$tmp/dump" > forward.log 2>&1 \
  || { cat forward.log; fail "forward --dump"; }
/usr/bin/dsv41 conform "$tmp/dump" --config tiny --weights /usr/share/dsv41/golden/oracle/weights.safetensors -q \
  > conform.log 2>&1 || { cat conform.log; fail "conform"; }
# -S and the system's dist-packages alone: a checkout's dsv41-build.pth (scripts/setup.sh) must not
# stand in for the installed module.
env -u PYTHONPATH /usr/bin/python3 -S -c "
import sys
sys.path.append('/usr/lib/python3/dist-packages')
import dsv41
assert dsv41.__file__.startswith('/usr/lib/python3/dist-packages/'), dsv41.__file__
r = dsv41.conform(sys.argv[1], weights=dsv41.data_file('golden/oracle/weights.safetensors'), config='tiny')
assert r['verdict'] == 'pass', r['verdict']
print('deb_test: import dsv41 from', dsv41.__file__, 'conform', r['verdict'])" "$tmp/dump" || fail "import dsv41"
echo "deb_test: ok: the .deb installs, runs and judges a dump"
