#!/usr/bin/env bash
# scripts/apt_install.sh PACKAGE...: installs the Debian packages among PACKAGE... that are not
# installed yet (apt-get update first; sudo when not root). Idempotent: installs nothing when all
# are there. Used by setup.sh (the build's packages) and fuzz.sh (clang and its runtimes).
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
