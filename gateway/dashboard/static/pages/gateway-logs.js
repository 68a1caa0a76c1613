// The AI Gateway page's log panel: a filtered, paged log list of one gateway and a detail
// view of one log with the request and response bodies the gateway kept. The detail is a
// modal <dialog>: it keeps the table full width on a laptop screen, Escape closes it, and
// focus returns to the row that opened it.

import {errorBox, fmt, h, replace} from '../dom.js';

const PER_PAGE = 25;

// "42" and "true" match metadata sent as numbers and booleans; anything else is a string.
function metadataValue(text) {
  if (/^(true|false|null|-?\d+(\.\d+)?)$/.test(text)) return JSON.parse(text);
  return text;
}

function pretty(body) {
  if (body === null || body === undefined) return '(not kept)';
  if (typeof body !== 'string') return JSON.stringify(body, null, 2);
  try {
    return JSON.stringify(JSON.parse(body), null, 2);
  } catch {
    return body; // a stream's events, or a truncated body
  }
}

function tri(label, id) {
  const el = h('select', {id, 'data-testid': id}, h('option', {value: ''}, 'any'),
    h('option', {value: 'true'}, 'yes'), h('option', {value: 'false'}, 'no'));
  return {el, field: h('div', {class: 'field'}, h('label', {for: id}, label), el)};
}

function field(label, id, attrs = {}) {
  const el = h('input', {id, 'data-testid': id, autocomplete: 'off', ...attrs});
  return {el, field: h('div', {class: 'field'}, h('label', {for: id}, label), el)};
}

