// The Baton web UI: the runs list (`/`) and one run (`/runs/<id>`), drawn from the
// coordinator's JSON API (see web/mod.rs). No build step and no libraries: the coordinator
// embeds these modules as they are (web/pages.rs lists them) and the browser loads them as ES
// modules, this one first.
//
// The page sends a strict CSP, so there are no inline scripts or style attributes in markup;
// the few sizes computed here are set through the CSSOM. Server data reaches the page only as
// text: see dom.js.
//
// This module is the app: the session, the router and sign-in. The pages are runs_page.js and
// run_page.js (which puts together the run_*, graph, step panel and memory modules).

import { api, errorText, onUnauthorized, setToken, token } from './api.js';
import { h, setText } from './dom.js';
import { RunPage } from './run_page.js';
import { RunsPage } from './runs_page.js';
import { Session } from './session.js';

const main = document.getElementById('main');

const app = {
  session: null,
  page: null,
  signInShown: false,

  async start({ focus = false } = {}) {
    this.disposePage();
    this.signInShown = false;
    let session;
    try {
      session = await api('/api/session');
    } catch (error) {
      if (error.status === 401) return;
      this.showFatal('Cannot load the session', error);
      return;
    }
    this.session = new Session(session);
    this.renderSession();
    this.route({ focus });
  },

  renderSession() {
    const box = document.getElementById('session');
    const principal = this.session?.principal;
    const hasToken = Boolean(token());
    box.hidden = !principal && !hasToken;
    setText(document.getElementById('session-principal'), principal ? `Signed in as ${principal}` : 'Signed in');
    document.getElementById('sign-out').hidden = !hasToken;
  },

  disposePage() {
    if (this.page) this.page.dispose();
    this.page = null;
  },

  route({ focus = false } = {}) {
    this.disposePage();
    const path = location.pathname;
    const run = /^\/runs\/([^/]+)\/?$/.exec(path);
    document.getElementById('nav-runs').toggleAttribute('aria-current', false);
    if (path === '/' || path === '/runs' || path === '/runs/') {
      document.getElementById('nav-runs').setAttribute('aria-current', 'page');
      this.page = new RunsPage(main);
    } else if (run) {
      let runId;
      try {
        runId = decodeURIComponent(run[1]);
      } catch {
        runId = run[1];
      }
      this.page = new RunPage(main, runId, this.session);
    } else {
      document.title = 'Not found — Baton';
      const heading = h('h1', { tabindex: '-1' }, 'Page not found');
      main.replaceChildren(heading, h('p', {}, 'Nothing here. ', h('a', { href: '/', 'data-route': '' }, 'See all runs'), '.'));
      this.page = { heading, dispose() {} };
    }
    if (focus) this.page.heading?.focus();
  },

  navigate(href) {
    history.pushState(null, '', href);
    window.scrollTo(0, 0);
    this.route({ focus: true });
  },

  /** A 401: forget the page, ask for a token (once, however many calls failed). */
  unauthorized(reason) {
    if (this.signInShown) return;
    this.signInShown = true;
    this.disposePage();
    this.showSignIn(reason);
  },

  showSignIn(reason) {
    document.getElementById('session').hidden = true;
    document.title = 'Sign in — Baton';
    const input = h('input', {
      id: 'token-input', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false',
    });
    const alert = h('p', { id: 'sign-in-error', class: 'alert', role: 'alert' }, reason || '');
    const form = h('form', { id: 'sign-in', class: 'sign-in card' },
      h('h1', { tabindex: '-1' }, 'Sign in to Baton'),
      h('p', {}, 'This coordinator asks for a token. It is kept in this browser tab only (session storage) and sent with every request.'),
      alert,
      h('div', { class: 'field' }, h('label', { for: 'token-input' }, 'Token'), input),
      h('button', { type: 'submit', class: 'button-primary' }, 'Sign in'));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      setToken(value);
      this.start({ focus: true });
    });
    main.replaceChildren(form);
    this.page = { dispose() {} };
    input.focus();
  },

  showFatal(title, error) {
    document.title = `${title} — Baton`;
    const retry = h('button', { type: 'button' }, 'Try again');
    retry.addEventListener('click', () => this.start({ focus: true }));
    main.replaceChildren(h('h1', {}, title), h('p', { class: 'alert', role: 'alert' }, errorText(error)), retry);
  },
};

onUnauthorized((reason) => app.unauthorized(reason));

document.getElementById('sign-out').addEventListener('click', () => {
  setToken('');
  app.session = null;
  app.start({ focus: true });
});

// Links inside the app change the page without reloading it.
document.addEventListener('click', (event) => {
  const link = event.target.closest?.('a[data-route]');
  if (!link || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(link.href, location.href);
  if (url.origin !== location.origin) return;
  event.preventDefault();
  app.navigate(url.pathname + url.search);
});

window.addEventListener('popstate', () => {
  if (app.session) app.route({ focus: true });
});

app.start();
