// The runs list: filtered by status and workflow, paged by cursor, read again every REFRESH_MS
// while the tab is visible.

import { api, errorText } from './api.js';
import { PAGE_SIZE, REFRESH_MS, RUN_STATUSES } from './config.js';
import { h, setText } from './dom.js';
import { formatClock, formatDuration, plural, runDuration } from './format.js';
import { Page } from './page.js';
import { groupWaits, waitClass, waitingText } from './waits.js';
import { badge, setBadge, timeElement } from './widgets.js';

function runPath(runId) {
  return `/runs/${encodeURIComponent(runId)}`;
}

export class RunsPage extends Page {
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
