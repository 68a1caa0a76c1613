// Models: the catalog as `ai/models/search` lists it, filtered in the page (the list is
// small), each row expandable to its schema, prices and where the fleet has it loaded.

import {errorBox, fmt, h, pageHead, poll, replace} from '../dom.js';

const FLEET_POLL_MS = 5000;
const VERDICT_TEXT = {loaded: 'loaded', fits: 'fits', too_big: 'too big',
                      planning_only: 'planning only'};

const propsOf = (model) => Object.fromEntries((model.properties || [])
  .map((p) => [p.property_id, p.value]));

// A miniature runs here too, but as a small model of the real architecture: its property
// says what of it is synthetic.
function kindOf(props) {
  if (props.miniature) return 'miniature';
  return props.planning_only === 'true' ? 'planning only' : 'runs here';
}

function describe(model) {
  const props = propsOf(model);
  return {
    model, props,
    task: model.task?.name || 'unknown',
    size: props.size_tier || 'unknown',
    precision: props.weight_precision || props.weight_codec || 'unknown',
    kind: kindOf(props),
    text: `${model.name}\n${model.description}`.toLowerCase(),
  };
}

function priceText(price) {
  if (!Array.isArray(price) || !price.length) return 'no price';
  return price.map((p) => `$${p.price} ${p.unit}`).join(' · ');
}

function propertyTable(props) {
  const rows = Object.entries(props).filter(([key]) => key !== 'price');
  return h('table', {class: 'small'}, h('tbody', {}, rows.map(([key, value]) =>
    h('tr', {}, h('th', {scope: 'row'}, key), h('td', {class: 'mono'}, String(value))))));
}

function select(label, id, values) {
  const el = h('select', {id}, h('option', {value: ''}, 'all'),
    [...new Set(values)].sort().map((v) => h('option', {value: v}, v)));
  return {el, field: h('div', {class: 'field'}, h('label', {for: id}, label), el)};
}

function row(info, api, whereLoaded) {
  const {model, props} = info;
  const loadedIn = h('span', {class: 'small'});
  const where = h('tbody');
  const schema = h('div', {}, h('p', {class: 'muted small'}, 'Loading schema…'));
  const details = h('details', {class: 'model', 'data-testid': 'model-row', 'data-model': model.name},
    h('summary', {},
      h('span', {class: 'name'}, model.name),
      h('span', {class: 'row'},
        h('span', {class: 'badge badge-muted'}, info.task),
        h('span', {class: 'badge badge-muted', title: 'size tier'}, info.size),
        h('span', {class: 'badge badge-muted', title: 'weight precision / codec'}, info.precision),
        h('span', {class: `badge ${info.kind === 'planning only' ? 'verdict-planning_only' : 'verdict-loaded'}`},
          info.kind)),
      h('span', {class: 'muted small'}, model.description),
      loadedIn),
    h('div', {class: 'body'},
      h('div', {class: 'grid'},
        h('section', {}, h('h3', {}, 'Properties'), propertyTable(props)),
        h('section', {}, h('h3', {}, 'Prices'), h('p', {class: 'small'}, priceText(props.price)),
          h('h3', {}, 'Where it is'),
          h('table', {class: 'small'}, h('thead', {}, h('tr', {}, h('th', {}, 'City'),
            h('th', {}, 'Verdict'), h('th', {class: 'num'}, 'Needs'))), where))),
      h('section', {}, h('h3', {}, 'Schema'), schema)));
  let schemaLoaded = false;
  details.addEventListener('toggle', async () => {
    if (!details.open || schemaLoaded) return;
    schemaLoaded = true;
    try {
      const s = await api.get('ai/models/schema', {model: model.name});
      replace(schema, h('div', {class: 'grid'},
        h('div', {}, h('h4', {}, 'Input'), h('pre', {class: 'json'}, JSON.stringify(s.input, null, 2))),
        h('div', {}, h('h4', {}, 'Output'), h('pre', {class: 'json'}, JSON.stringify(s.output, null, 2)))));
    } catch (err) {
      schemaLoaded = false; // let a later expand try again
      replace(schema, h('p', {class: 'error', role: 'alert'}, err.message));
    }
  });
  return {
    info, el: details,
    // The fleet changes while the page is open: the "where" part is redrawn on each poll.
    updateFleet() {
      const cities = whereLoaded(model.name);
      const loaded = cities.filter((c) => c.verdict === 'loaded').map((c) => c.code);
      loadedIn.textContent = loaded.length ? `loaded in ${loaded.join(', ')}` : 'not loaded anywhere';
      replace(where, cities.length ? cities.map((c) => h('tr', {},
        h('td', {}, `${c.name} (${c.code})`, c.status === 'offline' ? ' · offline' : ''),
        h('td', {}, h('span', {class: `badge verdict-${c.verdict}`}, VERDICT_TEXT[c.verdict] || c.verdict)),
        h('td', {class: 'num'}, fmt.bytes(c.need_bytes))))
        : h('tr', {}, h('td', {colspan: 3, class: 'muted'}, 'no fleet answer yet')));
    },
  };
}

