// The run's approvals: one region per step that waits for a decision, with what it is about and,
// for a principal with the approve role, a comment and the Approve and Reject buttons. A decided
// region stays to show its result until dismissed or until its step asks again.

import { api, apiRunPath, errorText } from './api.js';
import { h, setText } from './dom.js';
import { jsonBlock } from './widgets.js';

export class Approvals {
  /**
   * `onRecord(record)` gets the record a decision answers with; `focusHeading()` moves focus to
   * the page's heading when a region it was in goes away.
   */
  constructor({ runId, session, onRecord, focusHeading }) {
    this.runId = runId;
    this.session = session;
    this.onRecord = onRecord;
    this.focusHeading = focusHeading;
    this.stepsById = new Map();
    this.approvals = new Map(); // step id -> the approval region
    this.approvalsMade = 0;
    this.element = h('div', { class: 'approvals' });
  }

  /** Shows a region for each approval `record` waits for; `stepsById` holds its steps. */
  update(record, stepsById) {
    this.stepsById = stepsById;
    const waits = record.status === 'running'
      ? (record.waiting ?? []).filter((w) => w.kind === 'approval')
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
        this.approvalsMade += 1;
        const view = this.createApproval(wait, this.approvalsMade - 1);
        this.approvals.set(wait.step_id, view);
        this.element.append(view.region);
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
    if (this.session.can('approve')) {
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
          this.onRecord(record);
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
      this.focusHeading();
    });
    view.region = h('section', {
      id: id('approval'), class: 'approval card', role: 'region', 'aria-labelledby': id('approval-title'),
      'data-step-id': wait.step_id,
    },
    title,
    h('p', { class: 'approval-message' }, wait.message || 'Approve this step?'),
    grid, status, decidedNote, alert);
    this.loadAbout(wait.step_id, about);
    return view;
  }

  async loadAbout(stepId, box) {
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
}
