// AI Gateway: the account's gateways (create, edit with PUT, delete) and the logs of the one
// picked. Auto-refresh keeps the list and the logs current while requests flow through.

import {errorBox, h, pageHead, poll, replace} from '../dom.js';
import {createLogsPanel} from './gateway-logs.js';

const AUTO_MS = 3000;
const GATEWAYS = 'ai-gateway/gateways';

const rateText = (g) => (g.rate_limiting_limit && g.rate_limiting_interval
  ? `${g.rate_limiting_limit} / ${g.rate_limiting_interval} s (${g.rate_limiting_technique})` : 'off');

function check(id, label, checked) {
  const el = h('input', {type: 'checkbox', id, 'data-testid': id, checked: Boolean(checked)});
  return {el, field: h('label', {class: 'check', for: id}, el, label)};
}

function number(id, label, value, hint) {
  const el = h('input', {type: 'number', id, 'data-testid': id, min: '0', step: '1',
                         value: value ?? '', 'aria-describedby': hint ? `${id}-hint` : null});
  return {el, field: h('div', {class: 'field'}, h('label', {for: id}, label), el,
    hint ? h('span', {class: 'muted small', id: `${id}-hint`}, hint) : null)};
}

// The settings form of one gateway; save() PUTs every setting (the API takes a partial body,
// but sending all of them makes "what you see is what is stored" true after a save).
function settingsForm(gateway, {onSave, onDelete}) {
  const ttl = number('gw-cache-ttl', 'Cache TTL (seconds)', gateway.cache_ttl, '0 or empty: no caching');
  const limit = number('gw-rate-limit', 'Rate limit (requests)', gateway.rate_limiting_limit);
  const interval = number('gw-rate-interval', 'per interval (seconds)', gateway.rate_limiting_interval,
    'both empty: no rate limit');
  const technique = h('select', {id: 'gw-rate-technique', 'data-testid': 'gw-rate-technique'},
    ['fixed', 'sliding'].map((t) => h('option', {value: t, selected: t === gateway.rate_limiting_technique}, t)));
  const auth = check('gw-authentication', 'Authenticated gateway (cf-aig-authorization required)', gateway.authentication);
  const logs = check('gw-collect-logs', 'Collect logs', gateway.collect_logs);
  const invalidate = check('gw-cache-invalidate', 'Invalidate cache on update', gateway.cache_invalidate_on_update);
  const error = errorBox();
  const saved = h('span', {class: 'muted small', role: 'status'});
  const del = h('button', {type: 'button', class: 'btn btn-danger', 'data-testid': 'gateway-delete'}, 'Delete gateway');
  const int = (input) => (input.value.trim() === '' ? null : Number(input.value));

  // Delete asks for a second click instead of window.confirm(), which blocks the page.
  let armed = null;
  del.addEventListener('click', async () => {
    if (!armed) {
      del.textContent = `Click again to delete “${gateway.id}”`;
      del.classList.add('confirm');
      armed = setTimeout(() => {
        armed = null;
        del.textContent = 'Delete gateway';
        del.classList.remove('confirm');
      }, 4000);
      return;
    }
    clearTimeout(armed);
    try {
      await onDelete();
    } catch (err) {
      error.show(err);
    }
  });

  const form = h('form', {class: 'card', 'aria-labelledby': 'gw-settings-title', 'data-testid': 'gateway-settings'},
    h('h2', {id: 'gw-settings-title'}, 'Settings of ', h('code', {}, gateway.id)),
    h('div', {class: 'grid', style: 'grid-template-columns:repeat(auto-fill,minmax(180px,1fr))'},
      ttl.field, limit.field, interval.field,
      h('div', {class: 'field'}, h('label', {for: 'gw-rate-technique'}, 'Technique'), technique)),
    h('fieldset', {style: 'margin:.8rem 0'}, h('legend', {}, 'Options'),
      h('div', {class: 'row', style: 'gap:1.2rem'}, logs.field, auth.field, invalidate.field)),
    error.el,
    h('div', {class: 'row', style: 'justify-content:space-between'},
      h('div', {class: 'row'}, h('button', {type: 'submit', class: 'btn btn-primary', 'data-testid': 'gateway-save'}, 'Save settings'), saved),
      del));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.clear();
    saved.textContent = '';
    try {
      await onSave({cache_ttl: int(ttl.el) ?? 0, rate_limiting_limit: int(limit.el),
        rate_limiting_interval: int(interval.el), rate_limiting_technique: technique.value,
        authentication: auth.el.checked, collect_logs: logs.el.checked,
        cache_invalidate_on_update: invalidate.el.checked});
      saved.textContent = `Saved at ${new Date().toLocaleTimeString('en-GB')}`;
    } catch (err) {
      error.show(err);
    }
  });
  return form;
}

