// The shapes the workflow graph is drawn with: an edge (a polyline with its arrow and label) and
// a step's node (its box, texts cut to fit, and a map's progress bar), repainted as its step
// changes. Positions and sizes come from the server's layout (web/graph.rs).

import { s } from './dom.js';
import { childrenText, itemsText } from './format.js';

// Text in graph nodes is cut to fit its box. Widths come from a canvas (no layout, so 500
// nodes measure in a few milliseconds) with the fonts app.css gives the SVG's text.
const FONTS = { title: '650 13px', compactTitle: '650 11px', small: '650 11px', detail: '400 11px' };
let measure = null;

function textWidth(text, font) {
  if (!measure) {
    measure = {
      context: document.createElement('canvas').getContext('2d'),
      family: getComputedStyle(document.body).fontFamily || 'sans-serif',
    };
  }
  if (!measure.context) return text.length * 8;
  measure.context.font = `${FONTS[font]} ${measure.family}`;
  return measure.context.measureText(text).width;
}

function fitText(text, width, font) {
  const value = String(text ?? '');
  if (textWidth(value, font) <= width) return value;
  let low = 0;
  let high = value.length;
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    if (textWidth(`${value.slice(0, mid)}…`, font) <= width) low = mid;
    else high = mid - 1;
  }
  return `${value.slice(0, Math.max(1, low))}…`;
}

/** The point halfway along a polyline, where its label goes. */
function midpoint(points) {
  if (points.length === 1) return points[0];
  let total = 0;
  for (let i = 1; i < points.length; i += 1) total += Math.hypot(points[i][0] - points[i - 1][0], points[i][1] - points[i - 1][1]);
  let left = total / 2;
  for (let i = 1; i < points.length; i += 1) {
    const [x0, y0] = points[i - 1];
    const [x1, y1] = points[i];
    const length = Math.hypot(x1 - x0, y1 - y0);
    if (length >= left && length > 0) return [x0 + ((x1 - x0) * left) / length, y0 + ((y1 - y0) * left) / length];
    left -= length;
  }
  return points.at(-1);
}

export function edgeShape(edge) {
  const points = (Array.isArray(edge.points) ? edge.points : [])
    .map((p) => [Number(p[0]), Number(p[1])])
    .filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
  const kind = ['next', 'then', 'else', 'on_error', 'on_approve', 'on_reject'].includes(edge.kind) ? edge.kind : 'next';
  const g = s('g', { class: `edge edge-${kind}${edge.back ? ' edge-back' : ''}`, 'data-from': edge.from, 'data-to': edge.to });
  if (points.length < 2) return g;
  const d = points.map((p, i) => `${i ? 'L' : 'M'}${p[0]},${p[1]}`).join(' ');
  const marker = kind === 'on_error' || kind === 'on_reject' ? 'arrow-error' : 'arrow';
  g.append(s('path', { d, class: 'edge-line', 'marker-end': `url(#${marker})` }));
  if (edge.label) {
    const [x, y] = midpoint(points);
    g.append(s('text', { x, y: y + 4, class: 'edge-label', 'text-anchor': 'middle' }, edge.label));
  }
  return g;
}

