// What may be done to a run from its page: cancel it (with a reason, asked in a small form),
// retry it, verify its state chain; and the lines that say how that went. The buttons shown
// are those the session may use on the run's status.

import { api, apiRunPath, errorText } from './api.js';
import { h, setText } from './dom.js';
import { plural } from './format.js';

export class RunActions {
  /**
   * `onRecord(record)` gets the record an action answers with; `focusHeading()` moves focus to
   * the page's heading once an action changed the run.
   */
  constructor({ runId, session, onRecord, focusHeading }) {
    this.runId = runId;
    this.session = session;
    this.onRecord = onRecord;
    this.focusHeading = focusHeading;
    this.buttons = h('div', { id: 'run-actions', class: 'actions', role: 'group', 'aria-label': 'Run actions' });
    this.status = h('p', { id: 'action-status', class: 'status-message', role: 'status' });
    this.error = h('p', { id: 'action-error', class: 'alert', role: 'alert' });
    this.cancelForm = this.renderCancelForm();
  }

  renderCancelForm() {
    this.cancelReason = h('input', { id: 'cancel-reason', name: 'reason', type: 'text', autocomplete: 'off' });
    this.cancelConfirm = h('button', { type: 'submit', id: 'cancel-confirm', class: 'button-danger' }, 'Stop the run');
    const dismiss = h('button', { type: 'button', id: 'cancel-dismiss' }, 'Keep running');
    const form = h('form', { id: 'cancel-form', class: 'inline-form card', hidden: true },
      h('div', { class: 'field grow' }, h('label', { for: 'cancel-reason' }, 'Reason'), this.cancelReason),
      this.cancelConfirm, dismiss);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.cancelRun();
    });
    dismiss.addEventListener('click', () => this.hideCancelForm(true));
    return form;
  }

  /** Shows the buttons `record` calls for. */
  update(record) {
    const wanted = [];
    if (record.status === 'running' && this.session.mayChange(record)) wanted.push('cancel');
    if (record.status === 'failed' && this.session.mayChange(record)) wanted.push('retry');
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
    const focusedId = this.buttons.contains(document.activeElement) ? document.activeElement.id : null;
    this.buttons.replaceChildren(...buttons);
    if (focusedId) (document.getElementById(focusedId) ?? verify).focus();
  }

  showActionStatus(text) {
    setText(this.error, '');
    setText(this.status, text);
  }

  showActionError(text) {
    setText(this.status, '');
    setText(this.error, text);
  }

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
      this.onRecord(record);
      this.focusHeading();
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
      this.onRecord(record);
      this.focusHeading();
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
}
