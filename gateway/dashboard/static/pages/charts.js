// Charts: the last minutes of this account's traffic from `ai/metrics/history` (the same
// counters the gateway's Prometheus /metrics exports), redrawn every 2 s with uPlot
// (vendored: /dashboard/vendor/uPlot.iife.min.js, loaded by index.html as window.uPlot).

import {errorBox, fmt, h, pageHead, poll} from '../dom.js';

const POLL_MS = 2000;
const ORANGE = '#e06c00';
const BLUE = '#1f5fd6';
const RED = '#b42318';

const rate = (v) => (v == null ? '–' : fmt.num(v, v < 10 ? 2 : 1));
const percent = (v) => (v == null ? '–' : `${(v * 100).toFixed(0)}%`);
const count = (v) => (v == null ? '–' : fmt.num(v));
// Axis ticks are already round numbers: print them short, with the chart's unit.
const tick = (unit) => (v) => `${+v.toFixed(3)}${unit}`;
const msTick = (v) => (v >= 1000 ? `${+(v / 1000).toFixed(2)} s` : `${+v.toFixed(1)} ms`);
const clock = (t) => new Date(t * 1000).toLocaleTimeString('en-GB');

// One entry per chart; `key` names a series of the history answer.
const CHARTS = [
  {id: 'chart-requests', title: 'Requests per second', value: rate, axis: tick(''),
   series: [{key: 'requests_per_s', label: 'requests/s', color: ORANGE, fill: true}]},
  {id: 'chart-tokens', title: 'Output tokens per second', value: rate, axis: tick(''),
   series: [{key: 'output_tokens_per_s', label: 'tokens/s', color: BLUE, fill: true}]},
  {id: 'chart-ttft', title: 'Time to first token', value: fmt.ms, axis: msTick, sparse: true,
   series: [{key: 'ttft_p50_ms', label: 'p50', color: ORANGE},
            {key: 'ttft_p99_ms', label: 'p99', color: BLUE}]},
  {id: 'chart-itl', title: 'Inter-token latency', value: fmt.ms, axis: msTick, sparse: true,
   series: [{key: 'itl_p50_ms', label: 'p50', color: ORANGE},
            {key: 'itl_p99_ms', label: 'p99', color: BLUE}]},
  {id: 'chart-cache', title: 'Cache hit rate', value: percent, axis: percent, sparse: true,
   fixedRange: [0, 1],
   series: [{key: 'cache_hit_rate', label: 'hit rate', color: '#1a7f37', fill: true}]},
  {id: 'chart-errors', title: 'Rate-limited and errors (per interval)', value: count, axis: count,
   steps: true, whole: true,
   series: [{key: 'rate_limited', label: 'rate-limited', color: ORANGE},
            {key: 'errors', label: 'errors', color: RED}]},
];

const TOTALS = [['requests', 'Requests'], ['output_tokens', 'Output tokens'],
  ['cache_hits', 'Cache hits'], ['rate_limited', 'Rate-limited'], ['errors', 'Errors']];

// The newest non-null value of a series (the last interval may have had no sample).
function latest(values) {
  for (let i = (values?.length || 0) - 1; i >= 0; i -= 1) if (values[i] != null) return values[i];
  return null;
}

function plotOptions(chart, width) {
  const {uPlot} = window;
  const yRange = chart.fixedRange ? () => chart.fixedRange
    : (u, min, max) => [0, max > 0 ? max * 1.15 : chart.whole ? 4 : 1]; // all start at zero
  return {
    width, height: 200,
    cursor: {drag: {x: false, y: false}},
    legend: {live: true},
    scales: {x: {time: true}, y: {range: yRange}},
    axes: [
      {stroke: '#57606a', grid: {stroke: '#eceff3'}, ticks: {stroke: '#d8dde3'},
       values: (u, ticks) => ticks.map(clock)},
      {stroke: '#57606a', grid: {stroke: '#eceff3'}, ticks: {stroke: '#d8dde3'}, size: 64,
       incrs: chart.whole ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000] : undefined,
       values: (u, ticks) => ticks.map((v) => chart.axis(v))},
    ],
    series: [{}, ...chart.series.map((s) => ({
      label: s.label, stroke: s.color, width: 2,
      fill: s.fill ? `${s.color}22` : undefined,
      paths: chart.steps ? uPlot.paths.stepped({align: 1}) : undefined,
      value: (u, v) => chart.value(v),
      // Latencies and the hit rate exist only in intervals that had requests: with gaps
      // between them, a lone sample would be invisible without its point.
      points: chart.sparse ? {show: true, size: 5, fill: s.color} : {show: false},
    }))],
  };
}

function chartFigure(chart) {
  const now = h('span', {class: 'now', 'data-testid': `${chart.id}-now`});
  const plot = h('div', {class: 'plot', role: 'img', 'aria-label': chart.title});
  const el = h('figure', {class: 'card chart', 'data-testid': chart.id},
    h('figcaption', {}, h('h2', {}, chart.title), now), plot);
  let u = null;
  return {
    el,
    draw(series) {
      const data = [series.t || [], ...chart.series.map((s) => series[s.key] || [])];
      // Canvas charts say nothing to a screen reader: the latest values are also text.
      const text = chart.series.map((s) => `${s.label} ${chart.value(latest(series[s.key]))}`).join(' · ');
      now.textContent = text;
      plot.setAttribute('aria-label', `${chart.title}: latest ${text}`);
      if (!u) u = new window.uPlot(plotOptions(chart, plot.clientWidth || 400), data, plot);
      else u.setData(data);
    },
    resize() {
      if (u && plot.clientWidth) u.setSize({width: plot.clientWidth, height: 200});
    },
    destroy() {
      u?.destroy();
    },
  };
}

export function mount(section, {api}) {
  const error = errorBox();
  const windowSelect = h('select', {id: 'charts-window', 'data-testid': 'charts-window'},
    [[60, '1 minute'], [300, '5 minutes'], [600, '10 minutes']].map(([s, label]) =>
      h('option', {value: s, selected: s === 300}, label)));
  const totals = h('dl', {class: 'totals', 'aria-label': 'Totals over the window'});
  const totalValues = {};
  for (const [key, label] of TOTALS) {
    totalValues[key] = h('dd', {'data-testid': `total-${key}`}, '–');
    totals.append(h('div', {}, h('dt', {}, label), totalValues[key]));
  }
  const figures = CHARTS.map(chartFigure);
  section.append(
    pageHead('charts', 'Charts', 'This account\'s traffic through the gateway, every 2 seconds.',
      h('label', {for: 'charts-window'}, 'Window'), windowSelect),
    error.el, totals, h('div', {class: 'charts'}, figures.map((f) => f.el)));

  if (!window.uPlot) {
    error.show('The chart library (vendor/uPlot.iife.min.js) did not load.');
    return () => {};
  }
  const resizer = new ResizeObserver(() => figures.forEach((f) => f.resize()));
  figures.forEach((f) => resizer.observe(f.el));

  async function refresh() {
    try {
      const history = await api.get('ai/metrics/history', {window_s: windowSelect.value});
      error.clear();
      for (const [key] of TOTALS) totalValues[key].textContent = fmt.num(history.totals?.[key]);
      figures.forEach((f) => f.draw(history.series || {}));
    } catch (err) {
      error.show(err);
    }
  }
  let stop = poll(refresh, POLL_MS);
  windowSelect.addEventListener('change', () => {
    stop();
    stop = poll(refresh, POLL_MS);
  });
  return () => {
    stop();
    resizer.disconnect();
    figures.forEach((f) => f.destroy());
  };
}
