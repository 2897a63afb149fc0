// How what agents hand on to each other reads: messages, decisions, handoffs and token usage.
// The step panel shows a step's, the memory section the whole run's.

import { details, h } from './dom.js';
import { formatCount, formatTimestamp, sumUsage } from './format.js';
import { jsonBlock } from './widgets.js';

/** A message's content: text as text, LangChain-style text parts joined, anything else JSON. */
function contentBlock(content) {
  if (typeof content === 'string') return h('p', { class: 'message-text' }, content);
  if (Array.isArray(content) && content.every((p) => p && p.type === 'text' && typeof p.text === 'string')) {
    return h('p', { class: 'message-text' }, content.map((p) => p.text).join('\n'));
  }
  return jsonBlock(content, 'Message content');
}

/** `<step>#<visit>/<n>`: the id a message gets when its agent gave none. */
function messageOrigin(id) {
  const match = /^(.+)#(\d+)\/\d+$/.exec(String(id ?? ''));
  return match ? { step: match[1], visit: Number(match[2]) } : null;
}

export function messageList(messages) {
  if (!messages?.length) return h('p', { class: 'muted' }, 'No messages.');
  return h('ol', { class: 'messages' }, messages.map((m) => {
    const origin = messageOrigin(m.id);
    return h('li', { class: 'message' },
      h('div', { class: 'message-head' },
        h('span', { class: `role role-${/^[a-z]+$/.test(m.role) ? m.role : 'other'}` }, m.role ?? '?'),
        m.name ? h('strong', {}, m.name) : null,
        origin ? h('span', { class: 'muted' }, `step ${origin.step}, visit ${origin.visit}`) : null,
        h('code', { class: 'message-id' }, m.id ?? '')),
      contentBlock(m.content),
      m.metadata && Object.keys(m.metadata).length
        ? details(`message-${m.id}-metadata`, 'Metadata', jsonBlock(m.metadata, 'Message metadata'))
        : null);
  }));
}

export function decisionList(decisions) {
  if (!decisions?.length) return h('p', { class: 'muted' }, 'No decisions.');
  return h('ol', { class: 'decisions' }, decisions.map((d) => h('li', { class: 'decision', 'data-key': d.key },
    h('p', { class: 'decision-summary' }, d.summary ?? ''),
    d.rationale ? h('p', { class: 'decision-rationale' }, d.rationale) : null,
    h('p', { class: 'decision-meta' },
      `${d.agent ?? '?'} at step ${d.step_id ?? '?'}, visit ${d.visit ?? '?'}`,
      d.timestamp ? ` · ${formatTimestamp(d.timestamp)}` : ''),
    d.related_artifacts?.length
      ? h('p', { class: 'refs' }, 'Artifacts: ', d.related_artifacts.map((a, i) => [i ? ' ' : '', h('code', {}, a)]))
      : null)));
}

export function handoffList(handoffs) {
  if (!handoffs?.length) return h('p', { class: 'muted' }, 'No handoffs.');
  return h('ol', { class: 'handoffs' }, handoffs.map((handoff) => {
    const sources = handoff.source_agents?.length ? handoff.source_agents.join(' + ') : '(run input)';
    const where = `into step ${handoff.step_id} (visit ${handoff.visit}${handoff.item != null ? `, item ${handoff.item}` : ''})`;
    return h('li', { class: 'handoff' },
      h('p', { class: 'handoff-head' },
        h('strong', {}, `${sources} → ${handoff.target_agent}`), ' ', where,
        handoff.timestamp ? h('span', { class: 'muted' }, ` · ${formatTimestamp(handoff.timestamp)}`) : null),
      handoff.decisions?.length
        ? h('ul', { class: 'handoff-decisions' }, handoff.decisions.map((d) => h('li', {},
          h('strong', {}, d.summary ?? ''), d.rationale ? ` — ${d.rationale}` : '',
          h('span', { class: 'muted' }, ` (${d.agent ?? '?'})`))))
        : h('p', { class: 'muted' }, 'No decisions handed on.'),
      handoff.memory_refs?.length
        ? h('p', { class: 'refs' }, 'Memory: ', handoff.memory_refs.map((r, i) => [i ? ' ' : '', h('code', {}, r)]))
        : null);
  }));
}

export function usageTable(usage, caption) {
  const rows = sumUsage(usage);
  if (!rows.length) return h('p', { class: 'muted' }, 'No model calls.');
  return h('div', { class: 'table-scroll' }, h('table', { class: 'data-table' },
    h('caption', { class: 'visually-hidden' }, caption),
    h('thead', {}, h('tr', {}, ['Model', 'Prompt tokens', 'Completion tokens'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows.map((u) => h('tr', {},
      h('td', {}, u.model), h('td', { class: 'num' }, formatCount(u.prompt_tokens)),
      h('td', { class: 'num' }, formatCount(u.completion_tokens)))))));
}
