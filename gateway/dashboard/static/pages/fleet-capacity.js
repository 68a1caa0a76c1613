// The capacity table under the fleet's cards: every catalog model against every city, with
// the city's hosting verdict (what routing applies: loaded, fits, too big, planning only) and
// the capacity planner's verdict for the REAL model on the city's declared GPUs (this machine
// runs a miniature of the big ones). The planner's whole sentence is each cell's tooltip.

import {fmt, h, replace} from '../dom.js';

export const VERDICT_TEXT = {loaded: 'loaded', fits: 'fits', too_big: 'too big',
                             planning_only: 'planning only'};

function plannerText(planner) {
  if (!planner) return '';
  if (!planner.may_host) return `✗ ${planner.reason.split(' ')[0] || 'no'}`;
  const tokens = planner.kv_tokens != null ? ` · ${fmt.num(planner.kv_tokens)} tok` : '';
  return `✓ ${planner.layout || ''}${tokens}`;
}

function plannerTitle(planner, need) {
  const here = `needs ${fmt.bytes(need)} on this machine`;
  if (!planner) return here;
  const real = planner.may_host
    ? `${planner.gpus}: ${planner.layout}, KV ${fmt.bytes(planner.kv_bytes)}`
    : `${planner.gpus}: ${planner.reason}`;
  return `${here}; the real model on ${real}`;
}

function cell(host) {
  return h('td', {'data-testid': `capacity-${host.model}`, title: plannerTitle(host.planner,
                                                                             host.need_bytes)},
    h('span', {class: `badge verdict-${host.verdict}`}, VERDICT_TEXT[host.verdict]),
    h('div', {class: 'small muted', 'data-testid': 'planner-verdict'}, plannerText(host.planner)));
}

export function capacityTable() {
  const head = h('tr');
  const body = h('tbody');
  const el = h('section', {class: 'card capacity', 'aria-labelledby': 'capacity-title',
                           'data-testid': 'capacity'},
    h('h2', {id: 'capacity-title'}, 'Capacity'),
    h('p', {class: 'small muted'},
      'Which models each city may host here, and whether the capacity planner fits the real ',
      "model on the city's declared GPUs (✓ layout · KV tokens, or ✗ what does not fit)."),
    h('div', {class: 'scroll'}, h('table', {}, h('thead', {}, head), body)));
  return {
    el,
    update(cities) {
      replace(head, h('th', {}, 'Model'),
        cities.map((c) => h('th', {title: c.name}, c.code.toUpperCase())));
      const models = (cities[0]?.hosts || []).map((host) => host.model);
      const byCity = cities.map((c) => new Map((c.hosts || []).map((x) => [x.model, x])));
      replace(body, models.map((model) => h('tr', {},
        h('th', {scope: 'row', class: 'mono', title: model},
          model.replace(/^@cf\/[^/]+\//, '')),
        byCity.map((hosts) => (hosts.has(model) ? cell(hosts.get(model)) : h('td', {}, '–'))))));
    },
  };
}
