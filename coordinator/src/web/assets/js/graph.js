// The run's workflow as a graph: drawn once from the server's layout, its nodes repainted as the
// record changes. The graph is one Tab stop (a 500-branch step would otherwise be 500 of them
// before the panel): the arrow keys move between its steps, Enter or a click opens one.

import { STEP_STATUSES } from './config.js';
import { h, s } from './dom.js';
import { edgeShape, nodeView, paintNode } from './graph_shapes.js';

export class RunGraph {
  /** `onOpen(stepId)` is called when the reader opens a step (a click, Enter or Space). */
  constructor({ onOpen }) {
    this.onOpen = onOpen;
    this.nodeViews = new Map(); // step id -> the node's elements and what they show
    this.selected = null;
    this.box = h('div', { id: 'graph', class: 'graph-scroll' }, h('p', { class: 'muted' }, 'Loading the graph…'));
    this.zoomButton = h('button', { type: 'button', id: 'graph-zoom', class: 'button-quiet', 'aria-pressed': 'false' }, 'Actual size');
    this.zoomButton.addEventListener('click', () => this.toggleZoom());
  }

  legend() {
    return h('ul', { class: 'legend', 'aria-label': 'Step statuses' },
      STEP_STATUSES.map((st) => h('li', {}, h('span', { class: `swatch status-${st}`, 'aria-hidden': 'true' }), st)));
  }

  showError(text) {
    this.box.replaceChildren(h('p', { class: 'alert' }, text));
  }

