// The Baton web UI: the runs list (`/`) and one run (`/runs/<id>`), drawn from the
// coordinator's JSON API (see web/mod.rs). No build step and no libraries: the coordinator
// embeds this file as it is.
//
// Server data never goes through innerHTML: every element is built with createElement (SVG
// with createElementNS) and every text with textContent, so a step id or an agent's output
// cannot inject markup. The page sends a strict CSP, so there are no inline scripts or style
// attributes in markup; the few sizes computed here are set through the CSSOM.
//
// Layout of this file:
// - DOM and formatting helpers
// - api(): fetch with the bearer token; a 401 shows the sign-in form
// - the app: session, router, sign-in
// - RunsPage: the filtered, paged, live runs table
// - RunPage: header, actions, approvals, the graph, the step panel, memory; live via SSE

const TOKEN_KEY = 'baton.token';
const REFRESH_MS = 2000;
const PAGE_SIZE = 50;
const RUN_STATUSES = ['running', 'succeeded', 'failed', 'cancelled'];
const STEP_STATUSES = [
  'pending', 'queued', 'running', 'retrying', 'waiting',
  'succeeded', 'failed', 'rejected', 'cancelled', 'redriven',
];
// Big JSON (a payload carries the whole message history) is cut in the page until asked for:
// a few megabytes of text in one <pre> makes the panel sluggish.
const JSON_PREVIEW_CHARS = 60_000;
// Live output kept per step: an LLM can stream for long; the stored result is whole anyway.
const LIVE_OUTPUT_CHARS = 200_000;
const MESSAGES_SHOWN = 200;
// Stream reconnects back off up to this; polling covers the gap meanwhile.
const MAX_RECONNECT_MS = 60_000;
const SVG_NS = 'http://www.w3.org/2000/svg';
// A running run is read again this often even while its stream is up: a task taken by a worker
// of another coordinator (queued to running, a retry) changes no version of the run, so no
// event tells it; the record, read from the store, does.
const TASK_STATE_REFRESH_MS = 3_000;
// How often a failed run's page looks whether it was retried elsewhere.
const FAILED_REFRESH_MS = 10_000;

const main = document.getElementById('main');

// ---------------------------------------------------------------------------------------------
// DOM and formatting helpers

function applyProps(el, props) {
  if (!props) return;
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
}

function childNodes(children) {
  return children
    .flat(Infinity)
    .filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (typeof c === 'object' ? c : String(c)));
}

/** An HTML element; string children become text nodes (never parsed as markup). */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  el.append(...childNodes(children));
  return el;
}

/** An SVG element. */
function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  el.append(...childNodes(children));
  return el;
}

function setText(el, text) {
  const value = String(text ?? '');
  if (el.textContent !== value) el.textContent = value;
}

function knownStatus(status, known) {
  return known.includes(status) ? status : 'unknown';
}

/** A status as text in a coloured badge: the colour is never the only cue. */
function badge(status, extraClass = '') {
  const el = h('span', {});
  setBadge(el, status, extraClass);
  return el;
}

function setBadge(el, status, extraClass = '') {
  const known = knownStatus(status, STEP_STATUSES);
  const cls = `badge status-${known}${extraClass ? ` ${extraClass}` : ''}`;
  if (el.getAttribute('class') !== cls) el.setAttribute('class', cls);
  setText(el, status || 'unknown');
}

const pad2 = (n) => String(n).padStart(2, '0');

function formatDateTime(ms) {
  if (!ms) return '—';
  return new Date(ms).toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: 'numeric',
    hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
}

function timeElement(ms) {
  if (!ms) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: new Date(ms).toISOString() }, formatDateTime(ms));
}

function formatClock(date) {
  return `${pad2(date.getHours())}:${pad2(date.getMinutes())}:${pad2(date.getSeconds())}`;
}

/** "850 ms", "3.2 s", "4 min 05 s", "2 h 03 min", "3 d 4 h". */
function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms) || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 59.95) return `${seconds.toFixed(1)} s`;
  const total = Math.floor(seconds);
  const minutes = Math.floor(total / 60) % 60;
  const hours = Math.floor(total / 3600);
  if (hours === 0) return `${Math.floor(total / 60)} min ${pad2(total % 60)} s`;
  if (hours < 24) return `${hours} h ${pad2(minutes)} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** A visit's or attempt's duration; one still going counts until now. */
function durationSoFar(startedMs, finishedMs) {
  if (!startedMs) return '—';
  const text = formatDuration((finishedMs || Date.now()) - startedMs);
  return finishedMs || text === '—' ? text : `${text} so far`;
}

function runDuration(run, now = Date.now()) {
  if (!run.created_ms) return null;
  const end = run.status === 'running' ? now : run.updated_ms;
  return end - run.created_ms;
}

function formatCount(n) {
  return Number(n ?? 0).toLocaleString();
}

function formatTimestamp(text) {
  if (!text) return '—';
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? String(text) : formatDateTime(ms);
}

function plural(n, one, many = `${one}s`) {
  return `${formatCount(n)} ${n === 1 ? one : many}`;
}

/** Token usage summed per model: [{model, prompt_tokens, completion_tokens}]. */
function sumUsage(entries) {
  const totals = new Map();
  for (const used of entries ?? []) {
    const model = used.model || 'model';
    const total = totals.get(model) ?? { model, prompt_tokens: 0, completion_tokens: 0 };
    total.prompt_tokens += Number(used.prompt_tokens ?? 0);
    total.completion_tokens += Number(used.completion_tokens ?? 0);
    totals.set(model, total);
  }
  return [...totals.values()];
}

function usageText(usage) {
  if (!usage?.length) return '—';
  return usage
    .map((u) => `${u.model}: ${formatCount(u.prompt_tokens)} prompt + ${formatCount(u.completion_tokens)} completion`)
    .join('; ');
}

function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2) ?? 'null';
  } catch {
    return String(value);
  }
}

/** Pretty JSON in a <pre>, cut at JSON_PREVIEW_CHARS with a button that shows the rest. */
function jsonBlock(value, label) {
  const text = prettyJson(value);
  const pre = h('pre', { class: 'json', tabindex: '0', 'aria-label': label });
  if (text.length <= JSON_PREVIEW_CHARS) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = `${text.slice(0, JSON_PREVIEW_CHARS)}\n…`;
  const more = h('button', { type: 'button', class: 'button-quiet' },
    `Show all ${formatCount(Math.ceil(text.length / 1024))} KB`);
  more.addEventListener('click', () => {
    pre.textContent = text;
    more.remove();
  });
  return h('div', { class: 'json-wrap' }, pre, more);
}

/** A message's content: text as text, LangChain-style text parts joined, anything else JSON. */
function contentBlock(content) {
  if (typeof content === 'string') return h('p', { class: 'message-text' }, content);
  if (Array.isArray(content) && content.every((p) => p && p.type === 'text' && typeof p.text === 'string')) {
    return h('p', { class: 'message-text' }, content.map((p) => p.text).join('\n'));
  }
  return jsonBlock(content, 'Message content');
}

/** A <details> whose open state survives re-rendering (see rememberOpen). */
function details(key, summary, content, open = false) {
  return h('details', { 'data-key': key, open }, h('summary', {}, summary), content);
}

function rememberOpen(container) {
  const state = new Map();
  for (const el of container.querySelectorAll('details[data-key]')) state.set(el.dataset.key, el.open);
  return state;
}

function restoreOpen(container, state) {
  for (const el of container.querySelectorAll('details[data-key]')) {
    if (state.has(el.dataset.key)) el.open = state.get(el.dataset.key);
  }
}

/** `<step>#<visit>/<n>`: the id a message gets when its agent gave none. */
function messageOrigin(id) {
  const match = /^(.+)#(\d+)\/\d+$/.exec(String(id ?? ''));
  return match ? { step: match[1], visit: Number(match[2]) } : null;
}

function messageList(messages) {
  if (!messages?.length) return h('p', { class: 'muted' }, 'No messages.');
  return h('ol', { class: 'messages' }, messages.map((m) => {
    const origin = messageOrigin(m.id);
    return h('li', { class: 'message' },
      h('div', { class: 'message-head' },
        h('span', { class: `role role-${/^[a-z]+$/.test(m.role) ? m.role : 'other'}` }, m.role ?? '?'),
        m.name ? h('strong', {}, m.name) : null,
        origin ? h('span', { class: 'muted' }, `step ${origin.step}, visit ${origin.visit}`) : null,
        h('code', { class: 'message-id' }, m.id ?? '')),
      contentBlock(m.content),
      m.metadata && Object.keys(m.metadata).length
        ? details(`message-${m.id}-metadata`, 'Metadata', jsonBlock(m.metadata, 'Message metadata'))
        : null);
  }));
}

function decisionList(decisions) {
  if (!decisions?.length) return h('p', { class: 'muted' }, 'No decisions.');
  return h('ol', { class: 'decisions' }, decisions.map((d) => h('li', { class: 'decision', 'data-key': d.key },
    h('p', { class: 'decision-summary' }, d.summary ?? ''),
    d.rationale ? h('p', { class: 'decision-rationale' }, d.rationale) : null,
    h('p', { class: 'decision-meta' },
      `${d.agent ?? '?'} at step ${d.step_id ?? '?'}, visit ${d.visit ?? '?'}`,
      d.timestamp ? ` · ${formatTimestamp(d.timestamp)}` : ''),
    d.related_artifacts?.length
      ? h('p', { class: 'refs' }, 'Artifacts: ', d.related_artifacts.map((a, i) => [i ? ' ' : '', h('code', {}, a)]))
      : null)));
}

