#!/usr/bin/env bash
# scripts/device_tree.sh slim|restore: prepare this checkout for a call of the device `run` tool.
#
# The tool sends the checkout's tracked and untracked-not-ignored files, at most 64 MiB; golden/
# alone holds about 108 MiB (official runs and their weights). `slim` takes the golden files that
# no GPU check reads out of the index (the files stay on disk; the paths go to .git/info/exclude
# between marker lines, so the tool leaves them behind) and stages .devdeps/ (nlohmann-json, which
# the H200 lacks: pass `carry: [".devdeps"]` and DSV41_CMAKE_ARGS=-DCMAKE_PREFIX_PATH=$PWD/.devdeps).
# `restore` puts the index and .git/info/exclude back. Kept: golden/oracle/{config.json,
# weights.safetensors, prefill.h5} (the tiny oracle model the CUDA tests and `dsv41 run` use).
#
# Example (then one run call: `DSV41_CMAKE_ARGS=-DCMAKE_PREFIX_PATH=$PWD/.devdeps scripts/gpu_check.sh`):
#   scripts/device_tree.sh slim && <run> ; scripts/device_tree.sh restore
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
[ -f .git ] && exclude="$(git rev-parse --git-common-dir)/info/exclude"
begin="# >>> device_tree.sh slim"
end="# <<< device_tree.sh slim"
drop=(golden/runs golden/vectors golden/oracle/decode.h5 golden/oracle/prefill_streams.h5
      golden/oracle/prefill_attn.h5 golden/oracle/kernels.h5 golden/oracle/tie_lowest_index.h5)

case "${1:-}" in
  slim)
    if grep -qF "$begin" "$exclude" 2>/dev/null; then echo "device_tree: already slim (run restore first)" >&2; exit 2; fi
    git diff --cached --quiet || { echo "device_tree: the index has staged changes: commit or unstage them first" >&2; exit 2; }
    { echo "$begin"; printf '/%s\n' "${drop[@]}"; echo "$end"; } >> "$exclude"
    git rm -r -q --cached "${drop[@]}"
    mkdir -p .devdeps/share/cmake .devdeps/include
    cp -r /usr/share/cmake/nlohmann_json .devdeps/share/cmake/
    cp -r /usr/include/nlohmann .devdeps/include/
    grep -qxF "/.devdeps/" "$exclude" || echo "/.devdeps/" >> "$exclude"
    echo "device_tree: slim: $(git ls-files | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1) bytes tracked"
    ;;
  restore)
    sed -i "/^$begin\$/,/^$end\$/d" "$exclude"
    git reset -q -- "${drop[@]}"
    git status --short -- golden | head -5
    echo "device_tree: restored"
    ;;
  *) echo "usage: scripts/device_tree.sh slim|restore" >&2; exit 2 ;;
esac
