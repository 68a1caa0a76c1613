// Fleet: the cities of edge_nodes/*.yaml on a world map and as cards, from `ai/fleet` every
// 2 s, and what each may host (fleet-capacity.js). Each city's marker and card are built once
// and updated in place, so keyboard focus survives the refresh.

import {errorBox, fmt, h, pageHead, poll, replace} from '../dom.js';
import {VERDICT_TEXT, capacityTable} from './fleet-capacity.js';

const POLL_MS = 2000;
// The map is equirectangular: x = lon + 180, y = 90 - lat. Cropped to 84°N..58°S, where
// the land (and every plausible edge city) is.
const VIEW = {top: 6, height: 148};
const STATUS_TEXT = {ok: 'ok', degraded: 'degraded', starting: 'starting', offline: 'offline'};

const project = (lon, lat) => [lon + 180, 90 - lat];

// GeoJSON polygons as one SVG path. A ring that jumps across the antimeridian would draw a
// line across the whole map, so a jump of more than half the world starts a new subpath.
function landPath(geojson) {
  const parts = [];
  const rings = (geometry) => (geometry.type === 'Polygon' ? geometry.coordinates
    : geometry.type === 'MultiPolygon' ? geometry.coordinates.flat() : []);
  for (const feature of geojson.features || [geojson]) {
    for (const ring of rings(feature.geometry || feature)) {
      let prev = null;
      for (const [lon, lat] of ring) {
        const [x, y] = project(lon, lat);
        const jump = prev === null || Math.abs(lon - prev) > 180;
        parts.push(`${jump ? 'M' : 'L'}${x.toFixed(2)},${y.toFixed(2)}`);
        prev = lon;
      }
      parts.push('Z');
    }
  }
  return parts.join('');
}

function baseMap() {
  const svg = h('svg:svg', {class: 'map', viewBox: `0 ${VIEW.top} 360 ${VIEW.height}`,
                            role: 'group', 'aria-label': 'World map of the edge cities'});
  const grid = [];
  for (let lon = 30; lon < 360; lon += 30) grid.push(`M${lon},${VIEW.top}V${VIEW.top + VIEW.height}`);
  for (let lat = -30; lat <= 60; lat += 30) grid.push(`M0,${90 - lat}H360`);
  svg.append(h('svg:path', {class: 'graticule', d: grid.join('')}));
  const land = h('svg:path', {class: 'land', d: ''});
  svg.append(land, h('svg:g', {class: 'markers'}));
  // The outlines are a static asset of the package (Natural Earth 1:110m via world-atlas).
  fetch('/dashboard/world-110m.json')
    .then((r) => r.json())
    .then((topo) => land.setAttribute('d', landPath(window.topojson.feature(topo, topo.objects.land))))
    .catch(() => {}); // the markers still place the cities without the outlines
  return svg;
}

// The ring around a marker grows with the work a city has (running + waiting requests).
const ringRadius = (c) => 3.2 + Math.min(9, 2.2 * Math.sqrt((c.running || 0) + (c.waiting || 0)));

// A label goes left of its marker when a city close by to the east would cover it.
const crowded = (city, all) => all.some((o) => o !== city && o.lon > city.lon &&
  o.lon - city.lon < 14 && Math.abs(o.lat - city.lat) < 6);

function marker(city, onSelect, labelLeft) {
  const [x, y] = project(city.lon, city.lat);
  const ring = h('svg:circle', {class: 'load', cx: x, cy: y, r: 3.2});
  const dot = h('svg:circle', {class: 'dot', cx: x, cy: y, r: 2.4});
  const title = h('svg:title');
  const g = h('svg:g', {class: 'marker', 'data-testid': `city-${city.code}`, 'data-kind': 'marker',
                        tabindex: '0', role: 'button', onclick: onSelect,
                        onkeydown: (e) => (e.key === 'Enter' || e.key === ' ') && (e.preventDefault(), onSelect())},
    title, ring, dot, h('svg:text', {x: labelLeft ? x - 3.4 : x + 3.4, y: y - 2.4,
                                      'text-anchor': labelLeft ? 'end' : 'start'}, city.code.toUpperCase()));
  return {
    el: g,
    update(c) {
      const color = `var(--${c.status in STATUS_TEXT ? c.status : 'offline'})`;
      dot.style.fill = color;
      ring.style.stroke = color;
      ring.setAttribute('r', ringRadius(c).toFixed(2));
      g.setAttribute('data-status', c.status);
      const label = `${c.name}: ${STATUS_TEXT[c.status] || c.status}, ${c.running} running, ` +
                    `${c.waiting} waiting, KV ${fmt.pct(c.kv_usage)}`;
      g.setAttribute('aria-label', label);
      title.textContent = label;
    },
  };
}

function stat(label, testid) {
  const value = h('dd', {'data-testid': testid}, '–');
  return {el: h('div', {}, h('dt', {}, label), value), value};
}