function handoffList(handoffs) {
  if (!handoffs?.length) return h('p', { class: 'muted' }, 'No handoffs.');
  return h('ol', { class: 'handoffs' }, handoffs.map((handoff) => {
    const sources = handoff.source_agents?.length ? handoff.source_agents.join(' + ') : '(run input)';
    const where = `into step ${handoff.step_id} (visit ${handoff.visit}${handoff.item != null ? `, item ${handoff.item}` : ''})`;
    return h('li', { class: 'handoff' },
      h('p', { class: 'handoff-head' },
        h('strong', {}, `${sources} → ${handoff.target_agent}`), ' ', where,
        handoff.timestamp ? h('span', { class: 'muted' }, ` · ${formatTimestamp(handoff.timestamp)}`) : null),
      handoff.decisions?.length
        ? h('ul', { class: 'handoff-decisions' }, handoff.decisions.map((d) => h('li', {},
          h('strong', {}, d.summary ?? ''), d.rationale ? ` — ${d.rationale}` : '',
          h('span', { class: 'muted' }, ` (${d.agent ?? '?'})`))))
        : h('p', { class: 'muted' }, 'No decisions handed on.'),
      handoff.memory_refs?.length
        ? h('p', { class: 'refs' }, 'Memory: ', handoff.memory_refs.map((r, i) => [i ? ' ' : '', h('code', {}, r)]))
        : null);
  }));
}

function usageTable(usage, caption) {
  const rows = sumUsage(usage);
  if (!rows.length) return h('p', { class: 'muted' }, 'No model calls.');
  return h('div', { class: 'table-scroll' }, h('table', { class: 'data-table' },
    h('caption', { class: 'visually-hidden' }, caption),
    h('thead', {}, h('tr', {}, ['Model', 'Prompt tokens', 'Completion tokens'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows.map((u) => h('tr', {},
      h('td', {}, u.model), h('td', { class: 'num' }, formatCount(u.prompt_tokens)),
      h('td', { class: 'num' }, formatCount(u.completion_tokens)))))));
}

/**
 * A run's waits, grouped: each approval alone, agents by (agent, served) with their steps, the
 * unserved first. A parallel step of 500 branches waits on 500 tasks of one agent: one line.
 */
function groupWaits(waits) {
  const groups = [];
  const byAgent = new Map();
  for (const wait of waits ?? []) {
    if (wait.kind !== 'agent') {
      groups.push({ ...wait, steps: [wait.step_id] });
      continue;
    }
    const key = `${wait.agent}\u0000${wait.served === false}`;
    let group = byAgent.get(key);
    if (!group) {
      group = { kind: 'agent', agent: wait.agent, served: wait.served !== false, steps: [] };
      byAgent.set(key, group);
      groups.push(group);
    }
    group.steps.push(wait.step_id);
  }
  const rank = (g) => (g.kind === 'agent' && !g.served ? 0 : g.kind === 'approval' ? 1 : 2);
  return groups.sort((a, b) => rank(a) - rank(b));
}

/** "approval: approve-plan", "agent coder — no worker serves it", "agent shard (436 steps)". */
function waitingText(group) {
  if (group.kind === 'approval') return `approval: ${group.step_id}`;
  if (group.kind !== 'agent') return group.note || group.step_id || '';
  const steps = group.steps.length === 1 ? `step ${group.steps[0]}` : `${formatCount(group.steps.length)} steps`;
  return group.served ? `agent ${group.agent} (${steps})` : `agent ${group.agent} — no worker serves it${group.steps.length > 1 ? ` (${steps})` : ''}`;
}

function waitClass(group) {
  if (group.kind === 'compute') return 'agent';
  return group.kind === 'approval' ? 'approval' : group.served ? 'agent' : 'unserved';
}

/** A live output offset ("1700000000000-3", a Redis stream id) as [ms, seq]; null if it is not one. */
function outputOffset(text) {
  const match = /^(\d+)-(\d+)$/.exec(String(text ?? ''));
  return match ? [Number(match[1]), Number(match[2])] : null;
}

function runPath(runId) {
  return `/runs/${encodeURIComponent(runId)}`;
}

function apiRunPath(runId) {
  return `/api/runs/${encodeURIComponent(runId)}`;
}

// ---------------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

function setToken(value) {
  try {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage refused (private mode): the token lives as long as the page.
  }
}

/** Calls the API; a 401 anywhere shows the sign-in form (and still throws). */
async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'same-origin',
    });
  } catch (error) {
    throw new ApiError(0, `cannot reach the coordinator (${error.message})`, 'unavailable');
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (response.status === 401) {
    const message = data?.error || 'the coordinator asks for a token';
    app.unauthorized(bearer ? `The token was refused: ${message}.` : '');
    throw new ApiError(401, message, 'unauthenticated');
  }
  if (!response.ok) {
    const message = data?.error || `${response.status} ${response.statusText}`.trim();
    throw new ApiError(response.status, message, data?.code || '');
  }
  return data;
}

function errorText(error) {
  if (error?.status === 403) return `Not allowed: ${error.message}`;
  return error?.message || String(error);
}

