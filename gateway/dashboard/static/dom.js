// Small DOM and formatting helpers shared by the pages. Building elements with h() (never
// innerHTML) keeps model output, log bodies and metadata from being parsed as markup.

// h('p', {class: 'x', 'data-testid': 'y', onclick: fn}, 'text', child, [more]) -> element
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith('svg:')
    ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'value' || key === 'checked' || key === 'selected') {
      el[key] = value; // properties, so a re-render shows the current value
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

// Replace an element's children (one paint instead of a remove loop).
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// A region that shows an API error as a readable sentence; role=alert so it is announced.
export function errorBox() {
  const box = h('p', {class: 'error', role: 'alert', hidden: true});
  return {
    el: box,
    show(err) {
      box.textContent = err instanceof Error ? err.message : String(err);
      box.hidden = false;
    },
    clear() {
      box.hidden = true;
      box.textContent = '';
    },
  };
}

// Run fn now and then every ms after it settles (never overlapping a slow answer); the
// returned function stops it. Pages stop their pollers when the route changes.
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await fn();
    } finally {
      if (!stopped) timer = setTimeout(tick, ms);
    }
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export const fmt = {
  num(v, digits = 0) {
    if (v === null || v === undefined || Number.isNaN(v)) return '–';
    return Number(v).toLocaleString('en-US', {maximumFractionDigits: digits,
                                              minimumFractionDigits: digits});
  },
  bytes(v) {
    if (v === null || v === undefined) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let n = Number(v);
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return `${n.toFixed(n < 10 && i > 0 ? 1 : 0)} ${units[i]}`;
  },
  pct(v) {
    return v === null || v === undefined ? '–' : `${Math.round(v * 100)}%`;
  },
  ms(v) {
    if (v === null || v === undefined) return '–';
    return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
  },
  usd(v) {
    if (v === null || v === undefined) return '–';
    // Per-request costs are fractions of a cent: plain decimals, enough digits to be non-zero.
    const n = Number(v);
    if (n === 0 || n >= 0.01) return `$${n.toFixed(n >= 0.01 ? 4 : 0)}`;
    return `$${n.toFixed(Math.min(12, 2 - Math.floor(Math.log10(n))))}`;
  },
  time(iso) {
    if (!iso) return '–';
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString('en-GB');
  },
};

// The heading block every page starts with; the h1 takes focus after navigation.
export function pageHead(name, title, lead, ...actions) {
  return h('header', {class: 'page-head'},
    h('div', {},
      h('h1', {id: `${name}-title`, tabindex: '-1'}, title),
      lead ? h('p', {class: 'muted'}, lead) : null),
    actions.length ? h('div', {class: 'row'}, actions) : null);
}
