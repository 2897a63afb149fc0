// What a step's detail (`/api/runs/<id>/steps/<step>`) shows in its panel: its approval, each
// visit (the latest open, older ones folded) with its payload, result and attempts, and the
// messages, decisions and handoff it took part in.

import { details, h } from './dom.js';
import { durationSoFar, formatCount, formatDuration, sumUsage, usageText } from './format.js';
import { decisionList, handoffList, messageList } from './memory_views.js';
import { badge, jsonBlock, timeElement } from './widgets.js';

/** The panel's body for `detail`, as a list of elements. */
export function stepDetailParts(detail) {
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
        visitBody(visit)));
    } else {
      parts.push(h('details', { class: 'visit', 'data-key': `visit-${visit.visit}` },
        h('summary', {}, `Visit ${visit.visit} `, badge(visit.status), duration ? ` ${duration}` : ''),
        visitBody(visit)));
    }
  });
  parts.push(
    h('section', { class: 'panel-section' }, h('h3', {}, 'Messages'), messageList(detail.messages)),
    h('section', { class: 'panel-section' }, h('h3', {}, 'Decisions'), decisionList(detail.decisions)),
    h('section', { class: 'panel-section' }, h('h3', {}, 'Handoff'), handoffList(detail.handoffs)));
  return parts;
}

function visitBody(visit) {
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
    attempts.length ? attemptTable(attempts, visit.visit) : null);
}

function attemptTable(attempts, visit) {
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
