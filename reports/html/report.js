// reports/html/report.js: the page script of `dsv41 report html` (docs/report-html.md). It reads
// the report's data (the JSON in #dsv41-data, written by reports/report_html.cc) and draws with D3
// (embedded before this script). window.DSV41_REPORT is the data; every plotted mark carries its
// value in data-value (String(value): the shortest text that reads back to the same double), and
// body[data-ready="1"] is set once everything is drawn (tests/reports/report_html_browser.py).
(function () {
  'use strict';
  const DATA = JSON.parse(document.getElementById('dsv41-data').textContent);
  window.DSV41_REPORT = DATA;
  const S = DATA.strings;
  const RANK = {error: 0, fail: 1, inconclusive: 2, measured: 3, pass: 4};
  const VERDICTS = ['error', 'fail', 'inconclusive', 'measured', 'pass'];
  // A value of the JSON: numbers as they are, "NaN" / "Infinity" / "-Infinity" as those, null: NaN.
  const V = (x) => (x === null || x === undefined ? NaN : typeof x === 'string' ? Number(x) : x);
  const fmt = (v) => {
    if (Number.isNaN(v)) return 'NaN';
    if (!Number.isFinite(v)) return v > 0 ? 'inf' : '-inf';
    if (v === 0 || Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e5 ? String(+v.toPrecision(6)) : v.toExponential(3);
  };
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const badge = (v) => el('span', {class: 'badge v-' + v}, v);
  const layerName = (l) => (l < 0 ? '\u2014' : String(l));
  const pairName = (c) => c.side_a + ' vs ' + c.side_b;
  // As reports::metric_higher_is_better: fractions equal, Jaccard, recalls, agreement.
  const higherIsBetter = (m) => m.endsWith('_frac') || m.startsWith('jaccard') || m.startsWith('recall') ||
      m.includes('_recall') || m === 'top1_agree' || m === 'tie_equivalent' || m === 'present';
  // As reports::excess: how far beyond its bound a checked value lies (> 0: beyond).
  const excess = (r) => {
    if (Number.isNaN(r.value)) return Infinity;
    const beyond = r.hib ? r.bound - r.value : r.value - r.bound;
    return beyond / (r.bound !== 0 && Number.isFinite(r.bound) ? Math.abs(r.bound) : 1);
  };

  // A column given as runs [[value, count], ...], expanded.
  const unrun = (runs) => runs.flatMap(([v, n]) => new Array(n).fill(v));
  // The metric rows of a comparison as objects (columns in the JSON; repeating ones as runs).
  function rowsOf(c) {
    if (c._rows) return c._rows;
    const R = {metric: c.rows.metric, value: c.rows.value};
    for (const k of ['step', 'session', 'layer', 'component', 'bound', 'higher_is_better', 'origin', 'verdict']) {
      R[k] = unrun(c.rows[k]);
    }
    const out = [];
    for (let i = 0; i < R.step.length; i++) {
      const origin = S[R.origin[i]];
      out.push({step: R.step[i], session: R.session[i], layer: R.layer[i], component: S[R.component[i]],
                metric: S[R.metric[i]], value: V(R.value[i]), bound: V(R.bound[i]), hib: R.higher_is_better[i] === 1,
                origin: origin, checked: origin !== '', verdict: S[R.verdict[i]]});
    }
    c._rows = out;
    return out;
  }
  // The worst of some rows of one metric (the summary's rule, reports::summarize): a checked row
  // beats an unchecked one; among checked rows the largest excess, among unchecked ones the
  // largest value (the smallest where higher is better; NaN is worst); the first on ties.
  function worst(rows) {
    let best = null, score = -Infinity;
    for (const r of rows) {
      const s = r.checked ? excess(r) : Number.isNaN(r.value) ? Infinity : higherIsBetter(r.metric) ? -r.value : r.value;
      const take = best === null || (r.checked && !best.checked) || (r.checked === best.checked && s > score);
      if (take) { best = r; score = s; }
    }
    return best;
  }
  // rows grouped by key(row) -> worst row, in first-appearance order of the keys.
  function worstBy(rows, key) {
    const groups = new Map();
    for (const r of rows) {
      const k = key(r);
      if (!groups.has(k)) groups.set(k, []);
      groups.get(k).push(r);
    }
    const out = new Map();
    for (const [k, g] of groups) out.set(k, worst(g));
    return out;
  }

  // ---------- the header and the summary table ----------
  function header(app) {
    const m = DATA.meta;
    const h = el('div', {class: 'header'});
    const title = el('h1', {}, 'dsv41 divergence report ');
    title.appendChild(badge(DATA.verdict));
    h.appendChild(title);
    h.appendChild(el('span', {}, 'exit code ' + DATA.exit_code));
    h.appendChild(el('span', {class: 'mono'}, DATA.source));
    app.appendChild(h);
    const lines = [
      'config ' + m.config_name + (m.config_hash ? ' (hash ' + m.config_hash + ')' : '') + ', weights ' + m.weights +
          (m.weights_sha256 ? ' (sha256 ' + m.weights_sha256.slice(0, 16) + '\u2026)' : ''),
      'sides: ' + (m.sides.length ? m.sides.join(', ') : "each scenario's pairs"),
      (m.tool_version || 'dsv41') + (m.git_commit ? ' at ' + m.git_commit : '') + ', ' + m.created_utc + ', ' +
          fmt(V(m.seconds)) + ' s on ' + m.threads + ' thread(s); plots: ' + DATA.library,
      m.command_line,
    ];
    for (const l of lines) app.appendChild(el('div', {class: 'muted mono'}, l));
  }

  // One entry per comparison, plus one per scenario that errored or has no comparison: the
  // summary's lines, worst first (run order within a verdict).
  function items() {
    const out = [];
    let order = 0;
    const byScenario = new Map(DATA.scenarios.map((s) => [s.name, s]));
    for (const s of DATA.scenarios) {
      // As report show: an error is counted once (by the comparison that erred, if one did).
      const erred = DATA.comparisons.some((c) => c.scenario === s.name && c.verdict === 'error');
      if (s.comparisons === 0 || (s.verdict === 'error' && !erred)) {
        out.push({order: order++, scenario: s.name, pair: '', mode: '', verdict: s.verdict, c: null, s: s});
      }
    }
    for (const c of DATA.comparisons) {
      out.push({order: order++, scenario: c.scenario, pair: pairName(c), mode: c.mode, verdict: c.verdict, c: c,
                s: byScenario.get(c.scenario)});
    }
    out.sort((a, b) => RANK[a.verdict] - RANK[b.verdict] || a.order - b.order);
    return out;
  }

  function divergenceText(c) {
    const d = c.first_divergence;
    if (d) {
      const where = 'step ' + d.step + (d.layer >= 0 ? ' layer ' + d.layer : '') + ' ' + d.component + ' ' + d.metric +
          '=' + fmt(V(d.value));
      if (d.origin === 'none') return 'first difference (measured): ' + where;
      return 'first divergence: ' + where + (d.higher_is_better ? ' < ' : ' > ') + fmt(V(d.bound)) + ' (' + d.origin + ')';
    }
    return c.verdict !== 'pass' && c.notes.length ? c.notes[0] : '';
  }

  const FILTERS = [['scenario', 'scenario'], ['pair', 'side pair'], ['mode', 'mode'], ['verdict', 'verdict']];
  const filterState = {scenario: '', pair: '', mode: '', verdict: ''};
  const matches = (it) => FILTERS.every(([k]) => !filterState[k] || it[k] === filterState[k]);

  function summaryTable(app, list) {
    app.appendChild(el('h2', {}, 'Summary: ' + list.length + ' results, worst first'));
    const counts = VERDICTS.map((v) => list.filter((i) => i.verdict === v).length + ' ' + v);
    app.appendChild(el('div', {class: 'muted'}, DATA.scenarios.length + ' scenarios; ' + counts.join(', ')));
    const bar = el('div', {class: 'filters', id: 'filters'});
    for (const [key, label] of FILTERS) {
      const values = key === 'verdict' ? VERDICTS.filter((v) => list.some((i) => i.verdict === v))
                                       : [...new Set(list.map((i) => i[key]).filter((x) => x))];
      if (key === 'scenario') values.sort((a, b) => list.find((i) => i.scenario === a).s.index - list.find((i) => i.scenario === b).s.index);
      const lab = el('label', {}, label);
      const sel = el('select', {id: 'filter-' + key, 'data-filter': key});
      sel.appendChild(el('option', {value: ''}, 'all'));
      for (const v of values) sel.appendChild(el('option', {value: v}, v));
      sel.addEventListener('change', () => { filterState[key] = sel.value; applyFilters(); });
      lab.appendChild(sel);
      bar.appendChild(lab);
    }
    bar.appendChild(el('span', {id: 'filter-count', class: 'muted'}));
    app.appendChild(bar);
    const table = el('table', {class: 'summary', id: 'summary'});
    const head = el('tr');
    for (const t of ['verdict', 'scenario', 'sides', 'mode', 'expect', 'steps', 'items', 'first divergence / note']) {
      head.appendChild(el('th', {}, t));
    }
    table.appendChild(head);
    for (const it of list) {
      const tr = el('tr', {class: 'row', 'data-scenario': it.scenario, 'data-pair': it.pair, 'data-mode': it.mode,
                           'data-verdict': it.verdict, 'data-id': it.c ? it.c.id : it.scenario + '/scenario'});
      const td = el('td');
      td.appendChild(badge(it.verdict));
      tr.appendChild(td);
      tr.appendChild(el('td', {}, it.scenario));
      if (it.c) {
        tr.appendChild(el('td', {class: 'mono'}, it.pair));
        tr.appendChild(el('td', {}, it.mode));
        tr.appendChild(el('td', {}, it.c.expectation));
        tr.appendChild(el('td', {class: 'num'}, String(it.c.steps_compared)));
        tr.appendChild(el('td', {class: 'num'}, String(it.c.items_compared)));
        tr.appendChild(el('td', {class: 'mono'}, divergenceText(it.c)));
        tr.addEventListener('click', () => {
          const d = document.getElementById('cmp-' + it.c.id);
          d.open = true;
          d.scrollIntoView({block: 'start'});
        });
      } else {
        tr.appendChild(el('td', {colspan: 6, class: 'mono'}, 'scenario ' + (it.s.error || '(no comparisons)')));
      }
      table.appendChild(tr);
    }
    app.appendChild(table);
  }

  function applyFilters() {
    let shown = 0, total = 0;
    document.querySelectorAll('#summary tr.row').forEach((tr) => {
      const ok = FILTERS.every(([k]) => !filterState[k] || tr.dataset[k] === filterState[k]);
      tr.style.display = ok ? '' : 'none';
      shown += ok;
      total += 1;
    });
    document.querySelectorAll('details.comparison').forEach((d) => {
      d.style.display = matches(d._item) ? '' : 'none';
    });
    document.getElementById('filter-count').textContent = shown + ' of ' + total + ' shown';
  }

  // ---------- plots ----------
  const COLORS = d3.schemeTableau10;
  // A small chart of points over an ordinal x: series [{name, points: [{x, y}]}]; y 'unit' ([0, 1]),
  // 'log' (0 drawn on the floor line) or 'linear' (from 0). Marks carry data-series/x/value.
  function chart(parent, o) {
    const box = el('div', {class: 'plot', 'data-plot': o.plot});
    box.appendChild(el('div', {class: 'title'}, o.title));
    parent.appendChild(box);
    const all = o.series.flatMap((s) => s.points);
    if (!all.length) {
      box.appendChild(el('div', {class: 'empty'}, o.empty || 'no rows'));
      return box;
    }
    const xs = o.xs || [...new Set(all.map((p) => p.x))].sort((a, b) => a - b);
    const legendW = 14 + 7.5 * Math.max(...o.series.map((s) => s.name.length));  // the legend, right of the plot
    const m = {l: 54, r: 10 + legendW, t: 8, b: 30};
    const W = Math.max(220, Math.min(720, 40 + xs.length * 22)) + legendW, H = 150;
    const svg = d3.select(box).append('svg').attr('width', W).attr('height', H + (o.strip ? 22 : 0));
    const x = d3.scalePoint().domain(xs).range([m.l, W - m.r]).padding(0.5);
    const finite = all.map((p) => p.y).filter((v) => Number.isFinite(v));
    let y, floor = null;
    if (o.y === 'unit') {
      y = d3.scaleLinear().domain([Math.min(0, d3.min(finite) || 0), Math.max(1, d3.max(finite) || 1)]).range([H - m.b, m.t]);
    } else if (o.y === 'log') {
      const pos = finite.filter((v) => v > 0);
      const lo = pos.length ? d3.min(pos) / 2 : 1e-12, hi = pos.length ? d3.max(pos) * 2 : 1;
      y = d3.scaleLog().domain([lo, hi]).range([H - m.b, m.t]).clamp(true);
      floor = lo;
    } else {
      y = d3.scaleLinear().domain([0, Math.max(1, d3.max(finite) || 1)]).nice().range([H - m.b, m.t]);
    }
    const yOf = (v) => (!Number.isFinite(v) ? m.t : floor !== null && v <= 0 ? y(floor) : y(v));
    const step = Math.max(1, Math.ceil(xs.length / 24));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(0,' + (H - m.b) + ')')
        .call(d3.axisBottom(x).tickValues(xs.filter((_, i) => i % step === 0)).tickFormat(o.xFormat || String));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(' + m.l + ',0)')
        .call(d3.axisLeft(y).ticks(4, o.y === 'log' ? '.0e' : undefined));
    svg.append('text').attr('x', W / 2).attr('y', H - 2).attr('text-anchor', 'middle').attr('font-size', 10).text(o.xLabel);
    o.series.forEach((s, i) => {
      const color = s.color || COLORS[i % 10];
      const pts = s.points.filter((p) => xs.includes(p.x));
      svg.append('path').attr('class', 'line').attr('stroke', color)
          .attr('d', d3.line().x((p) => x(p.x)).y((p) => yOf(p.y))(pts));
      svg.selectAll(null).data(pts).enter().append('circle').attr('class', 'point')
          .attr('cx', (p) => x(p.x)).attr('cy', (p) => yOf(p.y)).attr('r', 3.2)
          .attr('fill', (p) => (Number.isNaN(p.y) ? '#6a1b9a' : color))
          .attr('data-series', s.name).attr('data-x', (p) => p.x).attr('data-value', (p) => String(p.y))
          .append('title').text((p) => s.name + ' at ' + o.xLabel + ' ' + p.x + ': ' + fmt(p.y) + (p.note || ''));
    });
    const legend = svg.append('g').attr('class', 'legend');
    o.series.forEach((s, i) => {
      legend.append('text').attr('x', W - legendW + 6).attr('y', m.t + 10 + 11 * i).attr('text-anchor', 'start')
          .attr('fill', s.color || COLORS[i % 10]).text(s.name);
    });
    if (o.strip) o.strip(svg, x, H);
    return box;
  }

  // Per x (step or layer) the worst row of one (component, metric): points {x, y}.
  function series(rows, component, metric, xKey, name) {
    const sel = rows.filter((r) => r.component === component && r.metric === metric);
    const w = worstBy(sel, (r) => r[xKey]);
    return {name: name || metric, points: [...w.values()].map((r) => ({x: r[xKey], y: r.value}))};
  }

  function logitsPlot(box, c, rows) {
    const logit = rows.filter((r) => r.component === 'logits');
    const flips = worstBy(logit.filter((r) => r.metric === 'flip_class'), (r) => r.step);
    const agree = worstBy(logit.filter((r) => r.metric === 'top1_agree'), (r) => r.step);
    chart(box, {plot: 'logits', title: 'logits per step: NMSE, KL (log scale; 0 on the floor), top-1 agreement',
                xLabel: 'step', y: 'log', empty: 'no logits compared',
                series: [series(logit, 'logits', 'nmse', 'step'), series(logit, 'logits', 'kl', 'step')],
                xs: [...new Set(logit.map((r) => r.step))].sort((a, b) => a - b),
                strip: (svg, x, H) => {
                  for (const [step, r] of agree) {
                    const f = flips.get(step), cls = r.value === 1 ? 'agree' : f && f.value === 1 ? 'near-tie flip' : 'flip';
                    const g = svg.append('g').attr('class', 'top1').attr('data-x', step).attr('data-value', String(r.value))
                        .attr('data-flip', f ? String(f.value) : '');
                    const cx = x(step), cy = H + 10;
                    if (cls === 'agree') g.append('circle').attr('cx', cx).attr('cy', cy).attr('r', 4).attr('fill', '#2e7d32');
                    else if (cls === 'near-tie flip') g.append('path').attr('d', d3.symbol().type(d3.symbolTriangle).size(50)()).attr('transform', 'translate(' + cx + ',' + cy + ')').attr('fill', '#ef6c00');
                    else g.append('path').attr('d', d3.symbol().type(d3.symbolCross).size(60)()).attr('transform', 'translate(' + cx + ',' + cy + ') rotate(45)').attr('fill', '#c62828');
                    g.append('title').text('step ' + step + ': top-1 ' + cls);
                  }
                  svg.append('text').attr('x', 4).attr('y', H + 14).attr('font-size', 10).text('top-1');
                }});
    box.lastChild.appendChild(el('div', {class: 'notes'},
        'top-1 row: \u25cf agree, \u25b2 near-tie flip (margin within the tie band), \u2716 substantive flip'));
  }

  function layerPlots(box, rows) {
    const topk = rows.filter((r) => r.component === 'topk' && r.layer >= 0);
    chart(box, {plot: 'topk-jaccard', title: 'top-k Jaccard per layer (min over steps)', xLabel: 'layer', y: 'unit',
                empty: 'no top-k compared', series: [series(topk, 'topk', 'jaccard_min', 'layer')]});
    chart(box, {plot: 'topk-tie-band', title: 'top-k tie band per layer (max over steps)', xLabel: 'layer', y: 'linear',
                empty: 'no top-k compared', series: [series(topk, 'topk', 'tie_band_max', 'layer')]});
    const cand = rows.filter((r) => r.component === 'candidates' && r.layer >= 0);
    const metrics = [...new Set(cand.map((r) => r.metric))].filter((m) => m.includes('recall'));
    chart(box, {plot: 'candidate-recall', title: 'candidate recall per layer (min over steps)', xLabel: 'layer', y: 'unit',
                empty: 'no candidates compared', series: metrics.map((m) => series(cand, 'candidates', m, 'layer'))});
  }

  function cachePlot(box, rows) {
    const cache = rows.filter((r) => r.component.startsWith('cache.') && r.metric === 'bytes_equal_frac');
    const comps = [...new Set(cache.map((r) => r.component))];
    chart(box, {plot: 'cache-bytes', title: 'cache byte agreement per step (bytes_equal_frac, min over layers)',
                xLabel: 'step', y: 'unit', empty: 'no cache bytes compared',
                series: comps.map((k) => series(cache, k, 'bytes_equal_frac', 'step', k.slice(6)))});
  }

  function acceptancePlot(box, c) {
    if (!c.acceptance.length) return;
    const rounds = {a: new Map(), b: new Map()};  // (step, session) -> its first row: the round
    for (const r of c.acceptance) {
      const k = r.step + '/' + r.session;
      if ((r.side === 'a' || r.side === 'b') && !rounds[r.side].has(k)) rounds[r.side].set(k, r);
    }
    const pts = (side, f) => [...rounds[side].values()].map((r) => ({x: r.step, y: r[f]}));
    chart(box, {plot: 'acceptance', title: 'speculative acceptance per step: drafts accepted (m) per side, verified (k), proposed (n)',
                xLabel: 'step', y: 'linear',
                series: [{name: 'accepted a', points: pts('a', 'accepted')}, {name: 'accepted b', points: pts('b', 'accepted')},
                         {name: 'verified a', points: pts('a', 'verified')}, {name: 'proposed a', points: pts('a', 'proposed')}]});
  }

  // ---------- the heatmap: one component's worst metric per (step, layer) ----------
  function heatmap(box, c, rows, scenario) {
    const comps = [...new Set(rows.map((r) => r.component))];
    if (!comps.length) { box.appendChild(el('div', {class: 'empty'}, 'no metric rows')); return; }
    const d = c.first_divergence;
    // The default: the first divergence's component and metric (for a pair that is not bit-exact by
    // design, its NMSE: how far apart says more there than how many bits differ).
    let comp = d && comps.includes(d.component) ? d.component : null, metric = d && comp ? d.metric : null;
    if (comp && c.expectation !== 'bitexact' && c.verdict !== 'fail' &&
        rows.some((r) => r.component === comp && r.metric === 'nmse')) {
      metric = 'nmse';
    }
    if (!comp) {  // the component of the worst difference (a nonzero nmse), else attn_out, else one per layer
      const nmse = worst(rows.filter((r) => r.metric === 'nmse'));
      const layered = new Set(rows.filter((r) => r.layer >= 0).map((r) => r.component));
      comp = nmse && nmse.value !== 0 ? nmse.component
           : layered.has('attn_out') ? 'attn_out' : comps.find((k) => layered.has(k)) || comps[0];
    }
    const wrap = el('div', {class: 'plot', 'data-plot': 'heatmap', 'data-comparison': c.id});
    wrap.appendChild(el('div', {class: 'title'}, 'step \u00d7 layer: the worst value of one metric of one component (click a cell)'));
    const controls = el('div', {class: 'controls'});
    const cs = el('select', {class: 'hm-component'}), ms = el('select', {class: 'hm-metric'});
    const failing = new Set(rows.filter((r) => r.verdict === 'fail').map((r) => r.component));
    for (const k of comps) cs.appendChild(el('option', {value: k}, k + (failing.has(k) ? '  (fails)' : '')));
    controls.append('component ', cs, '  metric ', ms);
    wrap.appendChild(controls);
    const area = el('div'), info = el('div', {class: 'cellinfo', style: 'display:none'});
    wrap.append(area, info);
    box.appendChild(wrap);
    const fillMetrics = () => {
      ms.textContent = '';
      const mets = [...new Set(rows.filter((r) => r.component === cs.value).map((r) => r.metric))];
      for (const m of mets) ms.appendChild(el('option', {value: m}, m));
      const pref = ['bit_equal_frac', 'bytes_equal_frac', 'nmse', 'jaccard_min', 'block_recall_min', 'equal_frac'];
      ms.value = metric && mets.includes(metric) ? metric : pref.find((p) => mets.includes(p)) || mets[0];
      metric = null;
    };
    const draw = () => {
      area.textContent = '';
      info.style.display = 'none';
      drawHeatmap(area, info, c, rows, scenario, cs.value, ms.value);
      wrap.setAttribute('data-component', cs.value);
      wrap.setAttribute('data-metric', ms.value);
    };
    cs.value = comp;
    fillMetrics();
    cs.addEventListener('change', () => { fillMetrics(); draw(); });
    ms.addEventListener('change', draw);
    draw();
  }

  function drawHeatmap(area, info, c, rows, scenario, comp, metric) {
    const sel = rows.filter((r) => r.component === comp && r.metric === metric);
    const cells = worstBy(sel, (r) => r.step + '/' + r.layer);
    const failCells = new Set(rows.filter((r) => r.component === comp && r.verdict === 'fail').map((r) => r.step + '/' + r.layer));
    const steps = [...new Set(rows.map((r) => r.step))].sort((a, b) => a - b);
    const layers = [...new Set(sel.map((r) => r.layer))].sort((a, b) => a - b);
    const hib = sel.length ? (sel.some((r) => r.checked) ? sel.find((r) => r.checked).hib : higherIsBetter(metric)) : false;
    const bad = (v) => (hib ? 1 - v : v);  // 0: equal; larger: further apart
    const pos = [...cells.values()].map((r) => bad(r.value)).filter((v) => Number.isFinite(v) && v > 0);
    // A log scale from the smallest to the largest distance (one distance alone: the darkest), never
    // the near-white start of the scheme, so any difference stands out from "equal".
    const hi = pos.length ? d3.max(pos) : 1, lo = pos.length ? Math.min(d3.min(pos), hi / 100) : 0.01;
    const color = d3.scaleSequentialLog((t) => d3.interpolateOrRd(0.25 + 0.75 * t)).domain([lo, hi]);
    const fill = (v) => (Number.isNaN(v) ? '#6a1b9a' : bad(v) <= 0 ? '#e8f5e9' : !Number.isFinite(bad(v)) ? '#4a0000' : color(bad(v)));
    const cw = steps.length > 40 ? 9 : 18, ch = 16, m = {l: 44, t: 8, b: 28};
    const W = m.l + steps.length * cw + 240, H = m.t + layers.length * ch + m.b;
    const svg = d3.select(area).append('svg').attr('width', W).attr('height', Math.max(H, 90));
    const x = d3.scaleBand().domain(steps).range([m.l, m.l + steps.length * cw]);
    const y = d3.scaleBand().domain(layers).range([m.t, m.t + layers.length * ch]);
    const every = Math.max(1, Math.ceil(steps.length / 20));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(0,' + (m.t + layers.length * ch) + ')')
        .call(d3.axisBottom(x).tickValues(steps.filter((_, i) => i % every === 0)));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(' + m.l + ',0)').call(d3.axisLeft(y).tickFormat(layerName));
    svg.append('text').attr('x', m.l + steps.length * cw / 2).attr('y', H - 2).attr('text-anchor', 'middle').attr('font-size', 10).text('step');
    svg.append('text').attr('transform', 'translate(10,' + (m.t + layers.length * ch / 2) + ') rotate(-90)').attr('text-anchor', 'middle').attr('font-size', 10).text('layer');
    const data = [...cells.values()];
    svg.selectAll(null).data(data).enter().append('rect')
        .attr('class', (r) => 'cell' + (failCells.has(r.step + '/' + r.layer) ? ' failing' : ''))
        .attr('x', (r) => x(r.step)).attr('y', (r) => y(r.layer)).attr('width', x.bandwidth()).attr('height', y.bandwidth())
        .attr('fill', (r) => fill(r.value))
        .attr('data-step', (r) => r.step).attr('data-layer', (r) => r.layer).attr('data-component', comp)
        .attr('data-metric', metric).attr('data-value', (r) => String(r.value))
        .on('click', function (r) {
          svg.selectAll('rect.cell').classed('selected', false);
          d3.select(this).classed('selected', true);
          cellInfo(info, c, rows, scenario, r.step, r.layer, comp);
        })
        .append('title').text((r) => 'step ' + r.step + ' layer ' + layerName(r.layer) + ': ' + metric + ' ' + fmt(r.value) +
                                    (r.checked ? ' (bound ' + fmt(r.bound) + ', ' + r.verdict + ')' : ' (measured)'));
    // The legend: the colour of "equal", the scale of how far apart, NaN, failing cells.
    const lx = m.l + steps.length * cw + 16, lg = svg.append('g').attr('class', 'legend');
    lg.append('rect').attr('x', lx).attr('y', m.t).attr('width', 12).attr('height', 10).attr('fill', '#e8f5e9').attr('stroke', '#999');
    lg.append('text').attr('x', lx + 16).attr('y', m.t + 9).text(hib ? metric + ' = 1 (equal)' : metric + ' = 0 (equal)');
    const n = 24;
    for (let i = 0; i < n; i++) {
      lg.append('rect').attr('x', lx + i * 4).attr('y', m.t + 16).attr('width', 4).attr('height', 10)
          .attr('fill', color(lo * Math.pow(hi / lo, i / (n - 1))));
    }
    lg.append('text').attr('x', lx).attr('y', m.t + 38).text((hib ? '1 \u2212 value ' : '') + fmt(lo) + ' \u2026 ' + fmt(hi));
    lg.append('rect').attr('x', lx).attr('y', m.t + 44).attr('width', 12).attr('height', 10).attr('fill', '#fff')
        .attr('stroke', '#c62828').attr('stroke-width', 2.5);
    lg.append('text').attr('x', lx + 16).attr('y', m.t + 53).text('a checked metric fails');
  }

  // What one cell holds: the component's metrics there, where the two sides first differ, the rerun.
  function cellInfo(info, c, rows, scenario, step, layer, comp) {
    info.textContent = '';
    info.style.display = '';
    const st = scenario.steps.find((s) => s.step === step);
    info.appendChild(el('h3', {}, 'step ' + step + (st ? ' (' + st.phase + ', session ' + st.session + ', positions ' +
        st.start_pos + '\u2026' + (st.start_pos + st.tokens - 1) + (st.boundaries.length ? ', ' + st.boundaries.join(', ') : '') + ')' : '') +
        ', layer ' + layerName(layer) + ', component ' + comp));
    const t = el('table');
    const head = el('tr');
    for (const h of ['metric', 'value', 'bound', 'origin', 'verdict']) head.appendChild(el('th', {}, h));
    t.appendChild(head);
    for (const r of rows.filter((r) => r.step === step && r.layer === layer && r.component === comp)) {
      const tr = el('tr', {'data-metric': r.metric, 'data-value': String(r.value)});
      tr.append(el('td', {class: 'mono'}, r.metric), el('td', {class: 'mono'}, fmt(r.value)),
                el('td', {class: 'mono'}, r.checked ? (r.hib ? '\u2265 ' : '\u2264 ') + fmt(r.bound) : ''),
                el('td', {}, r.origin || 'measured'), el('td', {}, r.verdict));
      t.appendChild(tr);
    }
    info.appendChild(t);
    const d = c.first_divergence;
    const kept = c.tensors.find((k) => k.step === step && k.layer === layer && k.component === comp);
    let where;
    if (d && d.step === step && d.layer === layer && d.component === comp && d.detail) {
      where = 'first divergence: ' + d.detail;
    } else if (kept && kept.first) {
      where = 'kept tensors (' + kept.dtype + ' [' + kept.shape.join(', ') + ']): ' + kept.differ + ' of ' + kept.elements +
          ' differ; first at [' + kept.first.coord.join(', ') + ']: a=' + fmt(V(kept.first.a)) + ' b=' + fmt(V(kept.first.b)) +
          ', max |d| ' + fmt(V(kept.max_abs));
    } else if (kept) {
      where = 'kept tensors: the two sides are equal here';
    } else {
      const fm = rows.find((r) => r.step === step && r.layer === layer && r.component === comp && r.metric === 'first_mismatch');
      where = fm && fm.value >= 0 ? 'first mismatch at flat index ' + fm.value + '; both values are not kept in the report: the command below keeps them'
                                  : 'no element differs at this cell (or the report records no element index)';
    }
    info.appendChild(el('div', {class: 'mono'}, where));
    info.appendChild(el('div', {}, 'rerun just this cell and keep both sides\u2019 tensors:'));
    info.appendChild(el('code', {class: 'cmd'}, c.rerun_prefix + ' --stop-after-step ' + step + " --save-tensors 'step=" + step +
        ',layer=' + layer + ',component=' + comp + "' -o rerun.h5"));
  }

  function comparisonSection(app, it, openIt) {
    const c = it.c;
    const det = el('details', {class: 'comparison', id: 'cmp-' + c.id, 'data-id': c.id});
    det._item = it;
    if (openIt) det.open = true;
    const sum = el('summary');
    sum.append(badge(c.verdict), ' ' + c.scenario + ' #' + c.nn + ': ', el('span', {class: 'mono'}, pairName(c)),
               ' [' + c.mode + '], expect ' + c.expectation + ', ' + c.steps_compared + ' steps, ' + c.items_compared + ' items');
    det.appendChild(sum);
    det.appendChild(el('div', {class: 'notes'}, c.expectation_origin));
    const dt = divergenceText(c);
    if (dt) det.appendChild(el('div', {class: 'mono'}, dt));
    if (c.first_divergence && c.first_divergence.detail) det.appendChild(el('div', {class: 'mono muted'}, c.first_divergence.detail));
    if (c.first_divergence && c.first_divergence.rerun) det.appendChild(el('code', {class: 'cmd'}, c.first_divergence.rerun));
    // The notes: the first three, the rest behind a click (a comparison of caches in other formats
    // has one per cache and layer).
    const notes = !c.first_divergence && c.verdict !== 'pass' ? c.notes.slice(1) : c.notes;  // the first is above
    const shownNotes = notes.length > 4 ? notes.slice(0, 3) : notes;
    for (const n of shownNotes) det.appendChild(el('div', {class: 'notes'}, n));
    if (shownNotes.length < notes.length) {
      const more = el('details', {class: 'notes'});
      more.appendChild(el('summary', {}, (notes.length - shownNotes.length) + ' more notes'));
      for (const n of notes.slice(shownNotes.length)) more.appendChild(el('div', {}, n));
      det.appendChild(more);
    }
    const rows = rowsOf(c);
    try {
      heatmap(det, c, rows, it.s);
      const plots = el('div', {class: 'plots'});
      det.appendChild(plots);
      logitsPlot(plots, c, rows);
      cachePlot(plots, rows);
      layerPlots(plots, rows);
      acceptancePlot(plots, c);
    } catch (e) {
      det.appendChild(el('div', {class: 'notes'}, 'could not draw this comparison: ' + e));
      console.error('dsv41 report: comparison ' + c.id + ': ' + (e && e.stack ? e.stack : e));
    }
    app.appendChild(det);
  }

  function main() {
    const t0 = performance.now();
    const app = document.getElementById('app');
    app.textContent = '';
    header(app);
    const list = items();
    summaryTable(app, list);
    app.appendChild(el('h2', {}, 'Comparisons (worst first; click a summary row to open one)'));
    let opened = 0;
    for (const it of list) {
      if (!it.c) continue;
      comparisonSection(app, it, opened === 0 && (it.verdict !== 'pass' || list.every((i) => i.verdict === 'pass')));
      opened++;
    }
    applyFilters();
    document.body.setAttribute('data-draw-ms', String(Math.round(performance.now() - t0)));
    document.body.setAttribute('data-ready', '1');
  }
  main();
})();
