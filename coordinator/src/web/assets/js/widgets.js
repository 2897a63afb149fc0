// Small pieces both pages show: a status badge, a time, a block of JSON.

import { JSON_PREVIEW_CHARS, STEP_STATUSES } from './config.js';
import { h, setText } from './dom.js';
import { formatCount, formatDateTime, prettyJson } from './format.js';

function knownStatus(status, known) {
  return known.includes(status) ? status : 'unknown';
}

/** A status as text in a coloured badge: the colour is never the only cue. */
export function badge(status, extraClass = '') {
  const el = h('span', {});
  setBadge(el, status, extraClass);
  return el;
}

export function setBadge(el, status, extraClass = '') {
  const known = knownStatus(status, STEP_STATUSES);
  const cls = `badge status-${known}${extraClass ? ` ${extraClass}` : ''}`;
  if (el.getAttribute('class') !== cls) el.setAttribute('class', cls);
  setText(el, status || 'unknown');
}

export function timeElement(ms) {
  if (!ms) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: new Date(ms).toISOString() }, formatDateTime(ms));
}

/** Pretty JSON in a <pre>, cut at JSON_PREVIEW_CHARS with a button that shows the rest. */
export function jsonBlock(value, label) {
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
