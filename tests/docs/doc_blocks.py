#!/usr/bin/env python3
"""Run every shell and Python block of the docs (issue 33 item 7, "Docs that run").

Usage: doc_blocks.py --build BUILD_DIR [--python-dir DIR] [--source SRC_DIR] [--timeout S] [--list]
                     [--keep] [FILE[:LINE] ...]
       doc_blocks.py --not-built REASON     (prints it, exit 77: CTest's skip)
CTest runs it as `DocBlocks` (tests/docs/CMakeLists.txt; `ctest -R DocBlocks`).

Which blocks (files: README.md, docs/*.md, examples/*/README.md of SRC_DIR, or the FILEs given;
FILE:LINE runs that file's blocks up to the one starting at LINE and reports only that one):
  - a fenced block (``` or ~~~) whose info string is sh, bash or shell: a bash script, run with
    `bash -euo pipefail`; it passes when it exits 0.
  - info string console: a transcript. Lines starting with `$ ` are commands (a line ending in
    `\\` continues on the next), run in order by one bash process (a variable set by one command
    is seen by the next; stdin is /dev/null). The other lines are their shown output, not
    compared, except that a command ending in the comment `# exit N` must exit N; a command whose
    shown output has a line starting with `dsv41: error:` (or `error:`) must exit non-zero and
    print every such line (`...` in it stands for any text); every other command must exit 0.
  - info string python or py: run with /usr/bin/python3 (or $DSV41_DOC_PYTHON); passes on exit 0.
  - any other info string (text, json, cpp, cmake, ...): shown, not run.
  - no info string, fenced or indented by 4 spaces: shown, not run; but when its first line looks
    like a command (starts with `$ `, `>>> `, `NAME=value cmd`, or a command such as dsv41,
    python3, mpirun, cmake, ctest, pip, build/..., scripts/...) that is an error: give it an info
    string (sh/console/python to run it, text for a synopsis or output) or a skip marker.
Markers: HTML comments on the lines right before the block (a blank line between is allowed):
  <!-- doc-test: skip (REASON) -->       not run; printed with the reason (a reason is required)
  <!-- doc-test: timeout S -->           this block's timeout in seconds (default --timeout)
  <!-- doc-test: fresh -->               run in a new work directory (see below)
  <!-- doc-test: args A B ... -->        a python or sh block's arguments (sys.argv[1:], $1 ...),
                                         for a snippet written as a script
  <!-- doc-test: needs MODULE -->        run only where the python imports MODULE (torch: an
                                         optional dependency); else not run, with that reason
  <!-- doc-test: needs command:CMD -->   run only where CMD is on PATH (mpirun, h5diff)
How blocks run: the blocks of one file run in order in one work directory per file (a new temp
dir), so a block may use what an earlier block of the same file wrote. The work directory mimics
a checkout's root: a symlink to each top-level entry of SRC_DIR (golden, examples, scenarios, ...;
`build` points at BUILD_DIR), so `golden/oracle/config.json` and `build/dsv41` resolve as in the
docs while new files land in the temp dir. Environment: PATH starts with BUILD_DIR (the `dsv41`
binary), then the python's directory (so `python3` is the interpreter the module was built for);
PYTHONPATH is --python-dir (default BUILD_DIR/python); DSV41_SRC is SRC_DIR; DSV41_THREADS=2
unless set. When run as root, OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, so
that Open MPI's mpirun runs (docs/cli.md and docs/sweep.md tell readers the same).
Exit status: 0 when every block run passed and no command-like block is unmarked; 1 otherwise;
2 on bad usage. Prints file:line of each failing block with the tail of its output, then a
summary (ran, passed, failed, not run with the reason).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

RUN_KINDS = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console",
             "python": "python", "py": "python"}
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
COMMAND_WORDS = ("dsv41", "python3", "python", "mpirun", "srun", "cmake", "ctest", "pip", "pip3",
                 "sudo", "apt-get", "apt", "bash", "scripts/", "build/", "build-", "./", "cd ",
                 "export ", "git ", "h5dump", "pytest", "make", "ninja", "dpkg")
OUTPUT_TAIL = 1500  # characters of a failing block's output shown


class Block:
    """One code block: file, 1-based line of its first line (the fence), kind, text, markers."""

    def __init__(self, path, line, info, text, fenced):
        self.path, self.line, self.info, self.text, self.fenced = path, line, info, text, fenced
        self.kind = RUN_KINDS.get(info.split()[0].lower() if info else "", None)
        self.skip = None      # reason, when marked skip
        self.timeout = None   # seconds, when marked
        self.fresh = False
        self.needs = []       # Python modules the block needs
        self.args = []        # command-line arguments of a python or sh block
        self.marker_error = None

    def where(self):
        return f"{self.path}:{self.line}"


def looks_like_command(text):
    for raw in text.splitlines():
        s = raw.strip()
        if not s:
            continue
        if s.startswith("$ ") or s.startswith(">>> ") or re.match(r"^[A-Z_][A-Z0-9_]*=\S*\s+\S", s):
            return True
        return any(s == w.strip() or s.startswith(w if w.endswith((" ", "/", "-")) else w + " ")
                   for w in COMMAND_WORDS)
    return False


def python_has(module):
    if module.startswith("command:"):
        return shutil.which(module[len("command:"):]) is not None
    python = os.environ.get("DSV41_DOC_PYTHON", "/usr/bin/python3")
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def apply_markers(block, markers):
    for m in markers:
        skip = re.fullmatch(r"skip\s*\((.+)\)", m)
        tmo = re.fullmatch(r"timeout\s+(\d+)", m)
        if skip:
            block.skip = skip.group(1).strip()
        elif tmo:
            block.timeout = int(tmo.group(1))
        elif m == "fresh":
            block.fresh = True
        elif m.startswith("args "):
            block.args += m.split()[1:]
        elif re.fullmatch(r"needs\s+(command:)?[A-Za-z_][\w.-]*", m):
            block.needs.append(m.split()[1])
        else:
            block.marker_error = (f"unknown doc-test marker '{m}' (want skip (REASON), timeout S, "
                                  "fresh, args A ..., needs MODULE, needs command:CMD)")


def parse_blocks(path, rel):
    """Every fenced and indented code block of the Markdown file `path`, in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, markers = [], []
    i, prev_blank, in_list = 0, True, False
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^( {0,3})(`{3,}|~{3,})\s*([^`]*)$", line)
        if fence:
            indent, ticks, info = len(fence.group(1)), fence.group(2), fence.group(3).strip()
            body, j = [], i + 1
            while j < len(lines) and not re.match(r"^ {0,3}" + re.escape(ticks[0]) + "{%d,}\\s*$"
                                                   % len(ticks), lines[j]):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            b = Block(rel, i + 1, info, "\n".join(body) + "\n", True)
            apply_markers(b, markers)
            blocks.append(b)
            markers, prev_blank, i = [], False, j + 1
            continue
        m = MARKER.match(line)
        if m:
            markers.append(m.group(1))
            i += 1
            continue
        if line.strip() and re.match(r"^\s{0,3}([-*+]|\d+[.)])\s", line):
            in_list = True
        elif not line.strip():
            pass
        elif not line.startswith(" "):
            in_list = False
        if line.startswith("    ") and line.strip() and prev_blank and not in_list:
            body, j = [], i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            b = Block(rel, i + 1, "", "\n".join(body) + "\n", False)
            apply_markers(b, markers)
            blocks.append(b)
            markers, prev_blank, i = [], True, j
            continue
        if line.strip():
            markers = []
        prev_blank = not line.strip()
        i += 1
    return blocks


