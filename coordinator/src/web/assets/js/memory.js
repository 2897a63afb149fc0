// The run's memory: what the agents handed on to each other (the shared message history, the
// decisions they recorded, the handoff each agent step received), the tokens the run used, and
// its context. Redrawn only when the state chain moves, and never under the reader's focus.

import { MESSAGES_SHOWN } from './config.js';
import { details, h, rememberOpen, restoreOpen } from './dom.js';
import { formatCount } from './format.js';
import { decisionList, handoffList, messageList, usageTable } from './memory_views.js';
import { jsonBlock } from './widgets.js';

export class Memory {
  constructor() {
    this.disposed = false;
    this.record = null;
    this.key = '';
    this.element = h('section', { id: 'memory', class: 'memory', 'aria-labelledby': 'memory-title' },
      h('h2', { id: 'memory-title' }, 'Memory'),
      h('p', { class: 'muted' }, 'Loading…'));
  }

  dispose() {
    this.disposed = true;
  }

  update(record) {
    this.record = record;
    this.render();
  }

  render({ force = false } = {}) {
    const record = this.record;
    const messages = Array.isArray(record.messages) ? record.messages : [];
    const decisions = Array.isArray(record.decisions) ? record.decisions : [];
    const handoffs = Array.isArray(record.handoffs) ? record.handoffs : [];
    // The state chain's head changes with every transition, so memory is redrawn only then.
    const key = [record.state_sha256, messages.length, decisions.length, handoffs.length, this.showAllMessages].join('|');
    if (key === this.key) return;
    // Not under the reader's focus: redrawn when it leaves.
    if (!force && this.element.contains(document.activeElement)) {
      if (!this.deferred) {
        this.deferred = true;
        this.element.addEventListener('focusout', () => {
          this.deferred = false;
          setTimeout(() => !this.disposed && this.render(), 0);
        }, { once: true });
      }
      return;
    }
    this.key = key;
    const open = rememberOpen(this.element);
    let shown = messages;
    let more = null;
    if (!this.showAllMessages && messages.length > MESSAGES_SHOWN) {
      shown = messages.slice(-MESSAGES_SHOWN);
      more = h('button', { type: 'button', class: 'button-quiet' }, `Show all ${formatCount(messages.length)} messages`);
      more.addEventListener('click', () => {
        this.showAllMessages = true;
        this.render({ force: true });
        this.element.querySelector('#memory-messages')?.setAttribute('tabindex', '-1');
        this.element.querySelector('#memory-messages')?.focus();
      });
    }
    const context = details('context', 'Context (what the next agent sees)', null);
    // The context can be large: it is built when opened, not on every transition.
    const fillContext = () => {
      if (context.open && !context.querySelector('pre')) context.append(jsonBlock(this.record.context ?? null, 'Run context'));
    };
    context.addEventListener('toggle', fillContext);
    this.element.replaceChildren(
      h('h2', { id: 'memory-title' }, 'Memory'),
      h('p', { class: 'hint' }, 'What the agents handed on to each other: the shared message history, the decisions they recorded, and the handoff record each agent step received.'),
      h('div', { class: 'memory-grid' },
        h('section', { class: 'card', 'aria-labelledby': 'memory-messages' },
          h('h3', { id: 'memory-messages' }, `Messages (${formatCount(messages.length)})`),
          more ? h('p', { class: 'muted' }, `The last ${formatCount(MESSAGES_SHOWN)} are shown. `, more) : null,
          messageList(shown)),
        h('div', { class: 'memory-side' },
          h('section', { class: 'card', 'aria-labelledby': 'memory-decisions' },
            h('h3', { id: 'memory-decisions' }, `Decisions (${formatCount(decisions.length)})`),
            decisionList(decisions)),
          h('section', { class: 'card', 'aria-labelledby': 'memory-handoffs' },
            h('h3', { id: 'memory-handoffs' }, `Handoffs (${formatCount(handoffs.length)})`),
            handoffList(handoffs)))),
      h('section', { class: 'card', 'aria-labelledby': 'memory-usage' },
        h('h3', { id: 'memory-usage' }, 'Token usage'),
        usageTable(record.usage, 'Token usage of the run')),
      context);
    restoreOpen(this.element, open);
    fillContext();
  }
}