  /** Draws `graph` (as `/graph` answers); `tabStop` is the step to Tab to, the first if none. */
  draw(graph, tabStop) {
    const width = Math.max(1, Number(graph.width) || 1);
    const height = Math.max(1, Number(graph.height) || 1);
    const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
    const edges = Array.isArray(graph.edges) ? graph.edges : [];
    const root = s('svg', {
      id: 'graph-svg', class: 'graph', viewBox: `0 0 ${width} ${height}`, role: 'group',
      'aria-labelledby': 'graph-title', 'aria-describedby': 'graph-hint', preserveAspectRatio: 'xMidYMin meet',
      // An svg clips what overflows it, which makes it a scroller to Chromium; a scroller with
      // no child in the Tab order takes a Tab stop itself, before the graph's step.
      tabindex: '-1',
    });
    root.append(s('defs', {},
      s('marker', { id: 'arrow', class: 'arrow', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' },
        s('path', { d: 'M0,0 L10,5 L0,10 z' })),
      s('marker', { id: 'arrow-error', class: 'arrow arrow-error', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' },
        s('path', { d: 'M0,0 L10,5 L0,10 z' })),
      s('pattern', { id: 'stripes', width: '8', height: '8', patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
        s('rect', { width: '8', height: '8', class: 'stripe-back' }),
        s('rect', { width: '3', height: '8', class: 'stripe-line' }))));

    // Drawn bottom up: the containers' backgrounds, the edges, then every box in the server's
    // document order (a container before what it holds). A container's own box is transparent,
    // so the edges inside it show through.
    const backLayer = s('g', { class: 'container-backs', 'aria-hidden': 'true' });
    for (const node of nodes.filter((n) => n.container)) {
      backLayer.append(s('rect', {
        class: 'container-back', x: Number(node.x) || 0, y: Number(node.y) || 0,
        width: Math.max(20, Number(node.width) || 0), height: Math.max(20, Number(node.height) || 0), rx: 10,
      }));
    }
    const edgeLayer = s('g', { class: 'edges', 'aria-hidden': 'true' });
    for (const edge of edges) edgeLayer.append(edgeShape(edge));
    const nodeLayer = s('g', { class: 'nodes' });
    for (const node of nodes) {
      const view = nodeView(node, Boolean(node.container));
      this.nodeViews.set(node.id, view);
      nodeLayer.append(view.g);
    }
    root.append(backLayer, edgeLayer, nodeLayer);
    this.listenTo(root);
    this.nodeOrder = nodes.map((node) => node.id).filter((id) => this.nodeViews.has(id));
    this.tabStop = null;
    this.setTabStop(tabStop ?? this.nodeOrder[0]);
    this.graphSize = { width, height };
    this.graphSvg = root;
    this.applyZoom();
    this.box.replaceChildren(root);
  }

  listenTo(root) {
    root.addEventListener('click', (event) => {
      const g = event.target.closest?.('.step');
      if (g) this.onOpen(g.dataset.stepId);
    });
    root.addEventListener('keydown', (event) => {
      const g = event.target.closest?.('.step');
      if (!g) return;
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.onOpen(g.dataset.stepId);
        return;
      }
      const next = this.stepFrom(g.dataset.stepId, event.key);
      if (next === undefined) return;
      event.preventDefault();
      if (next) this.focusStep(next);
    });
    root.addEventListener('focusin', (event) => {
      const g = event.target.closest?.('.step');
      if (g) this.setTabStop(g.dataset.stepId);
    });
  }

  /** Repaints the nodes of `steps` (the record's). */
  update(steps) {
    if (!this.nodeViews.size) return;
    // A parallel step's box also says how its branches stand (500 boxes are hard to count).
    const children = new Map();
    for (const step of steps) {
      if (!step.parent) continue;
      const counts = children.get(step.parent) ?? {};
      counts[step.status] = (counts[step.status] ?? 0) + 1;
      children.set(step.parent, counts);
    }
    for (const step of steps) {
      const view = this.nodeViews.get(step.id);
      if (view) paintNode(view, step, view.container ? children.get(step.id) : null);
    }
  }

  /** Marks `stepId`'s node as the one whose panel is open (null: none) and makes it the Tab stop. */
  select(stepId) {
    this.nodeViews.get(this.selected)?.g.classList.remove('selected');
    this.selected = stepId;
    if (!stepId) return;
    this.nodeViews.get(stepId)?.g.classList.add('selected');
    this.setTabStop(stepId);
  }

  /** Focuses `stepId`'s node; false when the graph has none. */
  focusNode(stepId) {
    const view = this.nodeViews.get(stepId);
    if (view) view.g.focus();
    return Boolean(view);
  }

  /** Makes `stepId`'s node the graph's one Tab stop. */
  setTabStop(stepId) {
    if (!this.nodeViews.has(stepId) || stepId === this.tabStop) return;
    this.nodeViews.get(this.tabStop)?.g.setAttribute('tabindex', '-1');
    this.nodeViews.get(stepId).g.setAttribute('tabindex', '0');
    this.tabStop = stepId;
  }

  focusStep(stepId) {
    this.setTabStop(stepId);
    const g = this.nodeViews.get(stepId)?.g;
    g?.focus();
    g?.scrollIntoView?.({ block: 'nearest', inline: 'nearest' });
  }

  /**
   * Where `key` moves from `stepId`: Home and End to the first and last step, an arrow to the
   * nearest step that way (straight on counts more than sideways); null when there is none that
   * way, undefined for any other key.
   */
  stepFrom(stepId, key) {
    const order = this.nodeOrder ?? [];
    if (key === 'Home') return order[0] ?? null;
    if (key === 'End') return order[order.length - 1] ?? null;
    const ways = { ArrowDown: [0, 1], ArrowUp: [0, -1], ArrowRight: [1, 0], ArrowLeft: [-1, 0] };
    const way = ways[key];
    if (!way) return undefined;
    const centre = (id) => {
      const node = this.nodeViews.get(id);
      return [node.x + node.width / 2, node.y + node.height / 2];
    };
    const [fx, fy] = centre(stepId);
    let best = null;
    let bestScore = Infinity;
    for (const id of order) {
      if (id === stepId) continue;
      const [x, y] = centre(id);
      const ahead = (x - fx) * way[0] + (y - fy) * way[1];
      if (ahead <= 1) continue;
      const aside = Math.abs((x - fx) * way[1] + (y - fy) * way[0]);
      const score = ahead + 2 * aside;
      if (score < bestScore) {
        bestScore = score;
        best = id;
      }
    }
    return best;
  }

  toggleZoom() {
    const actual = this.zoomButton.getAttribute('aria-pressed') !== 'true';
    this.zoomButton.setAttribute('aria-pressed', String(actual));
    this.applyZoom();
  }

  /** Fit: as wide as the box, never wider than life, never so small the text is unreadable. */
  applyZoom() {
    if (!this.graphSvg) return;
    const { width, height } = this.graphSize;
    const actual = this.zoomButton.getAttribute('aria-pressed') === 'true';
    const style = this.graphSvg.style;
    style.aspectRatio = `${width} / ${height}`;
    if (actual) {
      style.width = `${width}px`;
      style.minWidth = '';
      style.maxWidth = 'none';
    } else {
      style.width = '100%';
      style.maxWidth = `${width}px`;
      style.minWidth = `${Math.min(width, Math.max(340, width * 0.35))}px`;
    }
  }
}
