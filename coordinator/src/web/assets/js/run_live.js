// Keeping a run's page current: the run's event stream (SSE) while it runs, polling while the
// stream is down, a slower look now and then for what no event tells, and a failed run watched
// for a retry from elsewhere. Whatever it learns goes to the page through the callbacks it was
// made with; it draws nothing but its own error line.

import { api, apiRunPath, errorText, token } from './api.js';
import { FAILED_REFRESH_MS, MAX_RECONNECT_MS, REFRESH_MS, TASK_STATE_REFRESH_MS } from './config.js';
import { h, setText } from './dom.js';

const STEP_EVENTS = ['step_started', 'step_finished', 'approval_requested', 'map_progress', 'message'];

export class RunLive {
  /**
   * `status()` says the run's status as the page shows it; `onRecord(record)` gets each record
   * read; `onStepEvent(stepId)` is told of an event about a step before the record is read
   * again; `onOutput(piece)` and `onOutputMissed(pieces)` get the live output; `onTick()` is
   * called every second while the run is followed.
   */
  constructor({ runId, status, onRecord, onStepEvent, onOutput, onOutputMissed, onTick }) {
    this.runId = runId;
    this.status = status;
    this.onRecord = onRecord;
    this.onStepEvent = onStepEvent;
    this.onOutput = onOutput;
    this.onOutputMissed = onOutputMissed;
    this.onTick = onTick;
    this.error = h('p', { id: 'refresh-error', class: 'alert', role: 'alert' });
    this.disposed = false;
    this.fetching = false;
    this.refreshQueued = false;
    this.stream = null;
    this.pollTimer = 0;
    this.polling = false;
    this.reconnectTimer = 0;
    this.reconnectDelay = 2000;
    this.tickTimer = 0;
  }

  dispose() {
    this.disposed = true;
    this.stopStream();
    this.stopPolling();
    clearTimeout(this.reconnectTimer);
    clearInterval(this.tickTimer);
    clearInterval(this.taskStateTimer);
    clearInterval(this.retryTimer);
  }

  /** Follows a running run. */
  start() {
    clearInterval(this.retryTimer);
    this.startStream();
    clearInterval(this.tickTimer);
    this.tickTimer = setInterval(() => this.onTick(), 1000);
    clearInterval(this.taskStateTimer);
    this.taskStateTimer = setInterval(() => {
      if (!document.hidden && this.status() === 'running') this.scheduleRefresh();
    }, TASK_STATE_REFRESH_MS);
  }

  /** The run ended: nothing more to follow. */
  stop() {
    this.stopStream();
    this.stopPolling();
    clearTimeout(this.reconnectTimer);
    clearInterval(this.tickTimer);
    clearInterval(this.taskStateTimer);
  }

  /** A failed run may be retried from another page or the CLI: look now and then. */
  watchForRetry() {
    clearInterval(this.retryTimer);
    this.retryTimer = setInterval(() => {
      if (!document.hidden && this.status() === 'failed') this.scheduleRefresh();
    }, FAILED_REFRESH_MS);
  }

  /** The tab is visible again: a poll that waited for it goes now. */
  resume() {
    if (this.polling) this.poll();
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
    for (const name of STEP_EVENTS) {
      stream.addEventListener(name, (event) => {
        this.onStepEvent(parse(event)?.step_id);
        this.scheduleRefresh();
      });
    }
    stream.addEventListener('step_output', (event) => {
      const data = parse(event);
      if (data) this.onOutput(data);
    });
    stream.addEventListener('output_missed', (event) => {
      const data = parse(event);
      this.onOutputMissed(Number(data?.pieces ?? 0));
    });
    stream.addEventListener('run_finished', (event) => {
      const data = parse(event);
      this.stopStream();
      if (data?.record) this.onRecord(data.record);
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
      if (this.disposed || this.status() !== 'running') return;
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
        setText(this.error, '');
        this.onRecord(record);
      })
      .catch((error) => {
        if (error.status !== 401 && !this.disposed) setText(this.error, `Could not refresh the run: ${errorText(error)}`);
      })
      .finally(() => {
        this.fetching = false;
        if (this.refreshQueued) {
          this.refreshQueued = false;
          this.scheduleRefresh();
        }
      });
  }
}
