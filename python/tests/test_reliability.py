"""Issue 35, the output side, through the Python module: a DumpWriter whose HDF5 file cannot be
written (a full disk; here a file-size limit with SIGXFSZ ignored) raises dsv41.Error and the
interpreter lives on, exits cleanly, and leaves no file; conform on a dump with no steps answers
exit code 3 (no evidence) instead of killing the interpreter (docs/errors.md "Classes")."""
import json
import os
import subprocess
import sys
import textwrap

import dsv41
from conftest import CONFIG, WEIGHTS

PROMPT = [(13 * i + 7) % 1024 for i in range(40)]


def test_a_failed_hdf5_dump_raises_and_the_interpreter_exits_cleanly(tmp_path):
    out = tmp_path / "d.h5"
    script = textwrap.dedent(f"""
        import resource, signal, sys
        import dsv41
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        c = dsv41.Config.load({CONFIG!r})
        m = dsv41.Model(c, dsv41.Weights.load({WEIGHTS!r}, c))
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            w = dsv41.DumpWriter({str(out)!r}, c, weights={WEIGHTS!r})
            s = m.new_state()
            m.step(s, {PROMPT!r}, dump=w)
            w.finish()
        except dsv41.Error as e:
            print("raised:", e)
            sys.exit(7)
        print("no error")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert r.returncode == 7, (r.returncode, r.stdout, r.stderr)  # not -11 (SIGSEGV at exit)
    assert "raised:" in r.stdout, r.stdout
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [], "no temp file left"


def test_conform_on_a_dump_with_no_steps_is_inconclusive(tmp_path):
    c = dsv41.Config.load(CONFIG)
    m = dsv41.Model(c, dsv41.Weights.load(WEIGHTS, c))
    dump = tmp_path / "dump"
    w = dsv41.DumpWriter(str(dump), c, weights=WEIGHTS)
    m.step(m.new_state(), PROMPT[:3], dump=w)
    w.finish()
    manifest = json.loads((dump / "dump.json").read_text())
    for s in manifest["steps"]:
        (dump / s["file"]).unlink()
    manifest["steps"], manifest["n_steps"] = [], 0
    (dump / "dump.json").write_text(json.dumps(manifest))
    r = dsv41.conform(str(dump), weights=WEIGHTS, config=CONFIG)
    assert r["exit_code"] == 3