export function createLogsPanel(api, modelIds) {
  const error = errorBox();
  const success = tri('Success', 'log-filter-success');
  const cached = tri('Cached', 'log-filter-cached');
  const model = field('Model', 'log-filter-model', {list: 'log-models', placeholder: 'any', size: 22});
  const metaKey = field('Metadata key', 'log-filter-meta-key', {size: 12});
  const metaValue = field('= value', 'log-filter-meta-value', {size: 12});
  const models = h('datalist', {id: 'log-models'}, modelIds.map((id) => h('option', {value: id})));
  const rows = h('tbody');
  const info = h('p', {class: 'muted small', 'aria-live': 'polite'});
  const newer = h('button', {type: 'button', class: 'btn btn-small'}, '← Newer');
  const older = h('button', {type: 'button', class: 'btn btn-small'}, 'Older →');
  const detail = h('dialog', {class: 'detail', 'aria-labelledby': 'log-detail-title',
                              'data-testid': 'log-detail'});
  const filters = h('form', {class: 'filters', role: 'search'}, success.field, cached.field,
    model.field, metaKey.field, metaValue.field,
    h('button', {type: 'submit', class: 'btn'}, 'Apply'), models);
  const table = h('table', {},
    h('thead', {}, h('tr', {}, ['Time', 'Model', 'Status', 'Cache', 'Tokens in/out', 'Cost',
      'Duration', 'Node'].map((t, i) => h('th', {class: i >= 4 && i < 7 ? 'num' : null, scope: 'col'}, t)))),
    rows);
  const el = h('div', {hidden: true},
    h('section', {class: 'card', 'aria-labelledby': 'logs-title'},
      h('h2', {id: 'logs-title'}, 'Logs'), filters, error.el,
      h('div', {class: 'table-wrap'}, table),
      h('div', {class: 'row', style: 'justify-content:space-between;margin-top:.5rem'}, info,
        h('div', {class: 'row'}, newer, older))),
    detail);

  let gateway = null;
  let page = 1;
  let selected = null;
  let seq = 0;

  function params() {
    const p = {page, per_page: PER_PAGE, success: success.el.value, cached: cached.el.value,
               model: model.el.value.trim()};
    const key = metaKey.el.value.trim();
    if (key) p.metadata = JSON.stringify({[key]: metadataValue(metaValue.el.value.trim())});
    return p;
  }

  function logRow(log) {
    const open = () => showDetail(log.id);
    return h('tr', {class: 'clickable', tabindex: '0', 'data-testid': 'log-row',
                    'data-log-id': log.id, 'data-cached': String(Boolean(log.cached)),
                    'aria-selected': String(log.id === selected), onclick: open,
                    onkeydown: (e) => (e.key === 'Enter' || e.key === ' ') && (e.preventDefault(), open())},
      h('td', {title: log.created_at}, fmt.time(log.created_at)),
      h('td', {class: 'mono'}, log.model, log.stand_in ? h('span', {class: 'muted'}, ` → ${log.stand_in}`) : ''),
      h('td', {}, h('span', {class: `badge ${log.success ? 'badge-muted' : 'badge-err'}`}, log.status_code)),
      h('td', {}, log.cached ? h('span', {class: 'badge badge-hit', 'data-testid': 'log-hit'}, 'HIT')
        : h('span', {class: 'badge badge-miss'}, 'MISS')),
      h('td', {class: 'num'}, `${fmt.num(log.tokens_in)} / ${fmt.num(log.tokens_out)}`),
      h('td', {class: 'num'}, fmt.usd(log.cost)),
      h('td', {class: 'num'}, fmt.ms(log.duration)),
      h('td', {}, log.node || '–'));
  }

  async function refresh() {
    if (!gateway) return;
    const mine = ++seq;
    try {
      const {result, info: pageInfo} = await api.list(
        `ai-gateway/gateways/${encodeURIComponent(gateway)}/logs`, params());
      if (mine !== seq) return; // a newer refresh (other filters or gateway) has started
      error.clear();
      // Redrawing the rows would drop keyboard focus from the one the user is on: restore it.
      const focused = document.activeElement?.closest?.('tr[data-log-id]')?.dataset.logId;
      replace(rows, result.length ? result.map(logRow)
        : h('tr', {}, h('td', {colspan: 8, class: 'empty'}, 'No logs match.')));
      if (focused) rows.querySelector(`tr[data-log-id="${CSS.escape(focused)}"]`)?.focus();
      const total = pageInfo?.total_count ?? result.length;
      info.textContent = `${total} log${total === 1 ? '' : 's'} · page ${page} of ${Math.max(1, Math.ceil(total / PER_PAGE))}`;
      newer.disabled = page <= 1;
      older.disabled = page * PER_PAGE >= total;
    } catch (err) {
      if (mine === seq) error.show(err);
    }
  }

  async function showDetail(id) {
    selected = id;
    for (const tr of rows.querySelectorAll('tr[data-log-id]')) {
      tr.setAttribute('aria-selected', String(tr.dataset.logId === id));
    }
    const base = `ai-gateway/gateways/${encodeURIComponent(gateway)}/logs/${encodeURIComponent(id)}`;
    replace(detail, h('h2', {id: 'log-detail-title'}, 'Log detail'), h('p', {class: 'muted'}, 'Loading log…'));
    if (!detail.open) detail.showModal();
    try {
      const [log, request, response] = await Promise.all([
        api.get(base), api.get(`${base}/request`).catch((e) => `(${e.message})`),
        api.get(`${base}/response`).catch((e) => `(${e.message})`)]);
      if (selected !== id) return;
      const items = [['Log id', log.id], ['Time', log.created_at], ['Model', log.model],
        ['Provider', log.provider], ['Request type', log.request_type], ['Path', log.path],
        ['Status', `${log.status_code} ${log.success ? '(success)' : '(failed)'}`],
        ['Cached', log.cached ? 'HIT' : 'MISS'], ['Tokens in', fmt.num(log.tokens_in)],
        ['Tokens out', fmt.num(log.tokens_out)], ['Cost', fmt.usd(log.cost)],
        ['Duration', fmt.ms(log.duration)], ['Node', log.node || '–'],
        ['Stand-in', log.stand_in || '–'], ['Step', log.step ?? '–']];
      replace(detail,
        h('div', {class: 'row', style: 'justify-content:space-between'},
          h('h2', {id: 'log-detail-title'}, 'Log detail ', log.cached ? h('span', {class: 'badge badge-hit'}, 'HIT') : ''),
          h('button', {type: 'button', class: 'btn btn-small', 'data-testid': 'log-detail-close', onclick: closeDetail}, 'Close')),
        h('dl', {}, items.map(([k, v]) => [h('dt', {}, k), h('dd', {'data-field': k}, String(v))])),
        h('h3', {}, 'Metadata'), h('pre', {class: 'json', 'data-testid': 'log-metadata'}, log.metadata ? pretty(log.metadata) : '(none)'),
        h('h3', {}, 'Request'), h('pre', {class: 'json', 'data-testid': 'log-request'}, pretty(request)),
        h('h3', {}, 'Response'), h('pre', {class: 'json', 'data-testid': 'log-response'}, pretty(response)));
      detail.querySelector('button')?.focus(); // keyboard users land inside the loaded view
    } catch (err) {
      replace(detail, h('h2', {id: 'log-detail-title'}, 'Log detail'),
        h('p', {class: 'error', role: 'alert'}, err.message),
        h('button', {type: 'button', class: 'btn btn-small', 'data-testid': 'log-detail-close', onclick: closeDetail}, 'Close'));
    }
  }

  function closeDetail() {
    if (detail.open) detail.close();
  }
  // Escape closes the dialog without closeDetail(): the 'close' event covers both ways.
  detail.addEventListener('close', () => {
    const id = selected;
    selected = null;
    replace(detail);
    for (const tr of rows.querySelectorAll('tr[data-log-id]')) tr.setAttribute('aria-selected', 'false');
    // The table may have been redrawn while the dialog was open: focus the row by its id.
    rows.querySelector(`tr[data-log-id="${CSS.escape(id || '')}"]`)?.focus();
  });

  filters.addEventListener('submit', (e) => {
    e.preventDefault();
    page = 1;
    refresh();
  });
  for (const s of [success.el, cached.el]) s.addEventListener('change', () => { page = 1; refresh(); });
  newer.addEventListener('click', () => { page = Math.max(1, page - 1); refresh(); });
  older.addEventListener('click', () => { page += 1; refresh(); });

  return {
    el,
    refresh,
    setGateway(id) {
      if (id === gateway) return;
      gateway = id;
      page = 1;
      closeDetail();
      replace(rows);
      info.textContent = '';
      el.hidden = !id;
      if (id) refresh();
    },
  };
}
