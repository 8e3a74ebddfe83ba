#!/usr/bin/env python3
"""The HTML report in a real browser (docs/report-html.md, "Tested in a browser").

Loads the page `dsv41 report html` made from a report into headless Chromium through the DevTools
protocol and fails when:
  - the page logs any console error or throws (Runtime.consoleAPICalled error/assert,
    Runtime.exceptionThrown, Log.entryAdded error);
  - the page asks for anything but its own file (it must open offline);
  - it does not finish drawing (body[data-ready="1"]) within the time limit;
  - a plotted value differs from the value computed here from the HDF5 file with h5py (every
    heatmap cell of every comparison, the logits NMSE and KL per step, the top-k Jaccard per layer,
    the cache byte agreement per step, the accepted drafts per step);
  - the summary table has another number of rows, or its verdict filter shows another number;
  - a clicked heatmap cell does not show the command that reruns it.
It saves a screenshot of the page.

  report_html_browser.py --dsv41 build/dsv41 --work DIR [--report R.h5] [--screenshot OUT.png]

Without --report it first runs `dsv41 run` on a few scenarios of the built-in suite (one with a
planted defect, so a first divergence and kept tensors are drawn). Exit 0: every check passed;
1: a check failed; 77: skipped (no Chromium, h5py or the websocket client; CTest SKIP_RETURN_CODE).
"""
import argparse
import base64
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def skip(why):
    # Under CI (CI=true) a missing tool is a failure: scripts/setup.sh installs them all.
    print("SKIP:" if os.environ.get("CI") != "true" else "FAIL (CI):", why)
    sys.exit(SKIP if os.environ.get("CI") != "true" else 1)


try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    skip(f"python3 h5py/numpy missing ({e}): Debian python3-h5py python3-numpy")
try:
    import websocket  # Debian python3-websocket
except ImportError:
    skip("python3 websocket client missing: Debian python3-websocket")

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)
    return cond


# ---------- the expected values, from the HDF5 file ----------

def higher_is_better(m):  # reports::metric_higher_is_better
    return (m.endswith("_frac") or m.startswith("jaccard") or m.startswith("recall") or "_recall" in m
            or m in ("top1_agree", "tie_equivalent", "present"))


def excess(r):  # reports::excess
    if math.isnan(r["value"]):
        return math.inf
    beyond = r["bound"] - r["value"] if r["hib"] else r["value"] - r["bound"]
    scale = abs(r["bound"]) if r["bound"] != 0 and math.isfinite(r["bound"]) else 1.0
    return beyond / scale


def worst(rows):
    """The summary's rule (docs/report-schema.md, /summary): a checked row beats an unchecked one;
    the largest excess among checked rows, the largest value among unchecked ones (the smallest
    where higher is better; NaN worst); the first on ties."""
    best, score = None, -math.inf
    for r in rows:
        if r["checked"]:
            s = excess(r)
        elif math.isnan(r["value"]):
            s = math.inf
        else:
            s = -r["value"] if higher_is_better(r["metric"]) else r["value"]
        if best is None or (r["checked"] and not best["checked"]) or (r["checked"] == best["checked"] and s > score):
            best, score = r, s
    return best


def read_rows(group):
    cols = {}
    for k, d in group.items():
        cols[k] = d.asstr()[()] if d.dtype.kind in "OS" else d[()]
    n = len(cols["step"])
    out = []
    for i in range(n):
        origin = str(cols["origin"][i])
        out.append({"step": int(cols["step"][i]), "layer": int(cols["layer"][i]), "component": str(cols["component"][i]),
                    "metric": str(cols["metric"][i]), "value": float(cols["value"][i]), "bound": float(cols["bound"][i]),
                    "hib": bool(cols["higher_is_better"][i]), "checked": origin != "", "verdict": str(cols["verdict"][i])})
    return out


def expected(report):
    """Per comparison id ("<scenario>/<NN>"): its rows, verdict and acceptance rounds."""
    out = {}
    with h5py.File(report, "r") as f:
        scen = sorted(f["scenarios"].items(), key=lambda kv: int(kv[1].attrs["index"]))  # run order
        for name, s in scen:
            for nn, c in s["comparisons"].items():
                acc = []
                if "acceptance" in c:
                    a = c["acceptance"]
                    side = a["side"].asstr()[()]
                    for i in range(len(side)):
                        acc.append((int(a["step"][i]), int(a["session"][i]), str(side[i]), int(a["accepted"][i])))
                out[f"{name}/{nn}"] = {"rows": read_rows(c["metrics"]), "verdict": c.attrs["verdict"],
                                       "acceptance": acc}
    return out


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


# ---------- the browser ----------