def console_commands(text):
    """[(command, shown_output_lines)] of a console transcript."""
    cmds, cur, out, cont = [], None, [], False
    for raw in text.splitlines():
        if cont:
            cur += "\n" + raw
            cont = raw.rstrip().endswith("\\")
            continue
        if raw.startswith("$ "):
            if cur is not None:
                cmds.append((cur, out))
            cur, out = raw[2:], []
            cont = raw.rstrip().endswith("\\")
        elif cur is not None:
            out.append(raw)
    if cur is not None:
        cmds.append((cur, out))
    return cmds


def error_lines(shown):
    return [s.strip() for s in shown if re.match(r"^\s*(dsv41: )?error:", s)]


def shown_in(expected, actual):
    """Does `expected` (with `...` for any text) appear in one line of `actual`?"""
    pattern = ".*".join(re.escape(p.strip()) for p in expected.split("..."))
    return any(re.search(pattern, a) for a in actual.splitlines())


def expected_exit(cmd, shown):
    """('stated', N) for a `# exit N` comment, ('error', None) when the output shows an error line,
    else ('ok', 0)."""
    stated = re.search(r"#\s*exit\s+(\d+)\b[^\n]*$", cmd)
    if stated:
        return "stated", int(stated.group(1))
    return ("error", None) if error_lines(shown) else ("ok", 0)


