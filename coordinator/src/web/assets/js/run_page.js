// One run's page (`/runs/<id>`): puts together its parts and passes the run's record to each.
// The parts draw their own corner and speak to the page only through the callbacks they are
// made with: RunSummary (status, summary, waits), RunActions (cancel, retry, verify), Approvals,
// RunGraph (the workflow), StepPanel (one step, with its LiveOutput), Memory, and RunLive (the
// event stream and polling, which bring new records).

import { api, apiRunPath, errorText } from './api.js';
import { Approvals } from './approvals.js';
import { h } from './dom.js';
import { RunGraph } from './graph.js';
import { LiveOutput } from './live_output.js';
import { Memory } from './memory.js';
import { Page } from './page.js';
import { RunActions } from './run_actions.js';
import { RunLive } from './run_live.js';
import { RunSummary } from './run_summary.js';
import { StepPanel } from './step_panel.js';

export class RunPage extends Page {
  constructor(root, runId, session) {
    super();
    this.root = root;
    this.runId = runId;
    this.record = null;
    const onRecord = (record) => this.applyRecord(record);
    const focusHeading = () => this.heading.focus();
    this.summary = new RunSummary({ session });
    this.actions = new RunActions({ runId, session, onRecord, focusHeading });
    this.approvals = new Approvals({ runId, session, onRecord, focusHeading });
    this.graph = new RunGraph({ onOpen: (stepId) => this.openStep(stepId, { focus: true }) });
    this.output = new LiveOutput();
    this.panel = new StepPanel({ runId, output: this.output, requestClose: () => this.closeStep() });
    this.memory = new Memory();
    this.live = new RunLive({
      runId,
      status: () => this.record?.status,
      onRecord,
      onStepEvent: (stepId) => this.panel.invalidate(stepId),
      onOutput: (piece) => this.showOutput(piece),
      onOutputMissed: (pieces) => this.output.missed(pieces),
      onTick: () => this.summary.tick(),
    });
    document.title = `Run ${runId} — Baton`;
    this.renderShell(root);
    this.listen(document, 'keydown', (event) => this.panel.onKeydown(event));
    this.listen(document, 'visibilitychange', () => {
      if (!document.hidden) this.live.resume();
    });
    this.load();
  }

  dispose() {
    super.dispose();
    this.live.dispose();
    this.panel.dispose();
    this.memory.dispose();
  }

  renderShell(root) {
    this.heading = h('h1', { id: 'run-title', tabindex: '-1' }, 'Run ', h('span', { class: 'mono' }, this.runId));
    this.body = h('div', { class: 'run-body' },
      h('section', { class: 'graph-section card', 'aria-labelledby': 'graph-title' },
        h('div', { class: 'section-head' },
          h('h2', { id: 'graph-title' }, 'Workflow'),
          h('p', { id: 'graph-hint', class: 'hint' }, 'Select a step to see what it received, returned and handed on (arrow keys move between steps, Enter opens one).'),
          this.graph.zoomButton),
        this.graph.legend(),
        this.graph.box,
        this.output.missedNote),
      this.panel.element);
    root.replaceChildren(
      h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('ol', {},
        h('li', {}, h('a', { href: '/', 'data-route': '' }, 'Runs')),
        h('li', { 'aria-current': 'page' }, this.runId))),
      h('div', { class: 'run-head' }, h('div', { class: 'run-title' }, this.heading, this.summary.statusBadge), this.actions.buttons),
      this.actions.cancelForm,
      this.actions.status,
      this.actions.error,
      this.live.error,
      this.summary.summary,
      this.summary.runError,
      this.summary.waitingBox,
      this.approvals.element,
      this.body,
      this.memory.element);
  }

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
      this.graph.draw(graph.value, this.panel.stepId);
    } else if (graph.reason.status !== 401) {
      this.graph.showError(`Could not load the graph: ${errorText(graph.reason)}`);
    }
    this.applyRecord(record.value, { force: true });
    const step = new URLSearchParams(location.search).get('step');
    if (step) this.openStep(step, { focus: false });
    if (this.record.status === 'running') this.live.start();
  }

  showLoadError(error) {
    const notFound = error.status === 404;
    document.title = `${notFound ? 'Run not found' : 'Run unavailable'} — Baton`;
    this.heading = h('h1', { id: 'run-title', tabindex: '-1' }, notFound ? 'Run not found' : `Run ${this.runId}`);
    this.root.replaceChildren(
      h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('ol', {}, h('li', {}, h('a', { href: '/', 'data-route': '' }, 'Runs')))),
      this.heading,
      h('p', { class: 'alert', role: 'alert' }, errorText(error)),
      h('p', {}, h('a', { href: '/', 'data-route': '' }, 'See all runs')));
  }

  /** Shows `record` in every part, and follows the run while it runs. */
  applyRecord(record, { force = false } = {}) {
    if (this.disposed || !record) return;
    // A slower fetch must not undo what a faster one (or an action's answer) showed.
    if (!force && this.record && Number(record.updated_ms) < Number(this.record.updated_ms)) return;
    const wasRunning = this.record?.status === 'running';
    this.record = record;
    const stepsById = new Map((record.steps ?? []).map((step) => [step.id, step]));
    this.summary.update(record);
    this.actions.update(record);
    this.approvals.update(record, stepsById);
    this.graph.update(record.steps ?? []);
    this.memory.update(record);
    this.panel.update(record, stepsById);
    if (record.status === 'running') {
      if (!wasRunning && !force) this.live.start();
    } else {
      this.live.stop();
      // A failed run may be retried from another page or the CLI: look now and then.
      if (record.status === 'failed') this.live.watchForRetry();
    }
  }

  openStep(stepId, { focus = true } = {}) {
    if (!stepId) return;
    this.graph.select(stepId);
    this.body.classList.add('with-panel');
    this.panel.open(stepId, { focus });
  }

  closeStep() {
    const stepId = this.panel.close();
    if (!stepId) return;
    this.body.classList.remove('with-panel');
    this.graph.select(null);
    if (!this.graph.focusNode(stepId)) this.heading.focus();
  }

  showOutput(piece) {
    const change = this.output.append(piece);
    if (change && this.panel.stepId === change.stepId) this.panel.showOutput(change.appended);
  }
}
