// What a run is at a glance: its status badge, the summary (workflow, start, duration, who
// submitted it, its state, tokens, a link to its trace), its error, and what it waits for
// other than approvals (those have regions of their own, see approvals.js).

import { details, h, rememberOpen, restoreOpen, setText } from './dom.js';
import { formatCount, formatDuration, runDuration, sumUsage, usageText } from './format.js';
import { groupWaits, waitClass, waitingText } from './waits.js';
import { setBadge, timeElement } from './widgets.js';

function safeHttpUrl(text) {
  try {
    const url = new URL(text, location.href);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

export class RunSummary {
  constructor({ session }) {
    this.session = session;
    this.record = null;
    this.statusBadge = h('span', { id: 'run-status' }, '');
    this.summary = h('dl', { id: 'run-summary', class: 'summary' });
    this.runError = h('p', { id: 'run-error', class: 'run-error', hidden: true });
    this.waitingBox = h('div', { id: 'run-waiting', class: 'waiting', hidden: true });
  }

  update(record) {
    this.record = record;
    this.renderHeader();
    this.renderWaiting();
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
    const template = this.session?.traceUrl;
    if (template && record.trace_id) {
      const href = safeHttpUrl(String(template).replaceAll('{trace_id}', encodeURIComponent(record.trace_id)));
      if (href) rows.push(['Trace', h('a', { id: 'run-trace', href, rel: 'noopener noreferrer', target: '_blank' }, 'Trace', h('span', { class: 'visually-hidden' }, ' (opens in a new tab)'))]);
    }
    const key = JSON.stringify([record.workflow_id, record.created_ms, record.submitted_by, record.state_sha256, usage, record.trace_id, template]);
    if (key !== this.headerKey) {
      this.headerKey = key;
      this.summary.replaceChildren(...rows.map(([term, value]) => h('div', {}, h('dt', {}, term), h('dd', {}, value))));
    } else {
      this.tick();
    }
    this.runError.hidden = !record.error;
    setText(this.runError, record.error ? `Error: ${record.error}` : '');
  }

  /** Brings a running run's duration up to now. */
  tick() {
    const el = this.summary.querySelector('#run-duration');
    if (el && this.record) setText(el, formatDuration(runDuration(this.record)));
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
}