class Browser:
    def __init__(self, chromium, profile, log):
        args = [chromium, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--disable-dev-shm-usage",  # containers often have a small /dev/shm
                "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 60
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} before DevTools started")
            if time.time() > deadline:
                raise RuntimeError("chromium did not start DevTools within 60 s")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def pump(self, seconds):
        end = time.time() + seconds
        self.ws.settimeout(0.2)
        try:
            while time.time() < end:
                try:
                    msg = json.loads(self.ws.recv())
                except websocket.WebSocketTimeoutException:
                    continue
                if "method" in msg:
                    self.events.append(msg)
        finally:
            self.ws.settimeout(60)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluate failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def console_errors(events):
    errs = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errs.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errs.append("exception: " + str(d.get("exception", {}).get("description", d.get("text"))))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errs.append("log error: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
    return errs


def foreign_requests(events, page_url):
    urls = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    return [u for u in urls if u != page_url and not u.startswith("data:") and not u.startswith("about:")]


# What the page drew: every mark with its value (report.js sets data-value = String(value)).
DOM_QUERY = r"""
(() => {
  const num = (s) => Number(s);
  const out = {comparisons: {}, rows: document.querySelectorAll('#summary tr.row').length};
  document.querySelectorAll('details.comparison').forEach((d) => {
    const id = d.dataset.id, c = {heatmap: null, points: {}};
    const hm = d.querySelector('[data-plot="heatmap"]');
    if (hm) c.heatmap = {component: hm.dataset.component, metric: hm.dataset.metric,
      cells: [...hm.querySelectorAll('rect.cell')].map((r) => [num(r.dataset.step), num(r.dataset.layer), r.dataset.value])};
    d.querySelectorAll('.plot[data-plot]').forEach((p) => {
      if (p.dataset.plot === 'heatmap') return;
      const pts = {};
      p.querySelectorAll('circle.point').forEach((e) => {
        (pts[e.dataset.series] = pts[e.dataset.series] || []).push([num(e.dataset.x), e.dataset.value]);
      });
      c.points[p.dataset.plot] = pts;
    });
    out.comparisons[id] = c;
  });
  return JSON.stringify(out);
})()
"""


def by(rows, **want):
    return [r for r in rows if all(r[k] == v for k, v in want.items())]


def check_page(dom, exp):
    check(set(dom["comparisons"]) == set(exp), f"comparisons on the page {sorted(dom['comparisons'])} != in the file {sorted(exp)}")
    cells = points = 0
    for cid, e in exp.items():
        c = dom["comparisons"].get(cid)
        if c is None:
            continue
        rows = e["rows"]
        hm = c["heatmap"]
        if rows and check(hm is not None, f"{cid}: no heatmap"):
            sel = by(rows, component=hm["component"], metric=hm["metric"])
            keys = {}
            for r in sel:
                keys.setdefault((r["step"], r["layer"]), []).append(r)
            check(len(hm["cells"]) == len(keys), f"{cid}: heatmap has {len(hm['cells'])} cells, the file {len(keys)} "
                                                 f"({hm['component']} {hm['metric']})")
            for step, layer, value in hm["cells"]:
                want = worst(keys.get((step, layer), []))
                cells += 1
                check(want is not None and same(float(value), want["value"]),
                      f"{cid}: heatmap {hm['component']} {hm['metric']} step {step} layer {layer}: page {value}, "
                      f"file {want and want['value']}")
        # Line plots: (plot, series) -> the rows they draw and the axis they are grouped by.
        plans = [("logits", "nmse", dict(component="logits", metric="nmse"), "step"),
                 ("logits", "kl", dict(component="logits", metric="kl"), "step"),
                 ("topk-jaccard", "jaccard_min", dict(component="topk", metric="jaccard_min"), "layer"),
                 ("topk-tie-band", "tie_band_max", dict(component="topk", metric="tie_band_max"), "layer")]
        for comp in sorted({r["component"] for r in rows if r["component"].startswith("cache.")}):
            plans.append(("cache-bytes", comp[6:], dict(component=comp, metric="bytes_equal_frac"), "step"))
        for plot, series, want, axis in plans:
            sel = [r for r in by(rows, **want) if axis == "step" or r["layer"] >= 0]
            groups = {}
            for r in sel:
                groups.setdefault(r[axis], []).append(r)
            drawn = c["points"].get(plot, {}).get(series, [])
            check(len(drawn) == len(groups), f"{cid}: {plot} {series}: {len(drawn)} points, the file has {len(groups)}")
            for x, value in drawn:
                w = worst(groups.get(x, []))
                points += 1
                check(w is not None and same(float(value), w["value"]),
                      f"{cid}: {plot} {series} at {axis} {x}: page {value}, file {w and w['value']}")
        if e["acceptance"]:
            for side in ("a", "b"):
                rounds = {}
                for step, session, sd, accepted in e["acceptance"]:
                    if sd == side:
                        rounds.setdefault((step, session), accepted)
                drawn = c["points"].get("acceptance", {}).get("accepted " + side, [])
                check(sorted((x, float(v)) for x, v in drawn) == sorted((s, float(m)) for (s, _), m in rounds.items()),
                      f"{cid}: accepted drafts of side {side} differ from the file")
                points += len(drawn)
    return cells, points


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv41", required=True)
    ap.add_argument("--work", required=True, help="scratch folder (made)")
    ap.add_argument("--report", help="an existing report (default: run a few scenarios)")
    ap.add_argument("--screenshot", help="PNG to write (default: WORK/report.png)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    ap.add_argument("--timeout", type=float, default=90)
    a = ap.parse_args()
    if not a.chromium:
        skip("no chromium (Debian chromium; scripts/setup.sh installs it)")
    os.makedirs(a.work, exist_ok=True)
    report = a.report
    t0 = time.time()
    if report is None:
        report = os.path.join(a.work, "run.h5")
        # A planted defect (a fail with a first divergence and kept tensors) and a speculative
        # scenario: the suite's scenarios, small.
        cmd = [a.dsv41, "run", "full_cache_hit", "speculative_rollback", "--sides", "ref,mutant:attn_out:L3:S1",
               "--mode", "teacher-forced", "-q", "-o", report]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if not check(r.returncode == 1, f"{' '.join(cmd)}: exit {r.returncode} (1 expected: the planted defect)\n{r.stderr}"):
            return 1
        print(f"ran the scenarios in {time.time() - t0:.1f} s")
    html = os.path.join(a.work, "report.html")
    r = subprocess.run([a.dsv41, "report", "html", report, "-o", html], capture_output=True, text=True)
    if not check(r.returncode == 0, f"report html: exit {r.returncode}: {r.stderr}"):
        return 1
    print(f"{html}: {os.path.getsize(html)} bytes")
    exp = expected(report)

    profile = tempfile.mkdtemp(prefix="chromium-", dir=a.work)
    log = open(os.path.join(a.work, "chromium.log"), "w")
    b = Browser(a.chromium, profile, log)
    try:
        for domain in ("Runtime", "Log", "Page", "Network"):
            b.call(domain + ".enable")
        b.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        url = "file://" + os.path.abspath(html)
        b.call("Page.navigate", url=url)
        deadline = time.time() + a.timeout
        ready = None
        while time.time() < deadline:
            b.pump(0.3)
            try:
                ready = b.eval("document.readyState === 'complete' && document.body.dataset.ready === '1'")
            except RuntimeError:
                ready = False
            if ready:
                break
        b.pump(0.5)
        check(ready, f"the page did not finish drawing within {a.timeout} s")
        print(f"page drawn in {time.time() - t0:.1f} s since start "
              f"(the page's script: {b.eval('document.body.dataset.drawMs')} ms after parsing)")
        dom = json.loads(b.eval(DOM_QUERY))
        cells, points = check_page(dom, exp)
        print(f"checked {cells} heatmap cells and {points} plotted points against {report}")
        check(cells > 0 and points > 0, "no plotted value was checked")
        n_cmp = len(exp)
        check(dom["rows"] >= n_cmp, f"summary table: {dom['rows']} rows for {n_cmp} comparisons")
        # The verdict filter: the rows left are exactly the comparisons of that verdict.
        for verdict in sorted({e["verdict"] for e in exp.values()}):
            shown = b.eval(f"""(() => {{ const s = document.getElementById('filter-verdict'); s.value = '{verdict}';
                s.dispatchEvent(new Event('change'));
                return [...document.querySelectorAll('#summary tr.row')].filter((r) => r.style.display !== 'none').length; }})()""")
            want = sum(1 for e in exp.values() if e["verdict"] == verdict)
            check(shown == want, f"verdict filter '{verdict}': {shown} rows shown, {want} in the file")
        b.eval("(() => { const s = document.getElementById('filter-verdict'); s.value = ''; s.dispatchEvent(new Event('change')); })()")
        # A click on the first heatmap cell shows its metrics and the command that reruns it.
        info = b.eval("""(() => { const r = document.querySelector('details.comparison[open] rect.cell.failing') ||
                                          document.querySelector('details.comparison[open] rect.cell') ||
                                          document.querySelector('rect.cell');
            r.dispatchEvent(new MouseEvent('click', {bubbles: true}));
            const box = r.closest('[data-plot="heatmap"]').querySelector('.cellinfo');
            return JSON.stringify({step: r.dataset.step, text: box.textContent}); })()""")
        info = json.loads(info)
        check(f"--stop-after-step {info['step']} --save-tensors" in info["text"],
              f"the clicked cell shows no rerun command for step {info['step']}: {info['text'][:300]}")
        b.eval("window.scrollTo(0, 0)")
        height = min(2600, int(b.eval("document.documentElement.scrollHeight")))
        b.call("Emulation.setDeviceMetricsOverride", width=1400, height=height, deviceScaleFactor=1, mobile=False)
        b.pump(0.5)
        shot = b.call("Page.captureScreenshot", format="png")
        png = a.screenshot or os.path.join(a.work, "report.png")
        with open(png, "wb") as out:
            out.write(base64.b64decode(shot["data"]))
        print(f"screenshot: {png} (1400 x {height})")
        b.pump(0.3)
        errs = console_errors(b.events)
        check(not errs, "console errors:\n  " + "\n  ".join(errs))
        foreign = foreign_requests(b.events, url)
        check(not foreign, "the page asked for other resources (it must open offline): " + ", ".join(foreign))
    finally:
        b.close()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} failed")
        return 1
    print("report_html_browser: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
