// Building the page's elements. Server data never goes through innerHTML: every element is built
// with createElement (SVG with createElementNS) and every text with textContent, so a step id or
// an agent's output cannot inject markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

function applyProps(el, props) {
  if (!props) return;
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
}

function childNodes(children) {
  return children
    .flat(Infinity)
    .filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (typeof c === 'object' ? c : String(c)));
}

/** An HTML element; string children become text nodes (never parsed as markup). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  el.append(...childNodes(children));
  return el;
}

/** An SVG element. */
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  el.append(...childNodes(children));
  return el;
}

export function setText(el, text) {
  const value = String(text ?? '');
  if (el.textContent !== value) el.textContent = value;
}

/** A <details> whose open state survives re-rendering (see rememberOpen). */
export function details(key, summary, content, open = false) {
  return h('details', { 'data-key': key, open }, h('summary', {}, summary), content);
}

export function rememberOpen(container) {
  const state = new Map();
  for (const el of container.querySelectorAll('details[data-key]')) state.set(el.dataset.key, el.open);
  return state;
}

export function restoreOpen(container, state) {
  for (const el of container.querySelectorAll('details[data-key]')) {
    if (state.has(el.dataset.key)) el.open = state.get(el.dataset.key);
  }
}