export function mount(section, {api}) {
  const error = errorBox();
  const list = h('div', {class: 'grid', style: 'grid-template-columns:1fr;gap:.5rem'});
  const count = h('p', {class: 'muted small', 'aria-live': 'polite'});
  const search = h('input', {id: 'model-search', type: 'search', 'data-testid': 'model-search',
                             placeholder: 'name or description', autocomplete: 'off'});
  const filters = h('form', {class: 'card filters', role: 'search', onsubmit: (e) => e.preventDefault()},
    h('div', {class: 'field', style: 'flex:1;min-width:220px'}, h('label', {for: 'model-search'}, 'Search'), search));
  section.append(pageHead('models', 'Models', 'The catalog, as GET ai/models/search lists it.'),
    error.el, filters, count, list);

  let fleet = [];
  let rows = [];
  const whereLoaded = (id) => fleet.map((city) => {
    const host = (city.hosts || []).find((x) => x.model === id);
    return host ? {...host, code: city.code, name: city.name, status: city.status} : null;
  }).filter(Boolean);
  const selects = [];

  function apply() {
    const text = search.value.trim().toLowerCase();
    let shown = 0;
    for (const r of rows) {
      const ok = (!text || r.info.text.includes(text)) &&
        selects.every(({key, el}) => !el.value || r.info[key] === el.value);
      r.el.hidden = !ok;
      shown += ok ? 1 : 0;
    }
    count.textContent = `${shown} of ${rows.length} models`;
  }
  search.addEventListener('input', apply);

  async function load() {
    try {
      try {
        fleet = (await api.get('ai/fleet')).cities || [];
      } catch {
        fleet = []; // the catalog still lists without the fleet
      }
      const models = await api.get('ai/models/search', {per_page: 100});
      const infos = models.map((m) => describe(m));
      for (const [key, label] of [['task', 'Task'], ['size', 'Size tier'],
        ['precision', 'Precision / codec'], ['kind', 'Runs here as']]) {
        const s = select(label, `model-filter-${key}`, infos.map((i) => i[key]));
        s.el.setAttribute('data-testid', `model-filter-${key}`);
        s.el.addEventListener('change', apply);
        selects.push({key, el: s.el});
        filters.append(s.field);
      }
      rows = infos.map((info) => row(info, api, whereLoaded));
      replace(list, rows.map((r) => r.el));
      rows.forEach((r) => r.updateFleet());
      apply();
    } catch (err) {
      error.show(err);
    }
  }

  let stop = () => {};
  let left = false;
  load().then(() => {
    if (left) return; // the user moved to another page while the catalog loaded
    stop = poll(async () => {
      try {
        fleet = (await api.get('ai/fleet')).cities || [];
        rows.forEach((r) => r.updateFleet());
      } catch {
        // the next poll tries again; the catalog itself is already shown
      }
    }, FLEET_POLL_MS);
  });
  return () => {
    left = true;
    stop();
  };
}