function card(city) {
  const code = city.code;
  const status = h('span', {class: 'status', 'data-testid': `city-${code}-status`});
  const running = stat('Running', `city-${code}-running`);
  const waiting = stat('Waiting', `city-${code}-waiting`);
  const beat = stat('Heartbeat', `city-${code}-heartbeat`);
  const bar = h('span', {style: 'width:0%'});
  const kvText = h('span', {class: 'kv-text'}, '–');
  const kv = h('div', {class: 'kv', 'data-testid': `city-${code}-kv`, role: 'meter',
                       'aria-label': `KV cache use in ${city.name}`, 'aria-valuemin': '0',
                       'aria-valuemax': '100'},
  h('span', {class: 'muted small'}, 'KV cache'), h('span', {class: 'bar'}, bar), kvText);
  const acc = city.accelerators || {};
  const hardware = h('p', {class: 'small muted'},
    `${city.role} · ${acc.count ?? '?'}× ${acc.kind || 'accelerator'}`,
    acc.memory_gib ? ` (${acc.memory_gib} GiB)` : '',
    ` · budget ${fmt.bytes(city.memory_budget_bytes)}`);
  const models = h('div', {class: 'chips', 'aria-label': 'Loaded models'});
  const summary = h('a', {class: 'small', href: '#/fleet', 'data-testid': `city-${code}-capacity`,
                          onclick: (e) => {
                            // A hash link would re-route; scroll to the table instead.
                            e.preventDefault();
                            document.getElementById('capacity-title')
                              ?.scrollIntoView({behavior: 'smooth', block: 'start'});
                          }});
  const el = h('article', {class: 'card city-card', id: `city-card-${code}`,
                           'data-testid': `city-${code}`, 'data-kind': 'row',
                           'aria-labelledby': `city-name-${code}`},
    h('header', {},
      h('h2', {id: `city-name-${code}`}, `${city.name} `,
        h('span', {class: 'muted small'}, `${code} · ${city.country}`)), status),
    hardware,
    h('dl', {class: 'stats'}, running.el, waiting.el, beat.el),
    kv,
    h('div', {}, h('h3', {class: 'small muted'}, 'Loaded models'), models),
    summary);
  return {
    el,
    update(c) {
      status.className = `status status-${c.status}`;
      status.textContent = STATUS_TEXT[c.status] || c.status;
      el.setAttribute('data-status', c.status);
      running.value.textContent = fmt.num(c.running);
      waiting.value.textContent = fmt.num(c.waiting);
      beat.value.textContent = c.heartbeat_age_s == null ? '–' : `${c.heartbeat_age_s.toFixed(1)} s`;
      const pct = Math.round((c.kv_usage || 0) * 100);
      bar.style.width = `${pct}%`;
      kvText.textContent = `${pct}%`;
      kv.setAttribute('aria-valuenow', String(pct));
      kv.setAttribute('data-value', String(c.kv_usage ?? 0));
      replace(models, (c.loaded_models || []).length
        ? c.loaded_models.map((m) => h('span', {class: 'chip', title: fmt.bytes(m.memory_bytes)},
          m.id, m.weight_precision ? ` · ${m.weight_precision}` : ''))
        : h('span', {class: 'muted small'}, c.status === 'offline' ? 'offline' : 'none yet'));
      const hosts = c.hosts || [];
      const counts = {};
      for (const host of hosts) counts[host.verdict] = (counts[host.verdict] || 0) + 1;
      replace(summary, 'Capacity: ', Object.entries(VERDICT_TEXT)
        .filter(([key]) => counts[key]).map(([key, text]) => `${counts[key]} ${text}`).join(', ') || 'no verdicts');
    },
  };
}

export function mount(section, {api}) {
  const error = errorBox();
  const updated = h('span', {class: 'muted small', 'aria-live': 'off'});
  const map = baseMap();
  const markers = map.querySelector('.markers');
  const cards = h('div', {class: 'grid'});
  const capacity = capacityTable();
  const counts = h('p', {class: 'small', 'aria-live': 'polite'});
  const legend = h('div', {class: 'legend', 'aria-hidden': 'true'},
    Object.keys(STATUS_TEXT).map((s) => h('span', {class: `status status-${s}`}, s)),
    h('span', {}, 'ring size: running + waiting'));
  section.append(
    pageHead('fleet', 'Fleet', 'Edge cities, their health and load, live every 2 seconds.', updated),
    error.el,
    h('div', {class: 'card'}, map, h('div', {class: 'row', style: 'justify-content:space-between;margin-top:.5rem'}, counts, legend)),
    cards,
    capacity.el);

  const views = new Map();
  const select = (code) => {
    for (const [key, view] of views) {
      view.card.el.classList.toggle('selected', key === code);
      view.marker.el.classList.toggle('selected', key === code);
    }
    views.get(code)?.card.el.scrollIntoView({behavior: 'smooth', block: 'nearest'});
  };

  async function refresh() {
    try {
      const fleet = await api.get('ai/fleet');
      error.clear();
      for (const city of fleet.cities || []) {
        if (!views.has(city.code)) {
          const view = {marker: marker(city, () => select(city.code), crowded(city, fleet.cities)),
                        card: card(city)};
          views.set(city.code, view);
          markers.append(view.marker.el);
          cards.append(view.card.el);
        }
        views.get(city.code).marker.update(city);
        views.get(city.code).card.update(city);
      }
      capacity.update(fleet.cities || []);
      const by = {};
      for (const city of fleet.cities || []) by[city.status] = (by[city.status] || 0) + 1;
      counts.textContent = `${(fleet.cities || []).length} cities: ` +
        Object.entries(by).map(([s, n]) => `${n} ${s}`).join(', ');
      updated.textContent = `updated ${new Date().toLocaleTimeString('en-GB')}`;
    } catch (err) {
      error.show(err);
    }
  }
  return poll(refresh, POLL_MS);
}
