#!/usr/bin/env python3
"""Self-test of tests/docs/doc_blocks.py: on a made-up source tree (a README.md and docs/*.md with
blocks that pass, fail, are marked, or look like commands without a marker) and a stand-in `dsv41`,
the runner must report each block as it should and exit non-zero exactly when it must.
Run: python3 tests/docs/doc_blocks_test.py (CTest: DocBlocks.RunnerSelfTest)."""

import os
import subprocess
import sys
import tempfile
import unittest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doc_blocks.py")

# A stand-in for the dsv41 binary: `dsv41 ok` exits 0, `dsv41 bad` prints an error and exits 2,
# `dsv41 fail` exits 1, `dsv41 write F` writes F.
FAKE_DSV41 = """#!/bin/bash
case "$1" in
  ok) echo "fine"; exit 0 ;;
  bad) echo "dsv41: error: --prompt: id 3 of 3 is 1024, outside the vocab" >&2; exit 2 ;;
  fail) echo "verdict fail"; exit 1 ;;
  write) echo data > "$2"; exit 0 ;;
esac
exit 9
"""

FENCE = "```"


def block(info, body, marker=None):
    head = f"<!-- doc-test: {marker} -->\n" if marker else ""
    return f"{head}{FENCE}{info}\n{body}\n{FENCE}\n\n"


class DocBlocksTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="doc-blocks-test-")
        self.src = os.path.join(self.tmp.name, "src")
        self.build = os.path.join(self.tmp.name, "build")
        os.makedirs(os.path.join(self.src, "docs"))
        os.makedirs(os.path.join(self.build, "python"))
        with open(os.path.join(self.build, "dsv41"), "w") as f:
            f.write(FAKE_DSV41)
        os.chmod(os.path.join(self.build, "dsv41"), 0o755)
        with open(os.path.join(self.src, "README.md"), "w") as f:
            f.write("# readme\n\n" + block("sh", "dsv41 ok"))

    def tearDown(self):
        self.tmp.cleanup()

    def run_doc(self, text, name="docs/a.md"):
        with open(os.path.join(self.src, name), "w") as f:
            f.write(text)
        p = subprocess.run([sys.executable, RUNNER, "--build", self.build, "--source", self.src,
                            "--timeout", "20", name], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def test_passing_blocks_of_every_kind(self):
        rc, out = self.run_doc(
            "# a\n\n" + block("sh", "dsv41 write made.txt\ntest -s made.txt")
            + block("console", "$ dsv41 ok\nfine\n$ dsv41 bad\ndsv41: error: --prompt: id 3 of 3 is ...\n"
                    "$ dsv41 fail   # exit 1\nverdict fail")
            + block("python", "import sys\nassert open('made.txt').read() == 'data\\n'\n"
                    "assert sys.argv[1:] == ['x', 'y']", marker="args x y")
            + block("console", '$ V=3\n$ test "$V" = 3')
            + block("text", "dsv41 forward --config C ...")
            + "    dsv41: error: an indented error line, not a command\n\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("4 ran, 4 passed, 0 failed", out)

    def test_a_failing_sh_block_is_named_with_its_line_and_output(self):
        rc, out = self.run_doc("# a\n\n" + block("sh", "echo before\ndsv41 fail\necho after"))
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL docs/a.md:3 (sh)", out)
        self.assertIn("verdict fail", out)
        self.assertNotIn("after", out.split("--- docs/a.md:3")[1])

    def test_console_exit_codes_and_error_lines_are_checked(self):
        for body, why in [("$ dsv41 fail", "(exit 1)"),                         # no `# exit 1`
                          ("$ dsv41 ok   # exit 1", "expected exit 1"),
                          ("$ dsv41 ok\ndsv41: error: something", "expected a non-zero exit"),
                          ("$ dsv41 bad\ndsv41: error: another message", "did not print")]:
            rc, out = self.run_doc("# a\n\n" + block("console", body))
            self.assertEqual(rc, 1, body + "\n" + out)
            self.assertIn(why, out, body)

    def test_python_block_failure(self):
        rc, out = self.run_doc("# a\n\n" + block("python", "raise SystemExit('boom')"))
        self.assertEqual(rc, 1, out)
        self.assertIn("boom", out)

    def test_skip_needs_a_reason_and_is_printed(self):
        rc, out = self.run_doc("# a\n\n" + block("sh", "exit 3", marker="skip (needs a GPU)"))
        self.assertEqual(rc, 0, out)
        self.assertIn("SKIP docs/a.md:4 (sh): needs a GPU", out)
        rc, out = self.run_doc("# a\n\n" + block("sh", "exit 3", marker="skip"))
        self.assertEqual(rc, 1, out)
        self.assertIn("unknown doc-test marker", out)

    def test_needs_a_missing_command_skips(self):
        rc, out = self.run_doc("# a\n\n" + block("sh", "exit 3", marker="needs command:no-such-cmd-xyz"))
        self.assertEqual(rc, 0, out)
        self.assertIn("needs the command no-such-cmd-xyz", out)

    def test_command_like_blocks_without_info_string_or_marker_fail(self):
        for text in ["# a\n\n" + block("", "dsv41 run x"),
                     "# a\n\ntext\n\n    $ dsv41 ok\n\n",
                     "# a\n\ntext\n\n    DSV41_X=1 build/dsv41 run\n\n",
                     "# a\n\n" + block("", ">>> import dsv41")]:
            rc, out = self.run_doc(text)
            self.assertEqual(rc, 1, text + out)
            self.assertIn("looks like a command", out, text)
        rc, out = self.run_doc("# a\n\ntext\n\n<!-- doc-test: skip (a template) -->\n\n    $ dsv41 x\n\n")
        self.assertEqual(rc, 0, out)

    def test_timeout(self):
        rc, out = self.run_doc("# a\n\n" + block("sh", "sleep 30", marker="timeout 1"))
        self.assertEqual(rc, 1, out)
        self.assertIn("timed out after 1 s", out)

    def test_not_built_is_a_ctest_skip(self):
        p = subprocess.run([sys.executable, RUNNER, "--not-built", "no module"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 77)


if __name__ == "__main__":
    unittest.main()