// ---------------------------------------------------------------------------------------------
// The app: session, router and sign-in

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
    this.session = { roles: [], ...session };
    this.renderSession();
    this.route({ focus });
  },

  can(role) {
    return Boolean(this.session?.roles?.includes(role));
  },

  // Cancel and retry: an operator's on any run, a submitter's on its own (the coordinator
  // decides; this only hides what it would refuse). Without authentication there is no
  // principal and nothing is anyone's.
  mayChange(record) {
    if (this.can('operate')) return true;
    const principal = this.session?.principal;
    return this.can('submit') && (!principal || record.submitted_by === principal);
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
      this.page = new RunPage(main, runId);
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

/** What every page shares: listeners and timers that end with it. */
class Page {
  constructor() {
    this.disposed = false;
    this.cleanups = [];
  }

  listen(target, type, fn) {
    target.addEventListener(type, fn);
    this.cleanups.push(() => target.removeEventListener(type, fn));
  }

  dispose() {
    this.disposed = true;
    for (const cleanup of this.cleanups.splice(0)) cleanup();
  }
}

// ---------------------------------------------------------------------------------------------
// The runs list

class RunsPage extends Page {
  constructor(root) {
    super();
    const params = new URLSearchParams(location.search);
    const status = params.get('status') ?? '';
    this.status = RUN_STATUSES.includes(status) ? status : '';
    this.workflow = (params.get('workflow') ?? '').trim();
    this.cursors = [null]; // the cursor of each page visited; the last is the current page
    this.next = null;
    this.rows = new Map();
    this.workflowIds = new Set();
    this.seq = 0;
    this.timer = 0;
    this.lastError = '';
    document.title = 'Runs — Baton';
    this.render(root);
    this.listen(document, 'visibilitychange', () => {
      if (!document.hidden && this.stalled) this.refresh();
    });
    this.refresh();
  }

  render(root) {
    this.heading = h('h1', { tabindex: '-1' }, 'Runs');
    this.statusSelect = h('select', { id: 'filter-status', name: 'status' },
      h('option', { value: '' }, 'All'),
      RUN_STATUSES.map((st) => h('option', { value: st }, st)));
    this.statusSelect.value = this.status;
    this.workflowInput = h('input', {
      id: 'filter-workflow', name: 'workflow', type: 'search', list: 'workflow-ids',
      autocomplete: 'off', spellcheck: 'false', placeholder: 'any workflow',
    });
    this.workflowInput.value = this.workflow;
    this.datalist = h('datalist', { id: 'workflow-ids' });
    this.clearButton = h('button', { type: 'button', id: 'filter-clear', class: 'button-quiet' }, 'Clear filters');
    const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter runs' },
      h('div', { class: 'field' }, h('label', { for: 'filter-status' }, 'Status'), this.statusSelect),
      h('div', { class: 'field' }, h('label', { for: 'filter-workflow' }, 'Workflow'), this.workflowInput, this.datalist),
      this.clearButton);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.applyFilters();
    });
    this.statusSelect.addEventListener('change', () => this.applyFilters());
    this.workflowInput.addEventListener('change', () => this.applyFilters());
    // The clear button of a search field changes the value without a change event.
    this.workflowInput.addEventListener('search', () => this.applyFilters());
    this.clearButton.addEventListener('click', () => {
      this.statusSelect.value = '';
      this.workflowInput.value = '';
      this.applyFilters();
      this.statusSelect.focus();
    });

    this.count = h('span', { id: 'runs-count' }, '');
    this.updated = h('span', { id: 'runs-updated' }, '');
    this.error = h('p', { id: 'runs-error', class: 'alert', role: 'alert' });

    this.tbody = h('tbody', {});
    this.emptyRow = h('tr', { class: 'empty-row' }, h('td', { colspan: '6' }, 'Loading runs…'));
    this.tbody.append(this.emptyRow);
    const table = h('table', { id: 'runs-table', class: 'data-table runs' },
      h('caption', { id: 'runs-caption' }, 'Runs, newest first'),
      h('thead', {}, h('tr', {},
        ['Run', 'Workflow', 'Status', 'Started', 'Duration', 'Waiting for'].map((t) => h('th', { scope: 'col' }, t)))),
      this.tbody);

    this.newer = h('button', { type: 'button', id: 'runs-newer' }, 'Newer');
    this.older = h('button', { type: 'button', id: 'runs-older' }, 'Older');
    this.pageLabel = h('span', { id: 'runs-page', class: 'muted' }, '');
    this.newer.addEventListener('click', () => this.goNewer());
    this.older.addEventListener('click', () => this.goOlder());

    root.replaceChildren(
      h('div', { class: 'page-head' }, this.heading,
        h('p', { class: 'meta-line' }, this.count, h('span', { 'aria-hidden': 'true' }, ' · '), this.updated)),
      form,
      this.error,
      h('div', { class: 'table-scroll', tabindex: '0', role: 'region', 'aria-labelledby': 'runs-caption' }, table),
      h('nav', { class: 'pager', 'aria-label': 'Pages of runs' }, this.newer, this.pageLabel, this.older));
    this.updateControls();
  }

  applyFilters() {
    const status = this.statusSelect.value;
    const workflow = this.workflowInput.value.trim();
    if (status === this.status && workflow === this.workflow) return;
    this.status = status;
    this.workflow = workflow;
    this.cursors = [null];
    this.next = null;
    const params = new URLSearchParams();
    if (status) params.set('status', status);
    if (workflow) params.set('workflow', workflow);
    const query = params.toString();
    history.replaceState(null, '', query ? `/?${query}` : '/');
    this.updateControls();
    this.refresh();
  }

  // Until the page asked for comes, `next` is the shown page's: a second click waits.
  goOlder() {
    if (!this.next || this.paging) return;
    this.cursors.push(this.next);
    this.refresh({ scrollTop: true, paging: true });
  }

  goNewer() {
    if (this.cursors.length < 2 || this.paging) return;
    this.cursors.pop();
    this.refresh({ scrollTop: true, paging: true });
  }

  updateControls() {
    const focused = document.activeElement;
    this.newer.disabled = this.cursors.length < 2;
    this.older.disabled = !this.next;
    // A button that goes disabled under the keyboard hands focus to its sibling.
    if (focused === this.older && this.older.disabled && !this.newer.disabled) this.newer.focus();
    if (focused === this.newer && this.newer.disabled && !this.older.disabled) this.older.focus();
    this.clearButton.hidden = !this.status && !this.workflow;
    setText(this.pageLabel, `Page ${this.cursors.length}`);
  }

  query() {
    const params = new URLSearchParams();
    if (this.status) params.set('status', this.status);
    if (this.workflow) params.set('workflow', this.workflow);
    params.set('limit', String(PAGE_SIZE));
    const cursor = this.cursors.at(-1);
    if (cursor) params.set('cursor', cursor);
    return params.toString();
  }

  /** Fetches the current page now, then again every REFRESH_MS while the tab is visible. */
  async refresh({ scrollTop = false, paging = false } = {}) {
    clearTimeout(this.timer);
    if (this.disposed) return;
    this.paging = paging;
    if (document.hidden) {
      this.stalled = true;
      return;
    }
    this.stalled = false;
    const seq = ++this.seq;
    try {
      const data = await api(`/api/runs?${this.query()}`);
      if (this.disposed || seq !== this.seq) return;
      this.show(data, scrollTop);
      this.showError('');
    } catch (error) {
      if (this.disposed || seq !== this.seq || error.status === 401) return;
      this.showError(`Could not load runs: ${errorText(error)}`);
    }
    if (!this.disposed && seq === this.seq) {
      this.paging = false;
      this.timer = setTimeout(() => this.refresh(), REFRESH_MS);
    }
  }

  showError(text) {
    // The alert speaks when its text changes: the same failure every 2 s is said once.
    if (text === this.lastError) return;
    this.lastError = text;
    setText(this.error, text);
  }

  show(data, scrollTop) {
    const runs = Array.isArray(data?.runs) ? data.runs : [];
    this.next = data?.next || null;
    const now = Date.now();
    const wanted = new Set(runs.map((r) => r.run_id));
    for (const [id, row] of this.rows) {
      if (!wanted.has(id)) {
        row.tr.remove();
        this.rows.delete(id);
      }
    }
    if (runs.length) this.emptyRow.remove();
    else {
      setText(this.emptyRow.firstChild, this.status || this.workflow ? 'No runs match these filters.' : 'No runs yet.');
      if (!this.emptyRow.isConnected) this.tbody.append(this.emptyRow);
    }
    // Rows are kept and moved only when out of place, so a focused link keeps its focus.
    let position = this.tbody.firstElementChild === this.emptyRow ? this.emptyRow.nextElementSibling : this.tbody.firstElementChild;
    for (const run of runs) {
      let row = this.rows.get(run.run_id);
      if (!row) {
        row = this.createRow(run);
        this.rows.set(run.run_id, row);
      }
      this.updateRow(row, run, now);
      if (row.tr !== position) this.tbody.insertBefore(row.tr, position);
      else position = position.nextElementSibling;
      if (run.workflow_id && !this.workflowIds.has(run.workflow_id)) {
        this.workflowIds.add(run.workflow_id);
        this.datalist.append(h('option', { value: run.workflow_id }));
      }
    }
    const page = this.cursors.length;
    setText(this.count, `${plural(runs.length, 'run')}${page > 1 ? ` on page ${page}` : ''}`);
    setText(this.updated, `updated ${formatClock(new Date())}`);
    this.updateControls();
    if (scrollTop) this.heading.scrollIntoView({ block: 'start' });
  }

  createRow(run) {
    const link = h('a', { href: runPath(run.run_id), 'data-route': '', class: 'mono' }, run.run_id);
    // data-label names each cell where phones show a row as a card, without the header row.
    const cells = {
      workflow: h('td', { class: 'cell-workflow', 'data-label': 'Workflow' }),
      status: badge(run.status),
      started: h('td', { class: 'cell-started', 'data-label': 'Started' }),
      duration: h('td', { class: 'cell-duration num', 'data-label': 'Duration' }),
      waiting: h('td', { class: 'waiting-cell', 'data-label': 'Waiting for' }),
    };
    const tr = h('tr', { 'data-run-id': run.run_id },
      h('th', { scope: 'row', class: 'cell-run' }, link), cells.workflow,
      h('td', { class: 'cell-status', 'data-label': 'Status' }, cells.status),
      cells.started, cells.duration, cells.waiting);
    return { tr, ...cells, key: {} };
  }

  updateRow(row, run, now) {
    setText(row.workflow, run.workflow_id);
    setBadge(row.status, run.status);
    row.tr.dataset.status = run.status;
    if (row.key.created !== run.created_ms) {
      row.key.created = run.created_ms;
      row.started.replaceChildren(timeElement(run.created_ms));
    }
    setText(row.duration, formatDuration(runDuration(run, now)));
    const waiting = run.status === 'running' ? run.waiting ?? [] : [];
    const waitingKey = JSON.stringify(waiting);
    if (row.key.waiting !== waitingKey) {
      row.key.waiting = waitingKey;
      row.waiting.replaceChildren(...groupWaits(waiting).map((group) => h('span', {
        class: `wait wait-${waitClass(group)}`,
      }, waitingText(group))));
      if (!waiting.length) row.waiting.append(h('span', { class: 'muted' }, '—'));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One run

// Text in graph nodes is cut to fit its box. Widths come from a canvas (no layout, so 500
// nodes measure in a few milliseconds) with the fonts app.css gives the SVG's text.
const FONTS = { title: '650 13px', compactTitle: '650 11px', small: '650 11px', detail: '400 11px' };
let measure = null;

function textWidth(text, font) {
  if (!measure) {
    measure = {
      context: document.createElement('canvas').getContext('2d'),
      family: getComputedStyle(document.body).fontFamily || 'sans-serif',
    };
  }
  if (!measure.context) return text.length * 8;
  measure.context.font = `${FONTS[font]} ${measure.family}`;
  return measure.context.measureText(text).width;
}

function fitText(text, width, font) {
  const value = String(text ?? '');
  if (textWidth(value, font) <= width) return value;
  let low = 0;
  let high = value.length;
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    if (textWidth(`${value.slice(0, mid)}…`, font) <= width) low = mid;
    else high = mid - 1;
  }
  return `${value.slice(0, Math.max(1, low))}…`;
}

/** A map step's items: "12/40 done, 1 failed" (done counts the failed too). */
function itemsText(items, { running = false } = {}) {
  if (!items || !items.count) return '';
  const settled = Number(items.succeeded ?? 0) + Number(items.failed ?? 0);
  let text = `${formatCount(settled)}/${formatCount(items.count)} done`;
  if (items.failed) text += `, ${formatCount(items.failed)} failed`;
  if (running && items.running) text += `, ${formatCount(items.running)} running`;
  return text;
}

/** How a container's children stand, most telling first: "3 failed · 10 running · 320 succeeded". */
function childrenText(counts) {
  if (!counts) return '';
  const order = ['failed', 'rejected', 'retrying', 'running', 'waiting', 'queued', 'succeeded', 'redriven', 'cancelled'];
  return order.filter((st) => counts[st]).map((st) => `${formatCount(counts[st])} ${st}`).join(' · ');
}

/** The point halfway along a polyline, where its label goes. */
function midpoint(points) {
  if (points.length === 1) return points[0];
  let total = 0;
  for (let i = 1; i < points.length; i += 1) total += Math.hypot(points[i][0] - points[i - 1][0], points[i][1] - points[i - 1][1]);
  let left = total / 2;
  for (let i = 1; i < points.length; i += 1) {
    const [x0, y0] = points[i - 1];
    const [x1, y1] = points[i];
    const length = Math.hypot(x1 - x0, y1 - y0);
    if (length >= left && length > 0) return [x0 + ((x1 - x0) * left) / length, y0 + ((y1 - y0) * left) / length];
    left -= length;
  }
  return points.at(-1);
}

function safeHttpUrl(text) {
  try {
    const url = new URL(text, location.href);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

class RunPage extends Page {
  constructor(root, runId) {
    super();
    this.runId = runId;
    this.record = null;
    this.graph = null;
    this.nodeViews = new Map(); // step id -> the node's elements and what they show
    this.outputs = new Map(); // step id -> {visit, attempt, text}: live output, kept when its panel is closed
    this.lastOffset = null; // the last piece shown, [ms, seq]: a reconnected stream repeats those before it
    this.panelStep = null;
    this.panelKey = '';
    this.panelSeq = 0;
    this.approvals = new Map(); // step id -> the approval region
    this.memoryKey = '';
    this.fetching = false;
    this.refreshQueued = false;
    this.stream = null;
    this.pollTimer = 0;
    this.polling = false;
    this.reconnectTimer = 0;
    this.reconnectDelay = 2000;
    this.tickTimer = 0;
    document.title = `Run ${runId} — Baton`;
    this.renderShell(root);
    this.listen(document, 'keydown', (event) => this.onKeydown(event));
    this.listen(document, 'visibilitychange', () => {
      if (!document.hidden && this.polling) this.poll();
    });
    this.load();
  }

  dispose() {
    super.dispose();
    this.stopStream();
    this.stopPolling();
    clearTimeout(this.reconnectTimer);
    clearInterval(this.tickTimer);
    clearInterval(this.taskStateTimer);
    clearInterval(this.retryTimer);
  }

  // --- the page's skeleton -------------------------------------------------------------------

  renderShell(root) {
    this.heading = h('h1', { id: 'run-title', tabindex: '-1' }, 'Run ', h('span', { class: 'mono' }, this.runId));
    this.statusBadge = h('span', { id: 'run-status' }, '');
    this.actions = h('div', { id: 'run-actions', class: 'actions', role: 'group', 'aria-label': 'Run actions' });
    this.actionStatus = h('p', { id: 'action-status', class: 'status-message', role: 'status' });
    this.actionError = h('p', { id: 'action-error', class: 'alert', role: 'alert' });
    this.refreshError = h('p', { id: 'refresh-error', class: 'alert', role: 'alert' });
    this.summary = h('dl', { id: 'run-summary', class: 'summary' });
    this.runError = h('p', { id: 'run-error', class: 'run-error', hidden: true });
    this.waitingBox = h('div', { id: 'run-waiting', class: 'waiting', hidden: true });
    this.approvalBox = h('div', { class: 'approvals' });
    this.graphBox = h('div', { id: 'graph', class: 'graph-scroll' }, h('p', { class: 'muted' }, 'Loading the graph…'));
    this.outputNote = h('p', { id: 'output-missed', class: 'note', hidden: true });
    this.zoomButton = h('button', { type: 'button', id: 'graph-zoom', class: 'button-quiet', 'aria-pressed': 'false' }, 'Actual size');
    this.zoomButton.addEventListener('click', () => this.toggleZoom());
    this.panel = this.renderPanel();
    this.memory = h('section', { id: 'memory', class: 'memory', 'aria-labelledby': 'memory-title' },
      h('h2', { id: 'memory-title' }, 'Memory'),
      h('p', { class: 'muted' }, 'Loading…'));
    this.body = h('div', { class: 'run-body' },
      h('section', { class: 'graph-section card', 'aria-labelledby': 'graph-title' },
        h('div', { class: 'section-head' },
          h('h2', { id: 'graph-title' }, 'Workflow'),
          h('p', { id: 'graph-hint', class: 'hint' }, 'Select a step to see what it received, returned and handed on (arrow keys move between steps, Enter opens one).'),
          this.zoomButton),
        this.legend(),
        this.graphBox,
        this.outputNote),
      this.panel);
    root.replaceChildren(
      h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('ol', {},
        h('li', {}, h('a', { href: '/', 'data-route': '' }, 'Runs')),
        h('li', { 'aria-current': 'page' }, this.runId))),
      h('div', { class: 'run-head' }, h('div', { class: 'run-title' }, this.heading, this.statusBadge), this.actions),
      this.renderCancelForm(),
      this.actionStatus,
      this.actionError,
      this.refreshError,
      this.summary,
      this.runError,
      this.waitingBox,
      this.approvalBox,
      this.body,
      this.memory);
  }

  legend() {
    return h('ul', { class: 'legend', 'aria-label': 'Step statuses' },
      STEP_STATUSES.map((st) => h('li', {}, h('span', { class: `swatch status-${st}`, 'aria-hidden': 'true' }), st)));
  }

  renderCancelForm() {
    this.cancelReason = h('input', { id: 'cancel-reason', name: 'reason', type: 'text', autocomplete: 'off' });
    this.cancelConfirm = h('button', { type: 'submit', id: 'cancel-confirm', class: 'button-danger' }, 'Stop the run');
    const dismiss = h('button', { type: 'button', id: 'cancel-dismiss' }, 'Keep running');
    this.cancelForm = h('form', { id: 'cancel-form', class: 'inline-form card', hidden: true },
      h('div', { class: 'field grow' }, h('label', { for: 'cancel-reason' }, 'Reason'), this.cancelReason),
      this.cancelConfirm, dismiss);
    this.cancelForm.addEventListener('submit', (event) => {
      event.preventDefault();
      this.cancelRun();
    });
    dismiss.addEventListener('click', () => this.hideCancelForm(true));
    return this.cancelForm;
  }

  // --- loading and live updates --------------------------------------------------------------

  async load() {
    const [record, graph] = await Promise.allSettled([
      api(apiRunPath(this.runId)),
      api(`${apiRunPath(this.runId)}/graph`),
    ]);
    if (this.disposed) return;
    if (record.status === 'rejected') {
      const error = record.reason;
      if (error.status === 401) return;
      this.showLoadError(error);
      return;
    }
    if (graph.status === 'fulfilled') {
      this.drawGraph(graph.value);
    } else if (graph.reason.status !== 401) {
      this.graphBox.replaceChildren(h('p', { class: 'alert' }, `Could not load the graph: ${errorText(graph.reason)}`));
    }
    this.applyRecord(record.value, { force: true });
    const step = new URLSearchParams(location.search).get('step');
    if (step) this.openPanel(step, { focus: false });
    if (this.record.status === 'running') this.startLive();
  }

  showLoadError(error) {
    const notFound = error.status === 404;
    document.title = `${notFound ? 'Run not found' : 'Run unavailable'} — Baton`;
    this.heading = h('h1', { id: 'run-title', tabindex: '-1' }, notFound ? 'Run not found' : `Run ${this.runId}`);
    main.replaceChildren(
      h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('ol', {}, h('li', {}, h('a', { href: '/', 'data-route': '' }, 'Runs')))),
      this.heading,
      h('p', { class: 'alert', role: 'alert' }, errorText(error)),
      h('p', {}, h('a', { href: '/', 'data-route': '' }, 'See all runs')));
  }

  startLive() {
    clearInterval(this.retryTimer);
    this.startStream();
    clearInterval(this.tickTimer);
    this.tickTimer = setInterval(() => this.renderDuration(), 1000);
    clearInterval(this.taskStateTimer);
    this.taskStateTimer = setInterval(() => {
      if (!document.hidden && this.record?.status === 'running') this.scheduleRefresh();
    }, TASK_STATE_REFRESH_MS);
  }

  stopLive() {
    this.stopStream();
    this.stopPolling();
    clearTimeout(this.reconnectTimer);
    clearInterval(this.tickTimer);
    clearInterval(this.taskStateTimer);
  }

  startStream() {
    if (this.stream || this.disposed) return;
    const bearer = token();
    const url = `${apiRunPath(this.runId)}/events${bearer ? `?access_token=${encodeURIComponent(bearer)}` : ''}`;
    const stream = new EventSource(url);
    this.stream = stream;
    const parse = (event) => {
      try {
        return JSON.parse(event.data);
      } catch {
        return null;
      }
    };
    for (const name of ['step_started', 'step_finished', 'approval_requested', 'map_progress', 'message']) {
      stream.addEventListener(name, (event) => {
        // The open step's detail changes with its own events even when its status does not.
        if (this.panelStep && parse(event)?.step_id === this.panelStep) this.panelKey = '';
        this.scheduleRefresh();
      });
    }
    stream.addEventListener('step_output', (event) => {
      const data = parse(event);
      if (data) this.appendOutput(data);
    });
    stream.addEventListener('output_missed', (event) => {
      const data = parse(event);
      this.outputNote.hidden = false;
      setText(this.outputNote, `This page fell behind the live output and missed ${plural(Number(data?.pieces ?? 0), 'piece')} of it; the stored results are whole.`);
    });
    stream.addEventListener('run_finished', (event) => {
      const data = parse(event);
      this.stopStream();
      if (data?.record) this.applyRecord(data.record);
      else this.scheduleRefresh();
    });
    stream.addEventListener('open', () => {
      this.reconnectDelay = 2000;
      this.stopPolling();
      // Events sent while the stream was down are lost: catch up once.
      this.scheduleRefresh();
    });
    stream.addEventListener('error', () => {
      if (this.stream !== stream) return;
      this.stopStream();
      if (this.disposed || this.record?.status !== 'running') return;
      this.startPolling();
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = setTimeout(() => this.startStream(), this.reconnectDelay);
      this.reconnectDelay = Math.min(this.reconnectDelay * 2, MAX_RECONNECT_MS);
    });
  }

  stopStream() {
    if (this.stream) this.stream.close();
    this.stream = null;
  }

  startPolling() {
    if (this.polling) return;
    this.polling = true;
    this.pollTimer = setTimeout(() => this.poll(), REFRESH_MS);
  }

  stopPolling() {
    this.polling = false;
    clearTimeout(this.pollTimer);
  }

  poll() {
    clearTimeout(this.pollTimer);
    if (!this.polling || this.disposed) return;
    if (!document.hidden) this.scheduleRefresh();
    this.pollTimer = setTimeout(() => this.poll(), REFRESH_MS);
  }

  /** Re-fetches the record: at most one fetch in flight and one queued behind it. */
  scheduleRefresh() {
    if (this.disposed) return;
    if (this.fetching) {
      this.refreshQueued = true;
      return;
    }
    this.fetching = true;
    api(apiRunPath(this.runId))
      .then((record) => {
        setText(this.refreshError, '');
        this.applyRecord(record);
      })
      .catch((error) => {
        if (error.status !== 401 && !this.disposed) setText(this.refreshError, `Could not refresh the run: ${errorText(error)}`);
      })
      .finally(() => {
        this.fetching = false;
        if (this.refreshQueued) {
          this.refreshQueued = false;
          this.scheduleRefresh();
        }
      });
  }

  appendOutput(piece) {
    const offset = outputOffset(piece.offset);
    if (offset) {
      // Offsets are the store's stream ids, in order: one not after the last shown was shown.
      const last = this.lastOffset;
      if (last && (offset[0] < last[0] || (offset[0] === last[0] && offset[1] <= last[1]))) return;
      this.lastOffset = offset;
    }
    const stepId = piece.step_id;
    let buffer = this.outputs.get(stepId);
    const fresh = !buffer || piece.restart || buffer.visit !== piece.visit || buffer.attempt !== piece.attempt;
    if (fresh) {
      buffer = { visit: piece.visit, attempt: piece.attempt, text: '' };
      this.outputs.set(stepId, buffer);
    }
    buffer.text += piece.text ?? '';
    let cut = false;
    if (buffer.text.length > LIVE_OUTPUT_CHARS) {
      buffer.text = `…${buffer.text.slice(-LIVE_OUTPUT_CHARS)}`;
      cut = true;
    }
    if (this.panelStep === stepId) this.showOutput(fresh || cut ? null : piece.text ?? '');
  }

  // --- the record ----------------------------------------------------------------------------

  applyRecord(record, { force = false } = {}) {
    if (this.disposed || !record) return;
    // A slower fetch must not undo what a faster one (or an action's answer) showed.
    if (!force && this.record && Number(record.updated_ms) < Number(this.record.updated_ms)) return;
    const wasRunning = this.record?.status === 'running';
    this.record = record;
    this.stepsById = new Map((record.steps ?? []).map((step) => [step.id, step]));
    this.renderHeader();
    this.renderActions();
    this.renderWaiting();
    this.syncApprovals();
    this.updateNodes();
    this.renderMemory();
    if (this.panelStep) {
      const key = this.stepKey(this.panelStep);
      if (key !== this.panelKey) this.loadPanel();
      this.renderPanelMeta();
    }
    if (record.status === 'running') {
      if (!wasRunning && !force) this.startLive();
    } else {
      this.stopLive();
      // A failed run may be retried from another page or the CLI: look now and then.
      if (record.status === 'failed') this.watchForRetry();
    }
  }

  watchForRetry() {
    clearInterval(this.retryTimer);
    this.retryTimer = setInterval(() => {
      if (!document.hidden && this.record?.status === 'failed') this.scheduleRefresh();
    }, FAILED_REFRESH_MS);
  }

  stepKey(stepId) {
    const step = this.stepsById?.get(stepId);
    if (!step) return '';
    return [step.status, step.visits, step.attempts, step.error ?? '', JSON.stringify(step.items ?? null)].join('|');
  }

  renderHeader() {
    const record = this.record;
    setBadge(this.statusBadge, record.status, 'badge-large');
    const rows = [
      ['Workflow', h('span', { class: 'mono' }, record.workflow_id)],
      ['Started', timeElement(record.created_ms)],
      ['Duration', h('span', { id: 'run-duration' }, formatDuration(runDuration(record)))],
      ['Submitted by', record.submitted_by || h('span', { class: 'muted' }, '—')],
      ['State', record.state_sha256
        ? h('code', { id: 'run-state', title: record.state_sha256 }, `${record.state_sha256.slice(0, 12)}…`)
        : h('span', { class: 'muted' }, '—')],
    ];
    const usage = sumUsage(record.usage);
    if (usage.length) rows.push(['Tokens', usageText(usage)]);
    const template = app.session?.trace_url;
    if (template && record.trace_id) {
      const href = safeHttpUrl(String(template).replaceAll('{trace_id}', encodeURIComponent(record.trace_id)));
      if (href) rows.push(['Trace', h('a', { id: 'run-trace', href, rel: 'noopener noreferrer', target: '_blank' }, 'Trace', h('span', { class: 'visually-hidden' }, ' (opens in a new tab)'))]);
    }
    const key = JSON.stringify([record.workflow_id, record.created_ms, record.submitted_by, record.state_sha256, usage, record.trace_id, template]);
    if (key !== this.headerKey) {
      this.headerKey = key;
      this.summary.replaceChildren(...rows.map(([term, value]) => h('div', {}, h('dt', {}, term), h('dd', {}, value))));
    } else {
      this.renderDuration();
    }
    this.runError.hidden = !record.error;
    setText(this.runError, record.error ? `Error: ${record.error}` : '');
  }

  renderDuration() {
    const el = this.summary.querySelector('#run-duration');
    if (el && this.record) setText(el, formatDuration(runDuration(this.record)));
  }

  renderActions() {
    const record = this.record;
    const wanted = [];
    if (record.status === 'running' && app.mayChange(record)) wanted.push('cancel');
    if (record.status === 'failed' && app.mayChange(record)) wanted.push('retry');
    wanted.push('verify');
    const key = wanted.join(',');
    if (key === this.actionsKey) return;
    this.actionsKey = key;
    const buttons = [];
    if (wanted.includes('cancel')) {
      this.cancelButton = h('button', { type: 'button', id: 'cancel-run', class: 'button-danger', 'aria-expanded': 'false', 'aria-controls': 'cancel-form' }, 'Cancel');
      this.cancelButton.addEventListener('click', () => this.showCancelForm());
      buttons.push(this.cancelButton);
    } else {
      this.cancelButton = null;
      this.hideCancelForm(false);
    }
    if (wanted.includes('retry')) {
      const retry = h('button', { type: 'button', id: 'retry-run', class: 'button-primary' }, 'Retry');
      retry.addEventListener('click', () => this.retryRun(retry));
      buttons.push(retry);
    }
    const verify = h('button', { type: 'button', id: 'verify-run' }, 'Verify');
    verify.addEventListener('click', () => this.verifyRun(verify));
    buttons.push(verify);
    // Keep focus on an action that survives the re-render (Verify always does).
    const focusedId = this.actions.contains(document.activeElement) ? document.activeElement.id : null;
    this.actions.replaceChildren(...buttons);
    if (focusedId) (document.getElementById(focusedId) ?? verify).focus();
  }

  renderWaiting() {
    const waits = this.record.status === 'running'
      ? (this.record.waiting ?? []).filter((w) => w.kind !== 'approval')
      : [];
    const key = JSON.stringify(waits);
    if (key === this.waitingKey) return;
    this.waitingKey = key;
    this.waitingBox.hidden = !waits.length;
    const open = rememberOpen(this.waitingBox);
    this.waitingBox.replaceChildren(
      h('h2', { class: 'visually-hidden' }, 'Waiting for'),
      h('ul', { class: 'plain' }, groupWaits(waits).map((group) => h('li', { class: `wait-${waitClass(group)}` },
        h('strong', {}, 'Waiting for '), waitingText(group),
        group.served || group.kind !== 'agent' ? null : h('span', { class: 'muted' }, ` · start a worker that serves agent ${group.agent}, or cancel the run`),
        group.steps.length > 1
          ? details(`waiting-${group.agent}-${group.served}`, 'Steps', h('p', { class: 'refs' },
            group.steps.slice(0, 200).map((id, i) => [i ? ' ' : '', h('code', {}, id)]),
            group.steps.length > 200 ? ` … and ${formatCount(group.steps.length - 200)} more` : ''))
          : null))));
    restoreOpen(this.waitingBox, open);
  }

  showActionStatus(text) {
    setText(this.actionError, '');
    setText(this.actionStatus, text);
  }

  showActionError(text) {
    setText(this.actionStatus, '');
    setText(this.actionError, text);
  }

  // --- actions -------------------------------------------------------------------------------

  showCancelForm() {
    this.cancelForm.hidden = false;
    this.cancelButton?.setAttribute('aria-expanded', 'true');
    this.cancelReason.focus();
  }

  hideCancelForm(returnFocus) {
    this.cancelForm.hidden = true;
    this.cancelButton?.setAttribute('aria-expanded', 'false');
    if (returnFocus) this.cancelButton?.focus();
  }

  async post(path, body) {
    return api(`${apiRunPath(this.runId)}/${path}`, { method: 'POST', body });
  }

  async cancelRun() {
    this.cancelConfirm.disabled = true;
    try {
      const record = await this.post('cancel', { reason: this.cancelReason.value.trim() });
      this.hideCancelForm(false);
      this.cancelReason.value = '';
      this.showActionStatus('Run cancelled');
      this.applyRecord(record);
      this.heading.focus();
    } catch (error) {
      if (error.status !== 401) this.showActionError(`Could not cancel: ${errorText(error)}`);
    } finally {
      this.cancelConfirm.disabled = false;
    }
  }

  async retryRun(button) {
    button.disabled = true;
    try {
      const record = await this.post('retry', {});
      this.showActionStatus('Retrying: the run goes on from the steps that did not succeed');
      this.applyRecord(record);
      this.heading.focus();
    } catch (error) {
      if (error.status !== 401) this.showActionError(`Could not retry: ${errorText(error)}`);
      button.disabled = false;
    }
  }

  async verifyRun(button) {
    button.disabled = true;
    try {
      const result = await this.post('verify', {});
      if (result?.ok) {
        this.showActionStatus(`State chain holds: ${plural(Number(result.links ?? 0), 'link')}`);
      } else {
        const where = result?.step_id
          ? ` (step ${result.step_id}${result.visit != null ? `, visit ${result.visit}` : ''})`
          : '';
        this.showActionError(`State chain broken: ${result?.problem || 'unknown problem'}${where}`);
      }
    } catch (error) {
      if (error.status !== 401) this.showActionError(`Could not verify: ${errorText(error)}`);
    } finally {
      button.disabled = false;
    }
  }

  // --- approvals -----------------------------------------------------------------------------

  syncApprovals() {
    const waits = this.record.status === 'running'
      ? (this.record.waiting ?? []).filter((w) => w.kind === 'approval')
      : [];
    const waiting = new Set(waits.map((w) => w.step_id));
    for (const [stepId, view] of this.approvals) {
      const visits = this.stepsById.get(stepId)?.visits ?? 0;
      const asksAgain = view.decided && waiting.has(stepId) && visits > view.visits;
      // A decided region stays to show its result until the step asks again.
      if ((!view.decided && !waiting.has(stepId)) || asksAgain) {
        view.region.remove();
        this.approvals.delete(stepId);
      }
    }
    waits.forEach((wait) => {
      if (!this.approvals.has(wait.step_id)) {
        // Numbered for the life of the page: a region that went away must not hand its ids on
        // to one that is still shown.
        this.approvalsMade = (this.approvalsMade ?? 0) + 1;
        const view = this.createApproval(wait, this.approvalsMade - 1);
        this.approvals.set(wait.step_id, view);
        this.approvalBox.append(view.region);
      }
    });
  }

  createApproval(wait, index) {
    const suffix = index ? `-${index + 1}` : '';
    const id = (name) => `${name}${suffix}`;
    const view = { decided: false, visits: this.stepsById.get(wait.step_id)?.visits ?? 0 };
    const title = h('h2', { id: id('approval-title') }, `Approval needed: ${wait.step_id}`);
    const about = h('div', { class: 'approval-about' }, h('p', { class: 'muted' }, 'Loading what it is about…'));
    const status = h('p', { id: id('approval-status'), class: 'status-message', role: 'status' });
    const alert = h('p', { id: id('approval-error'), class: 'alert', role: 'alert' });
    let controls;
    if (app.can('approve')) {
      const comment = h('textarea', { id: id('approval-comment'), name: 'comment', rows: '3' });
      const approve = h('button', { type: 'button', id: id('approve'), class: 'button-primary' }, 'Approve');
      const reject = h('button', { type: 'button', id: id('reject'), class: 'button-danger' }, 'Reject');
      controls = h('div', { class: 'approval-form' },
        h('div', { class: 'field' }, h('label', { for: id('approval-comment') }, 'Comment'), comment),
        h('div', { class: 'actions' }, approve, reject));
      const decide = async (approved) => {
        approve.disabled = true;
        reject.disabled = true;
        comment.disabled = true;
        setText(alert, '');
        try {
          const record = await api(`${apiRunPath(this.runId)}/approvals/${encodeURIComponent(wait.step_id)}`, {
            method: 'POST',
            body: { approved, comment: comment.value },
          });
          view.decided = true;
          view.visits = this.stepsById.get(wait.step_id)?.visits ?? view.visits;
          grid.hidden = true;
          setText(title, `Approval decided: ${wait.step_id}`);
          setText(status, approved ? 'Approved' : 'Rejected');
          if (comment.value.trim()) decidedNote.prepend(h('span', {}, `Comment: ${comment.value.trim()} `));
          decidedNote.hidden = false;
          view.region.classList.add(approved ? 'approved' : 'rejected');
          this.applyRecord(record);
          // The record may count the visit now; a later visit must ask again.
          view.visits = Math.max(view.visits, this.stepsById.get(wait.step_id)?.visits ?? 0);
        } catch (error) {
          if (error.status === 401) return;
          setText(alert, errorText(error));
          approve.disabled = false;
          reject.disabled = false;
          comment.disabled = false;
        }
      };
      approve.addEventListener('click', () => decide(true));
      reject.addEventListener('click', () => decide(false));
    } else {
      controls = h('p', { class: 'muted' }, 'You may see this approval but not decide it: your principal lacks the approve role.');
    }
    const grid = h('div', { class: 'approval-grid' }, about, controls);
    const dismiss = h('button', { type: 'button', class: 'button-quiet' }, 'Dismiss');
    const decidedNote = h('p', { class: 'approval-decided', hidden: true }, dismiss);
    dismiss.addEventListener('click', () => {
      view.region.remove();
      this.approvals.delete(wait.step_id);
      this.heading.focus();
    });
    view.region = h('section', {
      id: id('approval'), class: 'approval card', role: 'region', 'aria-labelledby': id('approval-title'),
      'data-step-id': wait.step_id,
    },
    title,
    h('p', { class: 'approval-message' }, wait.message || 'Approve this step?'),
    grid, status, decidedNote, alert);
    this.loadApprovalAbout(wait.step_id, about);
    return view;
  }

  async loadApprovalAbout(stepId, box) {
    try {
      const detail = await api(`${apiRunPath(this.runId)}/steps/${encodeURIComponent(stepId)}`);
      const approval = detail?.approval;
      if (!approval?.about) {
        box.replaceChildren();
        return;
      }
      box.parentElement?.classList.add('has-about');
      box.replaceChildren(
        h('h3', {}, `About ${approval.about}`),
        jsonBlock(approval.about_data ?? null, `Data of ${approval.about}`));
    } catch (error) {
      if (error.status !== 401) box.replaceChildren(h('p', { class: 'alert' }, `Could not load what it is about: ${errorText(error)}`));
    }
  }

  // --- the graph -----------------------------------------------------------------------------

  drawGraph(graph) {
    this.graph = graph;
    const width = Math.max(1, Number(graph.width) || 1);
    const height = Math.max(1, Number(graph.height) || 1);
    const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
    const edges = Array.isArray(graph.edges) ? graph.edges : [];
    const root = s('svg', {
      id: 'graph-svg', class: 'graph', viewBox: `0 0 ${width} ${height}`, role: 'group',
      'aria-labelledby': 'graph-title', 'aria-describedby': 'graph-hint', preserveAspectRatio: 'xMidYMin meet',
      // An svg clips what overflows it, which makes it a scroller to Chromium; a scroller with
      // no child in the Tab order takes a Tab stop itself, before the graph's step.
      tabindex: '-1',
    });
    root.append(s('defs', {},
      s('marker', { id: 'arrow', class: 'arrow', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' },
        s('path', { d: 'M0,0 L10,5 L0,10 z' })),
      s('marker', { id: 'arrow-error', class: 'arrow arrow-error', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' },
        s('path', { d: 'M0,0 L10,5 L0,10 z' })),
      s('pattern', { id: 'stripes', width: '8', height: '8', patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
        s('rect', { width: '8', height: '8', class: 'stripe-back' }),
        s('rect', { width: '3', height: '8', class: 'stripe-line' }))));

    // Drawn bottom up: the containers' backgrounds, the edges, then every box in the server's
    // document order (a container before what it holds). A container's own box is transparent,
    // so the edges inside it show through. The graph is one Tab stop (a 500-branch step would
    // otherwise be 500 of them before the panel): the arrow keys move between its steps.
    const backLayer = s('g', { class: 'container-backs', 'aria-hidden': 'true' });
    for (const node of nodes.filter((n) => n.container)) {
      backLayer.append(s('rect', {
        class: 'container-back', x: Number(node.x) || 0, y: Number(node.y) || 0,
        width: Math.max(20, Number(node.width) || 0), height: Math.max(20, Number(node.height) || 0), rx: 10,
      }));
    }
    const edgeLayer = s('g', { class: 'edges', 'aria-hidden': 'true' });
    for (const edge of edges) edgeLayer.append(this.createEdge(edge));
    const nodeLayer = s('g', { class: 'nodes' });
    for (const node of nodes) nodeLayer.append(this.createNode(node, Boolean(node.container)));
    root.append(backLayer, edgeLayer, nodeLayer);

    root.addEventListener('click', (event) => {
      const g = event.target.closest?.('.step');
      if (g) this.openPanel(g.dataset.stepId, { focus: true });
    });
    root.addEventListener('keydown', (event) => {
      const g = event.target.closest?.('.step');
      if (!g) return;
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.openPanel(g.dataset.stepId, { focus: true });
        return;
      }
      const next = this.stepFrom(g.dataset.stepId, event.key);
      if (next === undefined) return;
      event.preventDefault();
      if (next) this.focusStep(next);
    });
    root.addEventListener('focusin', (event) => {
      const g = event.target.closest?.('.step');
      if (g) this.setTabStop(g.dataset.stepId);
    });
    this.nodeOrder = nodes.map((node) => node.id).filter((id) => this.nodeViews.has(id));
    this.tabStop = null;
    this.setTabStop(this.panelStep ?? this.nodeOrder[0]);
    this.graphSize = { width, height };
    this.graphSvg = root;
    this.applyZoom();
    this.graphBox.replaceChildren(root);
  }

  /** Makes `stepId`'s node the graph's one Tab stop. */
  setTabStop(stepId) {
    if (!this.nodeViews.has(stepId) || stepId === this.tabStop) return;
    this.nodeViews.get(this.tabStop)?.g.setAttribute('tabindex', '-1');
    this.nodeViews.get(stepId).g.setAttribute('tabindex', '0');
    this.tabStop = stepId;
  }

  focusStep(stepId) {
    this.setTabStop(stepId);
    const g = this.nodeViews.get(stepId)?.g;
    g?.focus();
    g?.scrollIntoView?.({ block: 'nearest', inline: 'nearest' });
  }

  /**
   * Where `key` moves from `stepId`: Home and End to the first and last step, an arrow to the
   * nearest step that way (straight on counts more than sideways); null when there is none that
   * way, undefined for any other key.
   */
  stepFrom(stepId, key) {
    const order = this.nodeOrder ?? [];
    if (key === 'Home') return order[0] ?? null;
    if (key === 'End') return order[order.length - 1] ?? null;
    const ways = { ArrowDown: [0, 1], ArrowUp: [0, -1], ArrowRight: [1, 0], ArrowLeft: [-1, 0] };
    const way = ways[key];
    if (!way) return undefined;
    const centre = (id) => {
      const node = this.nodeViews.get(id);
      return [node.x + node.width / 2, node.y + node.height / 2];
    };
    const [fx, fy] = centre(stepId);
    let best = null;
    let bestScore = Infinity;
    for (const id of order) {
      if (id === stepId) continue;
      const [x, y] = centre(id);
      const ahead = (x - fx) * way[0] + (y - fy) * way[1];
      if (ahead <= 1) continue;
      const aside = Math.abs((x - fx) * way[1] + (y - fy) * way[0]);
      const score = ahead + 2 * aside;
      if (score < bestScore) {
        bestScore = score;
        best = id;
      }
    }
    return best;
  }

  toggleZoom() {
    const actual = this.zoomButton.getAttribute('aria-pressed') !== 'true';
    this.zoomButton.setAttribute('aria-pressed', String(actual));
    this.applyZoom();
  }

  /** Fit: as wide as the box, never wider than life, never so small the text is unreadable. */
  applyZoom() {
    if (!this.graphSvg) return;
    const { width, height } = this.graphSize;
    const actual = this.zoomButton.getAttribute('aria-pressed') === 'true';
    const style = this.graphSvg.style;
    style.aspectRatio = `${width} / ${height}`;
    if (actual) {
      style.width = `${width}px`;
      style.minWidth = '';
      style.maxWidth = 'none';
    } else {
      style.width = '100%';
      style.maxWidth = `${width}px`;
      style.minWidth = `${Math.min(width, Math.max(340, width * 0.35))}px`;
    }
  }

  createEdge(edge) {
    const points = (Array.isArray(edge.points) ? edge.points : [])
      .map((p) => [Number(p[0]), Number(p[1])])
      .filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    const kind = ['next', 'then', 'else', 'on_error', 'on_approve', 'on_reject'].includes(edge.kind) ? edge.kind : 'next';
    const g = s('g', { class: `edge edge-${kind}${edge.back ? ' edge-back' : ''}`, 'data-from': edge.from, 'data-to': edge.to });
    if (points.length < 2) return g;
    const d = points.map((p, i) => `${i ? 'L' : 'M'}${p[0]},${p[1]}`).join(' ');
    const marker = kind === 'on_error' || kind === 'on_reject' ? 'arrow-error' : 'arrow';
    g.append(s('path', { d, class: 'edge-line', 'marker-end': `url(#${marker})` }));
    if (edge.label) {
      const [x, y] = midpoint(points);
      g.append(s('text', { x, y: y + 4, class: 'edge-label', 'text-anchor': 'middle' }, edge.label));
    }
    return g;
  }

  createNode(node, container) {
    const x = Number(node.x) || 0;
    const y = Number(node.y) || 0;
    const width = Math.max(20, Number(node.width) || 180);
    const height = Math.max(20, Number(node.height) || 48);
    const kind = node.kind || 'step';
    const g = s('g', {
      class: `step kind-${/^[a-z_]+$/.test(kind) ? kind : 'step'}${container ? ' container' : ''}`,
      'data-step-id': node.id,
      'data-status': 'pending',
      tabindex: '-1',
      role: 'button',
      'aria-label': `${node.id}, ${kind}, pending`,
      'aria-controls': 'step-panel',
      transform: `translate(${x},${y})`,
    });
    const title = s('title', {}, '');
    const box = s('rect', { class: 'box', width, height, rx: container ? 10 : 7 });
    const name = node.label || node.id;
    const view = {
      g, title, kind, x, y, width, height, container, name, detail: node.detail || '', key: '',
      compact: !container && height < 44, statusRight: container || (kind === 'map' && height >= 44),
      statusText: null, itemsText: null, progress: null,
    };
    g.append(title, box);
    if (view.statusRight) {
      // The status on the right of the first line leaves the second to the items' progress.
      // A container's label sits in its top band: the layout leaves room above the children.
      const left = container ? 10 : 14;
      if (!container) g.append(s('rect', { class: 'accent', width: 5, height, rx: 2 }));
      view.statusText = s('text', { x: width - 10, y: container ? 18 : 19, class: 'status-text', 'text-anchor': 'end' }, 'pending');
      view.nameText = s('text', { x: left, y: container ? 18 : 19, class: 'node-title' }, name);
      view.itemsText = s('text', { x: left, y: container ? 33 : 36, class: 'node-detail' }, node.detail || kind);
      g.append(view.nameText, view.itemsText, view.statusText);
    } else if (view.compact) {
      // A branch among many (120 x 32): the id, then the status; the detail is in the tooltip.
      g.append(s('rect', { class: 'accent', width: 4, height, rx: 2 }));
      view.nameText = s('text', { x: 10, y: 14, class: 'node-title compact' }, name);
      view.itemsText = s('text', { x: 10, y: 27, class: 'node-detail compact' }, '');
      view.statusText = view.itemsText;
      g.append(view.nameText, view.itemsText);
    } else {
      // The id gets the whole first line; the status leads the second, then the detail.
      g.append(s('rect', { class: 'accent', width: 5, height, rx: 2 }));
      view.nameText = s('text', { x: 14, y: 19, class: 'node-title' }, name);
      view.statusText = s('tspan', { class: 'status-text' }, 'pending');
      view.itemsText = s('tspan', {}, '');
      g.append(view.nameText, s('text', { x: 14, y: 36, class: 'node-detail' }, view.statusText, view.itemsText));
    }
    if (kind === 'map') {
      // A bar along the bottom of the box: how many items are done.
      const left = container ? 10 : 14;
      view.progressWidth = Math.max(0, width - left - 10);
      view.progress = s('rect', { class: 'progress', x: left, y: height - 6, width: 0, height: 3, rx: 1.5 });
      g.append(s('rect', { class: 'progress-track', x: left, y: height - 6, width: view.progressWidth, height: 3, rx: 1.5 }), view.progress);
    }
    this.nodeViews.set(node.id, view);
    this.paintNode(view, { status: 'pending', visits: 0, items: null });
    return g;
  }

  /** Writes a node's status, visits and map items into its elements. */
  paintNode(view, step, children = null) {
    const status = step.status || 'pending';
    const items = itemsText(step.items) || childrenText(children);
    const key = `${status}|${step.visits}|${items}`;
    if (key === view.key) return;
    view.key = key;
    const { g, width, container } = view;
    g.setAttribute('data-status', status);
    g.setAttribute('aria-label', `${g.dataset.stepId}, ${view.kind}, ${status}`);
    const statusLabel = step.visits > 1 ? `${status} ×${step.visits}` : status;
    if (view.compact) {
      view.nameText.textContent = fitText(view.name, width - 16, 'compactTitle');
      view.itemsText.textContent = fitText([statusLabel, items].filter(Boolean).join(' · '), width - 16, 'small');
    } else if (view.statusRight) {
      const left = container ? 10 : 14;
      view.statusText.textContent = statusLabel;
      const statusWidth = textWidth(statusLabel, 'small') + 10;
      view.nameText.textContent = fitText(view.name, width - left - statusWidth - 8, 'title');
      // The items' count first and whole if it fits; the detail only in the room left.
      const room = width - left - 8;
      const both = [items, view.detail].filter(Boolean).join(' · ') || view.kind;
      view.itemsText.textContent = items && textWidth(both, 'detail') > room ? fitText(items, room, 'detail') : fitText(both, room, 'detail');
    } else {
      view.statusText.textContent = statusLabel;
      view.nameText.textContent = fitText(view.name, width - 24, 'title');
      const rest = [items, view.detail].filter(Boolean).join(' · ');
      const room = width - 22 - textWidth(statusLabel, 'small');
      view.itemsText.textContent = rest ? fitText(` · ${rest}`, room, 'detail') : '';
    }
    view.title.textContent = [
      `${view.name} (${view.kind})`, view.detail, `status: ${status}`,
      step.visits > 1 ? `visits: ${step.visits}` : '', itemsText(step.items, { running: true }) || items,
    ].filter(Boolean).join('\n');
    if (view.progress) {
      const count = Number(step.items?.count ?? 0);
      const settled = Number(step.items?.succeeded ?? 0) + Number(step.items?.failed ?? 0);
      view.progress.setAttribute('width', String(count ? (view.progressWidth * Math.min(settled, count)) / count : 0));
    }
  }

  updateNodes() {
    if (!this.nodeViews.size) return;
    const steps = this.record.steps ?? [];
    // A parallel step's box also says how its branches stand (500 boxes are hard to count).
    const children = new Map();
    for (const step of steps) {
      if (!step.parent) continue;
      const counts = children.get(step.parent) ?? {};
      counts[step.status] = (counts[step.status] ?? 0) + 1;
      children.set(step.parent, counts);
    }
    for (const step of steps) {
      const view = this.nodeViews.get(step.id);
      if (view) this.paintNode(view, step, view.container ? children.get(step.id) : null);
    }
  }

  // --- the step panel ------------------------------------------------------------------------

  renderPanel() {
    this.panelTitle = h('h2', { id: 'step-panel-title', tabindex: '-1' }, '');
    const close = h('button', { type: 'button', id: 'step-panel-close', class: 'button-quiet' }, 'Close');
    close.addEventListener('click', () => this.closePanel());
    this.panelMeta = h('p', { class: 'panel-meta' });
    this.outputPre = h('pre', { id: 'live-output', class: 'live-output', 'aria-live': 'off', tabindex: '0', 'aria-labelledby': 'live-output-title' });
    this.outputLabel = h('span', { class: 'muted' });
    this.outputBlock = h('div', { class: 'live-block', hidden: true },
      h('h3', { id: 'live-output-title' }, 'Live output'), this.outputLabel, this.outputPre);
    this.panelBody = h('div', { class: 'panel-body' });
    return h('section', { id: 'step-panel', class: 'step-panel card', role: 'region', 'aria-labelledby': 'step-panel-title', hidden: true },
      h('div', { class: 'panel-head' }, this.panelTitle, close),
      this.panelMeta, this.outputBlock, this.panelBody);
  }

  openPanel(stepId, { focus = true } = {}) {
    if (!stepId) return;
    const previous = this.panelStep;
    this.panelStep = stepId;
    this.nodeViews.get(previous)?.g.classList.remove('selected');
    this.nodeViews.get(stepId)?.g.classList.add('selected');
    this.setTabStop(stepId);
    this.panel.hidden = false;
    this.body.classList.add('with-panel');
    setText(this.panelTitle, stepId);
    if (previous !== stepId) {
      this.panelBody.replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
      this.showOutput(null);
    }
    this.renderPanelMeta();
    this.setStepParam(stepId);
    this.loadPanel();
    if (focus) this.panelTitle.focus();
    else if (previous !== stepId && window.matchMedia('(max-width: 900px)').matches && this.record) {
      // On phones the panel is below the graph: bring it into view.
      this.panel.scrollIntoView({ block: 'start', behavior: 'auto' });
    }
  }

  closePanel() {
    const stepId = this.panelStep;
    if (!stepId) return;
    this.panelStep = null;
    this.panelKey = '';
    this.panelSeq += 1;
    this.panel.hidden = true;
    this.body.classList.remove('with-panel');
    this.setStepParam(null);
    const view = this.nodeViews.get(stepId);
    view?.g.classList.remove('selected');
    if (view) view.g.focus();
    else this.heading.focus();
  }

  setStepParam(stepId) {
    const url = new URL(location.href);
    if (stepId) url.searchParams.set('step', stepId);
    else url.searchParams.delete('step');
    history.replaceState(null, '', url.pathname + url.search);
  }

  onKeydown(event) {
    if (event.key !== 'Escape' || !this.panelStep) return;
    const target = event.target;
    // Esc in a field outside the panel belongs to that field.
    if (target instanceof HTMLElement && target.matches('input, textarea, select') && !this.panel.contains(target)) return;
    event.preventDefault();
    this.closePanel();
  }

  renderPanelMeta() {
    const step = this.stepsById?.get(this.panelStep);
    if (!step) {
      this.panelMeta.replaceChildren(h('span', { class: 'muted' }, this.record ? 'Not a step of this run.' : ''));
      return;
    }
    const key = JSON.stringify([step.status, step.type, step.agent, step.visits, step.attempts, step.worker_id]);
    if (key !== this.panelMetaKey) {
      this.panelMetaKey = key;
      this.panelMeta.replaceChildren(
        badge(step.status), ' ',
        `${step.type} step`,
        step.agent ? ` · agent ${step.agent}` : '',
        ` · ${plural(step.visits ?? 0, 'visit')} · ${plural(step.attempts ?? 0, 'attempt')}`,
        step.worker_id ? ` · worker ${step.worker_id}` : '');
    }
    this.showOutput(undefined);
  }

  /** Shows the open step's live output: `null` redraws it, a string appends, undefined only toggles. */
  showOutput(appended) {
    const stepId = this.panelStep;
    const buffer = this.outputs.get(stepId);
    const status = this.stepsById?.get(stepId)?.status;
    const active = status === 'running' || status === 'retrying';
    this.outputBlock.hidden = !buffer && !active;
    if (this.outputBlock.hidden) return;
    const pre = this.outputPre;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.hidden = !buffer;
    if (appended === null) {
      pre.textContent = buffer?.text ?? '';
    } else if (typeof appended === 'string' && appended) {
      pre.append(appended);
    }
    setText(this.outputLabel, buffer
      ? `visit ${buffer.visit}, attempt ${buffer.attempt}${active ? ' · streaming' : ''}`
      : 'No output yet.');
    // Follow the stream unless the reader scrolled up to read.
    if (atBottom || appended === null) pre.scrollTop = pre.scrollHeight;
  }

  /** Fetches the open step's detail: one fetch in flight per step, one queued behind it. */
  async loadPanel() {
    const stepId = this.panelStep;
    if (!stepId) return;
    if (this.panelLoading === stepId) {
      this.panelQueued = true;
      return;
    }
    this.panelLoading = stepId;
    this.panelQueued = false;
    this.panelKey = this.stepKey(stepId);
    const seq = ++this.panelSeq;
    try {
      const detail = await api(`${apiRunPath(this.runId)}/steps/${encodeURIComponent(stepId)}`);
      if (!this.disposed && seq === this.panelSeq) this.renderPanelDetail(detail);
    } catch (error) {
      if (!this.disposed && seq === this.panelSeq && error.status !== 401) {
        this.panelBody.replaceChildren(h('p', { class: 'alert' }, `Could not load step ${stepId}: ${errorText(error)}`));
      }
    } finally {
      if (this.panelLoading === stepId) this.panelLoading = null;
      if (this.panelQueued && this.panelStep === stepId && !this.disposed) this.loadPanel();
    }
  }

  renderPanelDetail(detail) {
    const open = rememberOpen(this.panelBody);
    const focused = this.panelBody.contains(document.activeElement) ? document.activeElement : null;
    const focusedKey = focused?.closest('details[data-key]')?.dataset.key;
    const scrollTop = this.panel.scrollTop;
    const parts = [];
    if (detail.approval) {
      parts.push(h('section', { class: 'panel-section' },
        h('h3', {}, 'Approval'),
        h('p', {}, detail.approval.message || ''),
        detail.approval.about
          ? details('approval-about', `About ${detail.approval.about}`, jsonBlock(detail.approval.about_data ?? null, `Data of ${detail.approval.about}`), true)
          : null));
    }
    const visits = [...(Array.isArray(detail.visits) ? detail.visits : [])].reverse();
    if (!visits.length) parts.push(h('p', { class: 'muted' }, 'This step has not run yet.'));
    visits.forEach((visit, index) => {
      const duration = visit.started_ms && visit.finished_ms ? formatDuration(visit.finished_ms - visit.started_ms) : '';
      if (index === 0) {
        parts.push(h('section', { class: 'visit', 'aria-labelledby': `visit-${visit.visit}-title` },
          h('h3', { id: `visit-${visit.visit}-title` }, `Visit ${visit.visit}`, ' ', badge(visit.status)),
          this.visitBody(visit)));
      } else {
        parts.push(h('details', { class: 'visit', 'data-key': `visit-${visit.visit}` },
          h('summary', {}, `Visit ${visit.visit} `, badge(visit.status), duration ? ` ${duration}` : ''),
          this.visitBody(visit)));
      }
    });
    parts.push(
      h('section', { class: 'panel-section' }, h('h3', {}, 'Messages'), messageList(detail.messages)),
      h('section', { class: 'panel-section' }, h('h3', {}, 'Decisions'), decisionList(detail.decisions)),
      h('section', { class: 'panel-section' }, h('h3', {}, 'Handoff'), handoffList(detail.handoffs)));
    this.panelBody.replaceChildren(...parts);
    restoreOpen(this.panelBody, open);
    this.panel.scrollTop = scrollTop;
    // A redraw must not drop the reader's focus on the page's body.
    if (focused) {
      const again = focusedKey && [...this.panelBody.querySelectorAll('details[data-key]')]
        .find((el) => el.dataset.key === focusedKey)?.querySelector('summary');
      (again ?? this.panelTitle).focus({ preventScroll: true });
    }
  }

  visitBody(visit) {
    const key = `visit-${visit.visit}`;
    const started = visit.started_ms;
    const finished = visit.finished_ms;
    const attempts = Array.isArray(visit.attempts) ? visit.attempts : [];
    const usage = sumUsage(attempts.flatMap((a) => a.usage ?? []));
    return h('div', { class: 'visit-body' },
      h('dl', { class: 'summary compact' },
        h('div', {}, h('dt', {}, 'Status'), h('dd', {}, visit.status)),
        h('div', {}, h('dt', {}, 'Started'), h('dd', {}, timeElement(started))),
        h('div', {}, h('dt', {}, 'Finished'), h('dd', {}, timeElement(finished))),
        h('div', {}, h('dt', {}, 'Duration'), h('dd', {}, durationSoFar(started, finished))),
        usage.length ? h('div', {}, h('dt', {}, 'Tokens'), h('dd', {}, usageText(usage))) : null),
      visit.error ? h('p', { class: 'run-error' }, `Error: ${visit.error}`) : null,
      visit.payload !== null && visit.payload !== undefined
        ? details(`${key}-payload`, 'Payload', jsonBlock(visit.payload, `Payload of visit ${visit.visit}`), true)
        : null,
      visit.result !== null && visit.result !== undefined
        ? details(`${key}-result`, 'Result', jsonBlock(visit.result, `Result of visit ${visit.visit}`), true)
        : null,
      attempts.length ? this.attemptTable(attempts, visit.visit) : null);
  }

  attemptTable(attempts, visit) {
    return h('div', { class: 'table-scroll' }, h('table', { class: 'data-table attempts' },
      h('caption', {}, 'Attempts'),
      h('thead', {}, h('tr', {},
        ['Attempt', 'Worker', 'Started', 'Duration', 'Error', 'Tokens'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, attempts.map((a) => {
        const used = sumUsage(a.usage);
        const prompt = used.reduce((n, u) => n + u.prompt_tokens, 0);
        const completion = used.reduce((n, u) => n + u.completion_tokens, 0);
        return h('tr', { 'data-visit': visit, 'data-attempt': a.attempt },
          h('td', { class: 'num' }, a.attempt),
          h('td', { class: 'mono' }, a.worker_id || '—'),
          h('td', {}, a.started_ms
            ? h('time', { datetime: new Date(a.started_ms).toISOString() }, new Date(a.started_ms).toLocaleTimeString())
            : '—'),
          h('td', { class: 'num' }, durationSoFar(a.started_ms, a.finished_ms)),
          h('td', { class: a.error ? 'error-cell' : '' }, a.error || '—'),
          h('td', { class: 'num', title: usageText(used) }, used.length ? `${formatCount(prompt)} + ${formatCount(completion)}` : '—'));
      }))));
  }

  // --- memory --------------------------------------------------------------------------------

  renderMemory({ force = false } = {}) {
    const record = this.record;
    const messages = Array.isArray(record.messages) ? record.messages : [];
    const decisions = Array.isArray(record.decisions) ? record.decisions : [];
    const handoffs = Array.isArray(record.handoffs) ? record.handoffs : [];
    // The state chain's head changes with every transition, so memory is redrawn only then.
    const key = [record.state_sha256, messages.length, decisions.length, handoffs.length, this.showAllMessages].join('|');
    if (key === this.memoryKey) return;
    // Not under the reader's focus: redrawn when it leaves.
    if (!force && this.memory.contains(document.activeElement)) {
      if (!this.memoryDeferred) {
        this.memoryDeferred = true;
        this.memory.addEventListener('focusout', () => {
          this.memoryDeferred = false;
          setTimeout(() => !this.disposed && this.renderMemory(), 0);
        }, { once: true });
      }
      return;
    }
    this.memoryKey = key;
    const open = rememberOpen(this.memory);
    let shown = messages;
    let more = null;
    if (!this.showAllMessages && messages.length > MESSAGES_SHOWN) {
      shown = messages.slice(-MESSAGES_SHOWN);
      more = h('button', { type: 'button', class: 'button-quiet' }, `Show all ${formatCount(messages.length)} messages`);
      more.addEventListener('click', () => {
        this.showAllMessages = true;
        this.renderMemory({ force: true });
        this.memory.querySelector('#memory-messages')?.setAttribute('tabindex', '-1');
        this.memory.querySelector('#memory-messages')?.focus();
      });
    }
    const context = details('context', 'Context (what the next agent sees)', null);
    // The context can be large: it is built when opened, not on every transition.
    const fillContext = () => {
      if (context.open && !context.querySelector('pre')) context.append(jsonBlock(this.record.context ?? null, 'Run context'));
    };
    context.addEventListener('toggle', fillContext);
    this.memory.replaceChildren(
      h('h2', { id: 'memory-title' }, 'Memory'),
      h('p', { class: 'hint' }, 'What the agents handed on to each other: the shared message history, the decisions they recorded, and the handoff record each agent step received.'),
      h('div', { class: 'memory-grid' },
        h('section', { class: 'card', 'aria-labelledby': 'memory-messages' },
          h('h3', { id: 'memory-messages' }, `Messages (${formatCount(messages.length)})`),
          more ? h('p', { class: 'muted' }, `The last ${formatCount(MESSAGES_SHOWN)} are shown. `, more) : null,
          messageList(shown)),
        h('div', { class: 'memory-side' },
          h('section', { class: 'card', 'aria-labelledby': 'memory-decisions' },
            h('h3', { id: 'memory-decisions' }, `Decisions (${formatCount(decisions.length)})`),
            decisionList(decisions)),
          h('section', { class: 'card', 'aria-labelledby': 'memory-handoffs' },
            h('h3', { id: 'memory-handoffs' }, `Handoffs (${formatCount(handoffs.length)})`),
            handoffList(handoffs)))),
      h('section', { class: 'card', 'aria-labelledby': 'memory-usage' },
        h('h3', { id: 'memory-usage' }, 'Token usage'),
        usageTable(record.usage, 'Token usage of the run')),
      context);
    restoreOpen(this.memory, open);
    fillContext();
  }
}

app.start();