/** A step's node, painted pending: its element is `g`, the rest is what paintNode needs. */
export function nodeView(node, container) {
  const x = Number(node.x) || 0;
  const y = Number(node.y) || 0;
  const width = Math.max(20, Number(node.width) || 180);
  const height = Math.max(20, Number(node.height) || 48);
  const kind = node.kind || 'step';
  const g = s('g', {
    class: `step kind-${/^[a-z_]+$/.test(kind) ? kind : 'step'}${container ? ' container' : ''}`,
    'data-step-id': node.id,
    'data-status': 'pending',
    tabindex: '-1',
    role: 'button',
    'aria-label': `${node.id}, ${kind}, pending`,
    'aria-controls': 'step-panel',
    transform: `translate(${x},${y})`,
  });
  const title = s('title', {}, '');
  const box = s('rect', { class: 'box', width, height, rx: container ? 10 : 7 });
  const name = node.label || node.id;
  const view = {
    g, title, kind, x, y, width, height, container, name, detail: node.detail || '', key: '',
    compact: !container && height < 44, statusRight: container || (kind === 'map' && height >= 44),
    statusText: null, itemsText: null, progress: null,
  };
  g.append(title, box);
  if (view.statusRight) {
    // The status on the right of the first line leaves the second to the items' progress.
    // A container's label sits in its top band: the layout leaves room above the children.
    const left = container ? 10 : 14;
    if (!container) g.append(s('rect', { class: 'accent', width: 5, height, rx: 2 }));
    view.statusText = s('text', { x: width - 10, y: container ? 18 : 19, class: 'status-text', 'text-anchor': 'end' }, 'pending');
    view.nameText = s('text', { x: left, y: container ? 18 : 19, class: 'node-title' }, name);
    view.itemsText = s('text', { x: left, y: container ? 33 : 36, class: 'node-detail' }, node.detail || kind);
    g.append(view.nameText, view.itemsText, view.statusText);
  } else if (view.compact) {
    // A branch among many (120 x 32): the id, then the status; the detail is in the tooltip.
    g.append(s('rect', { class: 'accent', width: 4, height, rx: 2 }));
    view.nameText = s('text', { x: 10, y: 14, class: 'node-title compact' }, name);
    view.itemsText = s('text', { x: 10, y: 27, class: 'node-detail compact' }, '');
    view.statusText = view.itemsText;
    g.append(view.nameText, view.itemsText);
  } else {
    // The id gets the whole first line; the status leads the second, then the detail.
    g.append(s('rect', { class: 'accent', width: 5, height, rx: 2 }));
    view.nameText = s('text', { x: 14, y: 19, class: 'node-title' }, name);
    view.statusText = s('tspan', { class: 'status-text' }, 'pending');
    view.itemsText = s('tspan', {}, '');
    g.append(view.nameText, s('text', { x: 14, y: 36, class: 'node-detail' }, view.statusText, view.itemsText));
  }
  if (kind === 'map') {
    // A bar along the bottom of the box: how many items are done.
    const left = container ? 10 : 14;
    view.progressWidth = Math.max(0, width - left - 10);
    view.progress = s('rect', { class: 'progress', x: left, y: height - 6, width: 0, height: 3, rx: 1.5 });
    g.append(s('rect', { class: 'progress-track', x: left, y: height - 6, width: view.progressWidth, height: 3, rx: 1.5 }), view.progress);
  }
  paintNode(view, { status: 'pending', visits: 0, items: null });
  return view;
}

/** Writes a node's status, visits and map items into its elements. */
export function paintNode(view, step, children = null) {
  const status = step.status || 'pending';
  const items = itemsText(step.items) || childrenText(children);
  const key = `${status}|${step.visits}|${items}`;
  if (key === view.key) return;
  view.key = key;
  const { g, width, container } = view;
  g.setAttribute('data-status', status);
  g.setAttribute('aria-label', `${g.dataset.stepId}, ${view.kind}, ${status}`);
  const statusLabel = step.visits > 1 ? `${status} ×${step.visits}` : status;
  if (view.compact) {
    view.nameText.textContent = fitText(view.name, width - 16, 'compactTitle');
    view.itemsText.textContent = fitText([statusLabel, items].filter(Boolean).join(' · '), width - 16, 'small');
  } else if (view.statusRight) {
    const left = container ? 10 : 14;
    view.statusText.textContent = statusLabel;
    const statusWidth = textWidth(statusLabel, 'small') + 10;
    view.nameText.textContent = fitText(view.name, width - left - statusWidth - 8, 'title');
    // The items' count first and whole if it fits; the detail only in the room left.
    const room = width - left - 8;
    const both = [items, view.detail].filter(Boolean).join(' · ') || view.kind;
    view.itemsText.textContent = items && textWidth(both, 'detail') > room ? fitText(items, room, 'detail') : fitText(both, room, 'detail');
  } else {
    view.statusText.textContent = statusLabel;
    view.nameText.textContent = fitText(view.name, width - 24, 'title');
    const rest = [items, view.detail].filter(Boolean).join(' · ');
    const room = width - 22 - textWidth(statusLabel, 'small');
    view.itemsText.textContent = rest ? fitText(` · ${rest}`, room, 'detail') : '';
  }
  view.title.textContent = [
    `${view.name} (${view.kind})`, view.detail, `status: ${status}`,
    step.visits > 1 ? `visits: ${step.visits}` : '', itemsText(step.items, { running: true }) || items,
  ].filter(Boolean).join('\n');
  if (view.progress) {
    const count = Number(step.items?.count ?? 0);
    const settled = Number(step.items?.succeeded ?? 0) + Number(step.items?.failed ?? 0);
    view.progress.setAttribute('width', String(count ? (view.progressWidth * Math.min(settled, count)) / count : 0));
  }
}
