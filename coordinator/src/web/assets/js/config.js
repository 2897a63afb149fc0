// What the pages are tuned by: how often they look again, how much they show at once, and the
// statuses they know. Kept together so a change of pace is made (and reviewed) in one place.

export const REFRESH_MS = 2000;
export const PAGE_SIZE = 50;
export const RUN_STATUSES = ['running', 'succeeded', 'failed', 'cancelled'];
export const STEP_STATUSES = [
  'pending', 'queued', 'running', 'retrying', 'waiting',
  'succeeded', 'failed', 'rejected', 'cancelled', 'redriven',
];
// Big JSON (a payload carries the whole message history) is cut in the page until asked for:
// a few megabytes of text in one <pre> makes the panel sluggish.
export const JSON_PREVIEW_CHARS = 60_000;
// Live output kept per step: an LLM can stream for long; the stored result is whole anyway.
export const LIVE_OUTPUT_CHARS = 200_000;
export const MESSAGES_SHOWN = 200;
// Stream reconnects back off up to this; polling covers the gap meanwhile.
export const MAX_RECONNECT_MS = 60_000;
// A running run is read again this often even while its stream is up: a task taken by a worker
// of another coordinator (queued to running, a retry) changes no version of the run, so no
// event tells it; the record, read from the store, does.
export const TASK_STATE_REFRESH_MS = 3_000;
// How often a failed run's page looks whether it was retried elsewhere.
export const FAILED_REFRESH_MS = 10_000;
