// What the agents print while they run, as the run's event stream brings it: kept per step (also
// while its panel is closed), each piece once however often a reconnected stream repeats it,
// and shown in the open step's panel.

import { LIVE_OUTPUT_CHARS } from './config.js';
import { h, setText } from './dom.js';
import { plural } from './format.js';

/** A live output offset ("1700000000000-3", a Redis stream id) as [ms, seq]; null if it is not one. */
function outputOffset(text) {
  const match = /^(\d+)-(\d+)$/.exec(String(text ?? ''));
  return match ? [Number(match[1]), Number(match[2])] : null;
}

export class LiveOutput {
  constructor() {
    this.outputs = new Map(); // step id -> {visit, attempt, text}: live output, kept when its panel is closed
    this.lastOffset = null; // the last piece shown, [ms, seq]: a reconnected stream repeats those before it
    // Under the graph: says when the stream dropped pieces.
    this.missedNote = h('p', { id: 'output-missed', class: 'note', hidden: true });
    // In the step panel: the open step's output.
    this.pre = h('pre', { id: 'live-output', class: 'live-output', 'aria-live': 'off', tabindex: '0', 'aria-labelledby': 'live-output-title' });
    this.label = h('span', { class: 'muted' });
    this.block = h('div', { class: 'live-block', hidden: true },
      h('h3', { id: 'live-output-title' }, 'Live output'), this.label, this.pre);
  }

  /**
   * Keeps a piece of a step's output. Returns null for a piece already kept; otherwise the step
   * and how its shown output changes: `null` to redraw it whole (a new visit or attempt, or cut
   * to LIVE_OUTPUT_CHARS), else the text to append.
   */
  append(piece) {
    const offset = outputOffset(piece.offset);
    if (offset) {
      // Offsets are the store's stream ids, in order: one not after the last shown was shown.
      const last = this.lastOffset;
      if (last && (offset[0] < last[0] || (offset[0] === last[0] && offset[1] <= last[1]))) return null;
      this.lastOffset = offset;
    }
    const stepId = piece.step_id;
    let buffer = this.outputs.get(stepId);
    const fresh = !buffer || piece.restart || buffer.visit !== piece.visit || buffer.attempt !== piece.attempt;
    if (fresh) {
      buffer = { visit: piece.visit, attempt: piece.attempt, text: '' };
      this.outputs.set(stepId, buffer);
    }
    buffer.text += piece.text ?? '';
    let cut = false;
    if (buffer.text.length > LIVE_OUTPUT_CHARS) {
      buffer.text = `…${buffer.text.slice(-LIVE_OUTPUT_CHARS)}`;
      cut = true;
    }
    return { stepId, appended: fresh || cut ? null : piece.text ?? '' };
  }

  /** The stream fell behind and dropped `pieces` pieces. */
  missed(pieces) {
    this.missedNote.hidden = false;
    setText(this.missedNote, `This page fell behind the live output and missed ${plural(pieces, 'piece')} of it; the stored results are whole.`);
  }

  /**
   * Shows `stepId`'s live output in the panel's block (`status` is the step's): `null` redraws
   * it, a string appends, undefined only toggles.
   */
  show(stepId, status, appended) {
    const buffer = this.outputs.get(stepId);
    const active = status === 'running' || status === 'retrying';
    this.block.hidden = !buffer && !active;
    if (this.block.hidden) return;
    const pre = this.pre;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.hidden = !buffer;
    if (appended === null) {
      pre.textContent = buffer?.text ?? '';
    } else if (typeof appended === 'string' && appended) {
      pre.append(appended);
    }
    setText(this.label, buffer
      ? `visit ${buffer.visit}, attempt ${buffer.attempt}${active ? ' · streaming' : ''}`
      : 'No output yet.');
    // Follow the stream unless the reader scrolled up to read.
    if (atBottom || appended === null) pre.scrollTop = pre.scrollHeight;
  }
}
