// zflow ui: the page. It reads the JSON of ui/src/views.rs (`api/graph`, `api/stage/NAME`,
// `api/report`) and the server-sent events of ui/src/live.rs (`api/events`: `status` and
// `metrics`), and draws everything itself in SVG: no libraries, nothing fetched from elsewhere.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const STATES = ['done', 'running', 'failed', 'stopped', 'pending', 'error'];
const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
  '#7f7f7f', '#bcbd22', '#17becf'];
const NODE_W = 176, NODE_H = 38, COL_W = 214, ROW_H = 52, PAD = 8;

const page = { graph: null, status: null, curves: {}, batches: {}, selected: null, reportShown: false };

function $(id) { return document.getElementById(id); }

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function html(tag, text, attrs = {}) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function getJSON(path) {
  const r = await fetch(path);
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

function bytes(n) {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function short(text, n) { return text.length > n ? text.slice(0, n - 1) + '…' : text; }

// ---- The stage graph ----------------------------------------------------------------------

function drawGraph(g) {
  page.graph = g;
  $('recipe').textContent = g.recipe;
  $('store').textContent = g.store;
  document.title = `zflow: ${g.recipe}`;
  const legend = $('legend');
  for (const s of STATES) {
    const item = html('span', s);
    item.prepend(html('i', undefined, { class: `state-${s}` }));
    legend.append(item);
  }
  const columns = Math.max(1, ...g.stages.map(s => s.column + 1));
  const rows = Math.max(1, ...g.stages.map(s => s.row + 1));
  const width = PAD * 2 + (columns - 1) * COL_W + NODE_W;
  const height = PAD * 2 + (rows - 1) * ROW_H + NODE_H;
  const root = $('graph');
  root.setAttribute('width', width);
  root.setAttribute('height', height);
  root.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const at = new Map(g.stages.map(s => [s.name, s]));
  const x = s => PAD + s.column * COL_W;
  const y = s => PAD + s.row * ROW_H;
  for (const s of g.stages) {
    for (const need of s.needs) {
      const from = at.get(need);
      if (!from) continue;
      const x0 = x(from) + NODE_W, y0 = y(from) + NODE_H / 2, x1 = x(s), y1 = y(s) + NODE_H / 2;
      const mid = (x0 + x1) / 2;
      root.append(svg('path', {
        class: 'edge', d: `M${x0},${y0} C${mid},${y0} ${mid},${y1} ${x1},${y1}`,
        'data-from': need, 'data-to': s.name,
      }));
    }
  }
  for (const s of g.stages) {
    const node = svg('g', {
      class: 'node pending', 'data-stage': s.name, transform: `translate(${x(s)},${y(s)})`,
    });
    node.append(svg('title', {}, s.name));
    node.append(svg('rect', { width: NODE_W, height: NODE_H, class: 'state-pending' }));
    node.append(svg('text', { x: 8, y: 16 }, short(s.name, 25)));
    node.append(svg('text', { x: 8, y: 31, class: 'kind' }, s.kind));
    node.addEventListener('click', () => select(s.name));
    root.append(node);
  }
  performance.mark('zflow-graph');
}

function paintGraph(status) {
  const counts = {};
  for (const s of status.stages) {
    counts[s.word] = (counts[s.word] || 0) + 1;
    const node = document.querySelector(`#graph .node[data-stage="${CSS.escape(s.name)}"]`);
    if (!node) continue;
    node.setAttribute('class', `node ${s.word}${page.selected === s.name ? ' selected' : ''}`);
    node.dataset.state = s.word;
    node.querySelector('rect').setAttribute('class', `state-${s.word}`);
    node.querySelector('title').textContent = `${s.name}: ${s.word}, ${s.detail}`;
  }
  $('counts').textContent = STATES.filter(s => counts[s]).map(s => `${counts[s]} ${s}`).join(', ');
}

// ---- A stage's details ----------------------------------------------------------------------

async function select(name) {
  page.selected = name;
  for (const n of document.querySelectorAll('#graph .node')) {
    n.classList.toggle('selected', n.dataset.stage === name);
  }
  let v;
  try {
    v = await getJSON(`api/stage/${encodeURIComponent(name)}`);
  } catch (e) {
    $('stage-why').textContent = String(e);
    $('stage').hidden = false;
    return;
  }
  if (page.selected !== name) return;
  $('stage-name').textContent = v.name;
  $('stage-kind').textContent =
    `${v.kind}, defined at ${v.defined_at}` + (v.needs.length ? `; reads ${v.needs.join(', ')}` : '');
  $('stage-why').textContent = v.why.join('\n');
  $('stage-identity').textContent = v.identity || '(known once its inputs are complete)';
  $('stage-config').textContent = JSON.stringify(v.config, null, 2);
  const outputs = $('stage-outputs');
  outputs.replaceChildren();
  if (!v.outputs.length) outputs.append(html('li', 'none yet'));
  for (const f of v.outputs) {
    const li = html('li');
    if (v.committed) {
      const a = html('a', f.path, { href: `api/file/${encodeURIComponent(v.name)}/${f.path}`, target: '_blank' });
      li.append(a);
    } else {
      li.append(document.createTextNode(f.path));
    }
    li.append(document.createTextNode(` (${bytes(f.size)})`));
    outputs.append(li);
  }
  $('stage-log-path').textContent = v.log ? `(${v.log.path}, ${bytes(v.log.size)})` : '';
  const log = $('stage-log');
  log.textContent = v.log ? v.log.tail : 'no log yet';
  $('stage').hidden = false;
  // The newest lines first in view (once the panel is laid out).
  log.scrollTop = log.scrollHeight;
}

// ---- Training curves ------------------------------------------------------------------------

// A line chart of `series` ([{name, points: [[x, y], ...]}]) as an SVG element.
function lineChart(title, series, xLabel) {
  const W = 300, H = 190, L = 46, R = 8, T = 20, B = 30;
  const root = svg('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, 'data-title': title });
  const all = series.flatMap(s => s.points);
  root.dataset.points = String(Math.max(0, ...series.map(s => s.points.length)));
  root.append(svg('text', { x: L, y: 13, class: 'title' }, title));
  if (!all.length) {
    root.append(svg('text', { x: L, y: H / 2, class: 'tick' }, 'no data yet'));
    return root;
  }
  let [x0, x1] = [Math.min(...all.map(p => p[0])), Math.max(...all.map(p => p[0]))];
  let [y0, y1] = [Math.min(...all.map(p => p[1])), Math.max(...all.map(p => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const px = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const py = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    root.append(svg('line', { class: 'grid', x1: L, x2: W - R, y1: py(yv), y2: py(yv) }));
    root.append(svg('text', { x: L - 4, y: py(yv) + 3, class: 'tick', 'text-anchor': 'end' }, tick(yv, y1 - y0)));
    root.append(svg('text', { x: px(xv), y: H - B + 12, class: 'tick', 'text-anchor': 'middle' }, tick(xv, x1 - x0)));
  }
  root.append(svg('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }));
  root.append(svg('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }));
  root.append(svg('text', { x: W - R, y: H - 4, class: 'tick', 'text-anchor': 'end' }, xLabel));
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    root.append(svg('polyline', {
      stroke: color, points: s.points.map(p => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(' '),
      'data-series': s.name,
    }));
    if (series.length > 1 && i < 10) {
      const label = svg('text', { x: W - R - 4, y: T + 10 + i * 11, class: 'tick', 'text-anchor': 'end' }, s.name);
      label.style.fill = color;
      root.append(label);
    }
  });
  return root;
}

// A tick label for `v` on an axis spanning `span`: as many digits as the span needs.
function tick(v, span) {
  const a = Math.abs(v);
  if (a === 0) return '0';
  if (Number.isInteger(v) && a < 1e3) return String(v);
  if (a >= 1e6) return (v / 1e6).toFixed(span >= 4e6 ? 0 : 1) + 'M';
  if (a >= 1e3) return (v / 1e3).toFixed(span >= 4e3 ? 0 : 1) + 'k';
  if (a < 1e-2) return v.toExponential(1);
  const digits = Math.max(0, Math.min(4, 1 - Math.floor(Math.log10(span / 4))));
  return v.toFixed(digits);
}

function phaseCharts(records) {
  const steps = records.filter(r => r.type === 'step');
  const evals = records.filter(r => r.type === 'eval');
  const bySource = new Map();
  for (const e of evals) {
    for (const [source, loss] of e.losses) {
      if (!bySource.has(source)) bySource.set(source, []);
      bySource.get(source).push([e.step, loss]);
    }
  }
  const routes = steps.length ? steps[steps.length - 1].expert_load.length : 0;
  const share = [];
  for (let r = 0; r < routes; r++) {
    share.push({
      name: r === routes - 1 ? `route ${r} (last)` : `route ${r}`,
      points: steps.map(s => {
        const total = s.expert_load.reduce((a, b) => a + b, 0) || 1;
        return [s.step, (s.expert_load[r] || 0) / total];
      }),
    });
  }
  return [
    lineChart('loss', [{ name: 'train', points: steps.map(s => [s.step, s.loss]) }], 'step'),
    lineChart('held-out loss', [...bySource].map(([name, points]) => ({ name, points })), 'step'),
    lineChart('learning rate', [{ name: 'lr', points: steps.map(s => [s.step, s.lr]) }], 'step'),
    lineChart('tokens/s', [{ name: 'tokens/s', points: steps.map(s => [s.step, s.tokens_per_s]) }], 'step'),
    lineChart('expert load (share of tokens)', share, 'step'),
  ];
}

let drawPending = false;
function drawCurves() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    const box = $('phases');
    const trains = page.graph ? page.graph.stages.filter(s => s.kind === 'train') : [];
    let any = false;
    for (const t of trains) {
      const records = page.curves[t.name];
      if (!records) continue;
      any = true;
      let section = box.querySelector(`.phase[data-stage="${CSS.escape(t.name)}"]`);
      if (!section) {
        section = html('div', undefined, { class: 'phase', 'data-stage': t.name });
        section.append(html('h3', t.name), html('p', '', { class: 'batches' }),
          html('div', undefined, { class: 'charts' }));
        box.append(section);
      }
      const steps = records.filter(r => r.type === 'step');
      const last = steps[steps.length - 1];
      section.querySelector('h3').textContent = last
        ? `${t.name}: step ${last.step}, ${last.tokens.toLocaleString()} tokens, loss ${last.loss.toFixed(3)}`
        : `${t.name}: starting`;
      section.querySelector('.charts').replaceChildren(...phaseCharts(records));
      section.querySelector('.batches').textContent = batchLine(page.batches[mixOf(t.name)]);
    }
    $('no-training').hidden = any;
  });
}

// The mix stage of a train stage (stages/src/names.rs: `train.P` reads `mix.P`).
function mixOf(train) { return train.replace(/^train\./, 'mix.'); }

// How correlated the phase's global batches are (the mix stage's report.json, `batches`).
function batchLine(b) {
  if (!b) return '';
  return `global batches of ${b.global_batch}: ${b.mean_distinct_docs.toFixed(1)} documents ` +
    `each on average; one document fills at most ${(100 * b.max_doc_share).toFixed(0)}% of one ` +
    `(${b.measured_batches} of ${b.batches} batches measured)`;
}

// Reads the batch measure of every mix stage that is done, once per run of the stage.
async function loadBatches(s) {
  for (const st of s.stages) {
    if (st.kind !== 'mix') continue;
    if (st.word !== 'done') { delete page.batches[st.name]; continue; }
    if (st.name in page.batches) continue;
    page.batches[st.name] = null;
    try {
      const report = await getJSON(`api/file/${encodeURIComponent(st.name)}/report.json`);
      page.batches[st.name] = report.batches || null;
    } catch (e) {
      delete page.batches[st.name];
    }
    drawCurves();
  }
}

function onMetrics(m) {
  let records = page.curves[m.stage];
  if (!records || m.from === 0) records = page.curves[m.stage] = [];
  records.length = Math.min(records.length, m.from);
  records.push(...m.records);
  drawCurves();
}

// ---- Events, preflight, report ---------------------------------------------------------------

function onStatus(s) {
  page.status = s;
  paintGraph(s);
  const body = $('events').querySelector('tbody');
  body.replaceChildren(...s.events.map(e => {
    const tr = html('tr');
    tr.append(html('td', e.stage), html('td', e.text), html('td', String(e.step)),
      html('td', new Date(e.detected_ms).toLocaleString()),
      html('td', e.downtime_s == null ? '' : `${e.downtime_s.toFixed(1)} s`));
    return tr;
  }));
  $('events').hidden = !s.events.length;
  $('no-events').hidden = s.events.length > 0;
  const pre = $('preflight');
  pre.replaceChildren();
  for (const [stage, v] of Object.entries(s.preflight)) {
    pre.append(html('h3', `${stage}: ${v.outliers.length ? v.outliers.length + ' outlier(s)' : 'every rank within bounds'}`));
    const table = html('table');
    const head = html('tr');
    for (const c of ['rank', 'host', 'device', 'GEMM GFLOP/s', 'memory GB/s', 'f32 GFLOP/s', 'bf16 GFLOP/s']) head.append(html('th', c));
    table.append(head);
    v.ranks.forEach((r, i) => {
      const tr = html('tr');
      tr.append(html('td', String(i)), html('td', r.host), html('td', r.device),
        html('td', r.probe.gemm_gflops.toFixed(1)), html('td', r.probe.membw_gbps.toFixed(1)),
        html('td', r.probe.f32_gflops.toFixed(1)), html('td', r.probe.bf16_gflops.toFixed(1)));
      table.append(tr);
    });
    pre.append(table);
    for (const o of v.outliers) pre.append(html('p', o));
  }
  loadBatches(s);
  const reportDone = s.stages.some(st => st.kind === 'report' && st.word === 'done');
  if (reportDone && !page.reportShown) loadReport();
  if (!reportDone && page.reportShown) { page.reportShown = false; $('report').replaceChildren(); $('no-report').hidden = false; }
  if (!page.firstStatus) { page.firstStatus = true; performance.mark('zflow-status'); document.body.dataset.ready = '1'; }
}

async function loadReport() {
  page.reportShown = true;
  const reports = await getJSON('api/report');
  const box = $('report');
  box.replaceChildren();
  for (const r of reports) {
    const div = html('div', undefined, { class: 'report', 'data-stage': r.stage });
    // Rendered by the server from report.md, whose raw HTML it escapes.
    div.innerHTML = r.html;
    box.append(div);
  }
  $('no-report').hidden = reports.length > 0;
}

// ---- Live updates -----------------------------------------------------------------------------

function connect() {
  const events = new EventSource('api/events');
  const conn = $('connection');
  events.onopen = () => { conn.textContent = 'live'; conn.className = 'live'; };
  events.onerror = () => { conn.textContent = 'reconnecting'; conn.className = 'offline'; };
  events.addEventListener('status', e => onStatus(JSON.parse(e.data)));
  events.addEventListener('metrics', e => onMetrics(JSON.parse(e.data)));
}

async function main() {
  $('close').addEventListener('click', () => {
    $('stage').hidden = true;
    page.selected = null;
    for (const n of document.querySelectorAll('#graph .node')) n.classList.remove('selected');
  });
  try {
    drawGraph(await getJSON('api/graph'));
  } catch (e) {
    $('recipe').textContent = String(e);
    return;
  }
  connect();
}

main();
