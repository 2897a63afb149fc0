// The step panel: one step of the run, opened from the graph (its id also in the page's URL as
// `?step=`), with its status line, its live output while it runs, and its detail, fetched again
// whenever the step changes. Esc or Close asks the page to close it.

import { api, apiRunPath, errorText } from './api.js';
import { h, rememberOpen, restoreOpen, setText } from './dom.js';
import { plural } from './format.js';
import { stepDetailParts } from './step_detail.js';
import { badge } from './widgets.js';

export class StepPanel {
  /** `output` is the run's LiveOutput; `requestClose()` is called when the reader closes the panel. */
  constructor({ runId, output, requestClose }) {
    this.runId = runId;
    this.output = output;
    this.requestClose = requestClose;
    this.disposed = false;
    this.record = null;
    this.stepsById = null;
    this.stepId = null; // the open step
    this.key = ''; // what the shown detail was fetched for (see stepKey); '' fetches it again
    this.seq = 0;
    this.title = h('h2', { id: 'step-panel-title', tabindex: '-1' }, '');
    const close = h('button', { type: 'button', id: 'step-panel-close', class: 'button-quiet' }, 'Close');
    close.addEventListener('click', () => this.requestClose());
    this.meta = h('p', { class: 'panel-meta' });
    this.body = h('div', { class: 'panel-body' });
    this.element = h('section', { id: 'step-panel', class: 'step-panel card', role: 'region', 'aria-labelledby': 'step-panel-title', hidden: true },
      h('div', { class: 'panel-head' }, this.title, close),
      this.meta, output.block, this.body);
  }

  dispose() {
    this.disposed = true;
  }

  /** Takes the run's latest record; an open step whose state changed is fetched again. */
  update(record, stepsById) {
    this.record = record;
    this.stepsById = stepsById;
    if (this.stepId) {
      const key = this.stepKey(this.stepId);
      if (key !== this.key) this.load();
      this.renderMeta();
    }
  }

  /** An event about `stepId`: if it is open, its detail changed even if its status did not. */
  invalidate(stepId) {
    if (this.stepId && stepId === this.stepId) this.key = '';
  }

  open(stepId, { focus = true } = {}) {
    const previous = this.stepId;
    this.stepId = stepId;
    this.element.hidden = false;
    setText(this.title, stepId);
    if (previous !== stepId) {
      this.body.replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
      this.showOutput(null);
    }
    this.renderMeta();
    setStepParam(stepId);
    this.load();
    if (focus) this.title.focus();
    else if (previous !== stepId && window.matchMedia('(max-width: 900px)').matches && this.record) {
      // On phones the panel is below the graph: bring it into view.
      this.element.scrollIntoView({ block: 'start', behavior: 'auto' });
    }
  }

  /** Closes the panel; returns the step that was open (null if none was). */
  close() {
    const stepId = this.stepId;
    if (!stepId) return null;
    this.stepId = null;
    this.key = '';
    this.seq += 1;
    this.element.hidden = true;
    setStepParam(null);
    return stepId;
  }

  onKeydown(event) {
    if (event.key !== 'Escape' || !this.stepId) return;
    const target = event.target;
    // Esc in a field outside the panel belongs to that field.
    if (target instanceof HTMLElement && target.matches('input, textarea, select') && !this.element.contains(target)) return;
    event.preventDefault();
    this.requestClose();
  }

  /** Shows the open step's live output: `null` redraws it, a string appends, undefined only toggles. */
  showOutput(appended) {
    this.output.show(this.stepId, this.stepsById?.get(this.stepId)?.status, appended);
  }

  stepKey(stepId) {
    const step = this.stepsById?.get(stepId);
    if (!step) return '';
    return [step.status, step.visits, step.attempts, step.error ?? '', JSON.stringify(step.items ?? null)].join('|');
  }

  renderMeta() {
    const step = this.stepsById?.get(this.stepId);
    if (!step) {
      this.meta.replaceChildren(h('span', { class: 'muted' }, this.record ? 'Not a step of this run.' : ''));
      return;
    }
    const key = JSON.stringify([step.status, step.type, step.agent, step.visits, step.attempts, step.worker_id]);
    if (key !== this.metaKey) {
      this.metaKey = key;
      this.meta.replaceChildren(
        badge(step.status), ' ',
        `${step.type} step`,
        step.agent ? ` · agent ${step.agent}` : '',
        ` · ${plural(step.visits ?? 0, 'visit')} · ${plural(step.attempts ?? 0, 'attempt')}`,
        step.worker_id ? ` · worker ${step.worker_id}` : '');
    }
    this.showOutput(undefined);
  }

  /** Fetches the open step's detail: one fetch in flight per step, one queued behind it. */
  async load() {
    const stepId = this.stepId;
    if (!stepId) return;
    if (this.loading === stepId) {
      this.queued = true;
      return;
    }
    this.loading = stepId;
    this.queued = false;
    this.key = this.stepKey(stepId);
    const seq = ++this.seq;
    try {
      const detail = await api(`${apiRunPath(this.runId)}/steps/${encodeURIComponent(stepId)}`);
      if (!this.disposed && seq === this.seq) this.renderDetail(detail);
    } catch (error) {
      if (!this.disposed && seq === this.seq && error.status !== 401) {
        this.body.replaceChildren(h('p', { class: 'alert' }, `Could not load step ${stepId}: ${errorText(error)}`));
      }
    } finally {
      if (this.loading === stepId) this.loading = null;
      if (this.queued && this.stepId === stepId && !this.disposed) this.load();
    }
  }

  renderDetail(detail) {
    const open = rememberOpen(this.body);
    const focused = this.body.contains(document.activeElement) ? document.activeElement : null;
    const focusedKey = focused?.closest('details[data-key]')?.dataset.key;
    const scrollTop = this.element.scrollTop;
    this.body.replaceChildren(...stepDetailParts(detail));
    restoreOpen(this.body, open);
    this.element.scrollTop = scrollTop;
    // A redraw must not drop the reader's focus on the page's body.
    if (focused) {
      const again = focusedKey && [...this.body.querySelectorAll('details[data-key]')]
        .find((el) => el.dataset.key === focusedKey)?.querySelector('summary');
      (again ?? this.title).focus({ preventScroll: true });
    }
  }
}

function setStepParam(stepId) {
  const url = new URL(location.href);
  if (stepId) url.searchParams.set('step', stepId);
  else url.searchParams.delete('step');
  history.replaceState(null, '', url.pathname + url.search);
}
