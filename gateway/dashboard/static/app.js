// The dashboard shell: signs in (the dev session of `edge-gateway dev`, else a form), shows
// the account in the header, and routes #/fleet, #/models, ... to one page module each.
// A page module exports mount(section, ctx) and returns a function that stops its timers.

import {createClient, errorFrom} from './api.js';
import {h} from './dom.js';

const PAGES = {
  fleet: {title: 'Fleet', load: () => import('./pages/fleet.js')},
  models: {title: 'Models', load: () => import('./pages/models.js')},
  gateway: {title: 'AI Gateway', load: () => import('./pages/gateway.js')},
  charts: {title: 'Charts', load: () => import('./pages/charts.js')},
  playground: {title: 'Playground', load: () => import('./pages/playground.js')},
};
const DEFAULT_PAGE = 'fleet';
const STORE = 'edgefire.session';
// Set on sign-out so that a dev gateway's automatic session does not sign straight back in.
const SIGNED_OUT = 'edgefire.signedOut';

const $ = (id) => document.getElementById(id);
let api = null;
let devSession = null;
let stopPage = null;
let routeSeq = 0;

function saved() {
  try {
    const s = JSON.parse(sessionStorage.getItem(STORE) || 'null');
    return s && s.account_id && s.token ? s : null;
  } catch {
    return null;
  }
}

async function fetchDevSession() {
  try {
    const response = await fetch('/dashboard/session', {headers: {Accept: 'application/json'}});
    if (!response.ok) return null;
    const data = await response.json();
    return data.account_id && data.token ? data : null;
  } catch {
    return null;
  }
}

// 200 from the gateway list means the account id and token belong together.
async function checkCredentials(session) {
  const url = `/client/v4/accounts/${encodeURIComponent(session.account_id)}/ai-gateway/gateways`;
  const response = await fetch(url, {headers: {Authorization: `Bearer ${session.token}`}});
  if (!response.ok) throw await errorFrom(response);
}

function signIn(session) {
  sessionStorage.setItem(STORE, JSON.stringify(session));
  sessionStorage.removeItem(SIGNED_OUT);
  api = createClient(session, {onUnauthorized: (err) => showSignIn(err.message)});
  $('account-id').textContent = session.account_id;
  $('account-id').title = session.account_id;
  $('account-mode').hidden = session.mode !== 'dev';
  $('account').hidden = false;
  $('signin').hidden = true;
  $('layout').hidden = false;
  route(false);
}

// message: why the form is shown; an error (red, announced) unless it is only news.
function showSignIn(message, {isError = true} = {}) {
  if (stopPage) stopPage();
  stopPage = null;
  routeSeq += 1; // a page still loading must not mount behind the form
  sessionStorage.removeItem(STORE);
  api = null;
  $('main').replaceChildren();
  $('layout').hidden = true;
  $('account').hidden = true;
  $('signin').hidden = false;
  $('signin-dev').hidden = !devSession;
  const error = $('signin-error');
  error.textContent = message || '';
  error.hidden = !message;
  error.className = isError ? 'error' : 'notice-box';
  $('signin-account').focus();
}

function currentPage() {
  const name = location.hash.replace(/^#\/?/, '').split(/[/?]/)[0];
  return PAGES[name] ? name : null;
}

// Show the page the hash names; focus moves to its heading when the user navigated, so a
// screen reader announces the new page (not on the first load, where focus stays put).
async function route(moveFocus = true) {
  if (!api) return;
  const name = currentPage();
  if (!name) {
    history.replaceState(null, '', `#/${DEFAULT_PAGE}`);
    return route(moveFocus);
  }
  for (const link of document.querySelectorAll('.sidenav a')) {
    if (link.dataset.route === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  document.title = `${PAGES[name].title} · edgefire`;
  if (stopPage) stopPage();
  stopPage = null;
  const seq = ++routeSeq;
  const section = h('section', {class: 'page', 'aria-labelledby': `${name}-title`,
                                'data-page': name});
  $('main').replaceChildren(section);
  let module;
  try {
    module = await PAGES[name].load();
  } catch (err) {
    section.append(h('p', {class: 'error', role: 'alert'}, `Could not load this page: ${err.message}`));
    return;
  }
  if (seq !== routeSeq) return; // the user moved on while the module loaded
  stopPage = module.mount(section, {api, session: api.session}) || null;
  if (moveFocus) section.querySelector('h1')?.focus();
}

async function start() {
  $('signin-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const session = {account_id: $('signin-account').value.trim(),
                     token: $('signin-token').value.trim(), mode: 'token'};
    const button = event.submitter;
    if (button) button.disabled = true;
    try {
      await checkCredentials(session);
      signIn(session);
    } catch (err) {
      showSignIn(err.message);
    } finally {
      if (button) button.disabled = false;
    }
  });
  $('signin-dev').addEventListener('click', () => devSession && signIn(devSession));
  $('sign-out').addEventListener('click', () => {
    sessionStorage.setItem(SIGNED_OUT, '1');
    showSignIn('Signed out.', {isError: false});
  });
  // The skip link's own href would change the route; it only moves focus into the page.
  $('skip-link').addEventListener('click', (event) => {
    event.preventDefault();
    $('main').focus();
  });
  window.addEventListener('hashchange', () => route(true));

  devSession = await fetchDevSession();
  // A token kept from an earlier run may be gone (a fresh gateway database): check it first.
  let session = saved();
  if (session) session = await checkCredentials(session).then(() => session, () => null);
  session = session || (sessionStorage.getItem(SIGNED_OUT) ? null : devSession);
  if (session) signIn(session);
  else showSignIn('');
}

start();