export function mount(section, {api}) {
  const error = errorBox();
  const createId = h('input', {id: 'gateway-create-id', 'data-testid': 'gateway-create-id',
                               required: true, pattern: '[a-z0-9_\\-]{1,64}', autocomplete: 'off',
                               placeholder: 'my-gateway', 'aria-describedby': 'gateway-create-hint'});
  const createError = errorBox();
  const create = h('form', {class: 'row', style: 'align-items:flex-end'},
    h('div', {class: 'field', style: 'flex:1'}, h('label', {for: 'gateway-create-id'}, 'New gateway id'), createId,
      h('span', {class: 'muted small', id: 'gateway-create-hint'}, 'a-z, 0-9, - and _')),
    h('button', {type: 'submit', class: 'btn btn-primary', 'data-testid': 'gateway-create'}, 'Create'));
  const rows = h('tbody');
  const settings = h('div', {}, h('div', {class: 'card muted'}, 'Pick a gateway to see its settings and logs.'));
  const logs = createLogsPanel(api, []);
  const auto = h('input', {type: 'checkbox', id: 'gw-auto', checked: true, 'data-testid': 'gateway-auto-refresh'});
  const refreshButton = h('button', {type: 'button', class: 'btn', 'data-testid': 'gateway-refresh'}, 'Refresh');
  section.append(
    pageHead('gateway', 'AI Gateway', 'Gateways of this account, their settings and logs.',
      refreshButton, h('label', {class: 'check', for: 'gw-auto'}, auto, `Auto-refresh (${AUTO_MS / 1000} s)`)),
    error.el,
    h('div', {class: 'split'},
      h('section', {class: 'card', 'aria-labelledby': 'gw-list-title'},
        h('h2', {id: 'gw-list-title'}, 'Gateways'), create, createError.el,
        h('div', {class: 'table-wrap', style: 'margin-top:.8rem'}, h('table', {},
          h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, 'Id'), h('th', {scope: 'col'}, 'Cache'),
            h('th', {scope: 'col'}, 'Rate limit'), h('th', {scope: 'col'}, 'Logs'))), rows))),
      settings),
    logs.el);

  let gateways = [];
  let current = null;

  function pick(id) {
    // Picking the open gateway again refreshes its logs and keeps an edit in progress.
    if (id && id === current) {
      logs.refresh();
      return;
    }
    current = id;
    const gateway = gateways.find((g) => g.id === id);
    for (const tr of rows.children) tr.setAttribute('aria-selected', String(tr.dataset.gateway === id));
    replace(settings, gateway ? settingsForm(gateway, {
      onSave: async (body) => {
        const updated = await api.put(`${GATEWAYS}/${encodeURIComponent(id)}`, body);
        gateways = gateways.map((g) => (g.id === id ? updated : g));
        drawList();
      },
      onDelete: async () => {
        await api.del(`${GATEWAYS}/${encodeURIComponent(id)}`);
        pick(null);
        await loadGateways();
      },
    }) : h('div', {class: 'card muted'}, 'Pick a gateway to see its settings and logs.'));
    logs.setGateway(gateway ? id : null);
  }

  function drawList() {
    replace(rows, gateways.length ? gateways.map((g) => h('tr', {
      class: 'clickable', 'data-testid': `gateway-row-${g.id}`, 'data-gateway': g.id,
      'aria-selected': String(g.id === current), onclick: () => pick(g.id)},
    h('td', {}, h('button', {type: 'button', class: 'btn btn-quiet btn-small mono',
                              'aria-label': `Open gateway ${g.id}`}, g.id)),
    h('td', {}, g.cache_ttl ? `${g.cache_ttl} s` : 'off'),
    h('td', {}, rateText(g)),
    h('td', {}, g.collect_logs ? 'on' : 'off', g.authentication ? ' · auth' : '')))
      : h('tr', {}, h('td', {colspan: 4, class: 'empty'}, 'No gateways yet: create one above.')));
  }

  async function loadGateways() {
    try {
      gateways = await api.get(GATEWAYS);
      error.clear();
      drawList();
      if (current && !gateways.some((g) => g.id === current)) pick(null);
    } catch (err) {
      error.show(err);
    }
  }

  create.addEventListener('submit', async (e) => {
    e.preventDefault();
    createError.clear();
    const id = createId.value.trim();
    try {
      await api.post(GATEWAYS, {id, collect_logs: true});
      createId.value = '';
      await loadGateways();
      pick(id);
    } catch (err) {
      createError.show(err);
    }
  });

  const refreshAll = () => Promise.all([loadGateways(), logs.refresh()]);
  refreshButton.addEventListener('click', refreshAll);
  // Auto-refresh polls the logs (what changes while requests flow) and the list; the open
  // settings form is left alone so an edit in progress is not overwritten.
  let stopAuto = () => {};
  const setAuto = () => {
    stopAuto();
    stopAuto = auto.checked ? poll(refreshAll, AUTO_MS) : () => {};
  };
  auto.addEventListener('change', setAuto);
  loadGateways().then(() => {
    if (!current && gateways.length) pick(gateways[0].id);
  });
  api.get('ai/models/search', {per_page: 100})
    .then((models) => logs.el.querySelector('datalist')?.replaceChildren(
      ...models.map((m) => h('option', {value: m.name}))))
    .catch(() => {});
  setAuto();
  return () => stopAuto();
}