def run_console(block, cwd, env, timeout):
    """A transcript's commands, in order, in one bash process (a variable set by one command is
    seen by the next); each command's output and exit status is kept; the script stops after the
    first command whose exit status is not the expected one."""
    cmds = console_commands(block.text)
    with tempfile.TemporaryDirectory(prefix="dsv41-doc-console-") as tmp:
        script = []
        for i, (cmd, shown) in enumerate(cmds):
            kind, n = expected_exit(cmd, shown)
            good = {"stated": f"[ $__rc = {n} ]", "error": "[ $__rc != 0 ]", "ok": "[ $__rc = 0 ]"}[kind]
            script.append(f"{{ {cmd}\n}} >'{tmp}/o{i}' 2>&1 </dev/null; __rc=$?; echo $__rc >'{tmp}/r{i}'")
            script.append(f"{good} || exit 0")
        try:
            subprocess.run(["bash", "-o", "pipefail", "-c", "\n".join(script)], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        log = []
        for i, (cmd, shown) in enumerate(cmds):
            if not os.path.exists(f"{tmp}/r{i}"):
                if os.path.exists(f"{tmp}/o{i}"):
                    with open(f"{tmp}/o{i}", errors="replace") as f:
                        log += [f"$ {cmd}", f.read().rstrip()]
                why = f"timed out after {timeout} s" if timed_out else "did not finish"
                return False, "\n".join(log + [why])
            with open(f"{tmp}/o{i}", errors="replace") as f:
                got = f.read()
            with open(f"{tmp}/r{i}") as f:
                rc = int(f.read())
            log += [f"$ {cmd}", got.rstrip(), f"(exit {rc})"]
            kind, n = expected_exit(cmd, shown)
            if kind == "stated" and rc != n:
                return False, "\n".join(log + [f"expected exit {n} (the doc says so)"])
            if kind == "error":
                if rc == 0:
                    return False, "\n".join(log + ["expected a non-zero exit (the doc shows an error)"])
                missing = [e for e in error_lines(shown) if not shown_in(e, got)]
                if missing:
                    return False, "\n".join(log + ["the doc shows an error it did not print: "
                                                   + missing[0]])
            if kind == "ok" and rc != 0:
                return False, "\n".join(log)
    return True, "\n".join(log)


def run_block(block, cwd, env, timeout):
    """(passed, output) of one runnable block."""
    if block.kind == "console":
        return run_console(block, cwd, env, timeout)
    if block.kind == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", block.text, "bash"] + block.args
    else:
        argv = [os.environ.get("DSV41_DOC_PYTHON", "/usr/bin/python3"), "-c", block.text] + block.args
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return False, out + f"\ntimed out after {timeout} s"
    return p.returncode == 0, p.stdout + p.stderr + f"\n(exit {p.returncode})"


def make_workdir(src, build):
    """A temp dir that looks like a checkout's root: symlinks to SRC's top-level entries."""
    d = tempfile.mkdtemp(prefix="dsv41-doc-")
    for name in os.listdir(src):
        if name in (".git", "build") or name.startswith("build-"):
            continue
        os.symlink(os.path.join(src, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def default_files(src):
    files = ["README.md"]
    files += sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
    ex = os.path.join(src, "examples")
    if os.path.isdir(ex):
        files += sorted(f"examples/{d}/README.md" for d in os.listdir(ex)
                        if os.path.isfile(os.path.join(ex, d, "README.md")))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", help="build dir holding dsv41 and python/")
    ap.add_argument("--python-dir", help="the built Python module's dir (default BUILD/python)")
    ap.add_argument("--not-built", metavar="REASON", help="print REASON and exit 77 (skipped)")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))), help="source tree (default: this checkout)")
    ap.add_argument("--timeout", type=int, default=120, help="per-block timeout, seconds")
    ap.add_argument("--list", action="store_true", help="list the blocks and what would happen")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("files", nargs="*", help="FILE or FILE:LINE, relative to --source")
    a = ap.parse_args()
    if a.not_built:
        print(f"doc_blocks: skipped: {a.not_built}")
        return 77
    if not a.build:
        ap.error("--build is required")
    src, build = os.path.abspath(a.source), os.path.abspath(a.build)
    pydir = os.path.abspath(a.python_dir) if a.python_dir else os.path.join(build, "python")
    if not a.list and not os.path.isfile(os.path.join(build, "dsv41")):
        print(f"doc_blocks: error: --build '{build}': no dsv41 binary there", file=sys.stderr)
        return 2
    wanted = {}
    for f in a.files or default_files(src):
        name, _, line = f.partition(":")
        if not os.path.isfile(os.path.join(src, name)):
            print(f"doc_blocks: error: '{name}': no such file under {src}", file=sys.stderr)
            return 2
        if line and not line.isdigit():
            print(f"doc_blocks: error: '{f}': want FILE or FILE:LINE", file=sys.stderr)
            return 2
        wanted.setdefault(name, set()).add(int(line) if line else None)

    env = dict(os.environ)
    python = os.environ.get("DSV41_DOC_PYTHON", "/usr/bin/python3")
    env["PATH"] = os.pathsep.join([build, os.path.dirname(python), env.get("PATH", "")])
    env["PYTHONPATH"] = pydir
    env["DSV41_SRC"] = src
    env.setdefault("DSV41_THREADS", "2")
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"

    counts = {"ran": 0, "passed": 0, "failed": 0, "skipped": 0, "unmarked": 0}
    failures = []
    for rel, lines in wanted.items():
        blocks = parse_blocks(os.path.join(src, rel), rel)
        last = None if None in lines else max(lines)
        starts = {b.line for b in blocks}
        if last is not None and not lines <= starts:
            print(f"doc_blocks: error: {rel}: no block starts at line "
                  f"{min(lines - starts)}; blocks start at {sorted(starts)}", file=sys.stderr)
            return 2
        workdir = None
        for b in blocks:
            if last is not None and b.line > last:
                break
            report = last is None or b.line in lines
            if b.marker_error:
                counts["failed"] += 1
                failures.append((b.where(), b.marker_error))
                continue
            if b.skip is not None:
                if report:
                    counts["skipped"] += 1
                    print(f"SKIP {b.where()} ({b.info or 'indented'}): {b.skip}")
                continue
            missing = [m for m in b.needs if not python_has(m)]
            if missing and b.kind is not None:
                if report:
                    counts["skipped"] += 1
                    what = (f"the command {missing[0][8:]}" if missing[0].startswith("command:")
                            else f"the Python module {missing[0]}")
                    print(f"SKIP {b.where()} ({b.info}): needs {what}, not installed here")
                continue
            if b.kind is None:
                if (not b.info) and looks_like_command(b.text) and report:
                    counts["unmarked"] += 1
                    failures.append((b.where(), "looks like a command but has no info string "
                                     "and no doc-test marker: fence it as sh/console/python to "
                                     "run it, text to show it, or mark it "
                                     "<!-- doc-test: skip (REASON) -->\n  " +
                                     b.text.splitlines()[0]))
                continue
            if a.list:
                print(f"RUN  {b.where()} ({b.info})" + (" fresh" if b.fresh else ""))
                continue
            if workdir is None or b.fresh:
                if workdir and not a.keep:
                    shutil.rmtree(workdir, ignore_errors=True)
                workdir = make_workdir(src, build)
            t0 = time.monotonic()
            ok, out = run_block(b, workdir, env, b.timeout or a.timeout)
            dt = time.monotonic() - t0
            if not report:
                continue
            counts["ran"] += 1
            counts["passed" if ok else "failed"] += 1
            print(f"{'PASS' if ok else 'FAIL'} {b.where()} ({b.info}) {dt:.1f} s", flush=True)
            if not ok:
                failures.append((b.where(), out[-OUTPUT_TAIL:]))
        if workdir:
            if a.keep:
                print(f"     {rel}: work dir kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)

    for where, why in failures:
        print(f"\n--- {where}: failed\n{why}")
    print(f"\ndoc blocks: {counts['ran']} ran, {counts['passed']} passed, {counts['failed']} "
          f"failed, {counts['skipped']} not run (marked skip, with the reason), "
          f"{counts['unmarked']} command-like blocks without an info string or marker")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--list | head`
        sys.exit(1)
