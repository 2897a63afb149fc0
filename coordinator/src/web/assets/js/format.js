// How times, durations, counts and token usage read: text only, no elements.

const pad2 = (n) => String(n).padStart(2, '0');

export function formatDateTime(ms) {
  if (!ms) return '—';
  return new Date(ms).toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: 'numeric',
    hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
}

export function formatClock(date) {
  return `${pad2(date.getHours())}:${pad2(date.getMinutes())}:${pad2(date.getSeconds())}`;
}

/** "850 ms", "3.2 s", "4 min 05 s", "2 h 03 min", "3 d 4 h". */
export function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms) || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 59.95) return `${seconds.toFixed(1)} s`;
  const total = Math.floor(seconds);
  const minutes = Math.floor(total / 60) % 60;
  const hours = Math.floor(total / 3600);
  if (hours === 0) return `${Math.floor(total / 60)} min ${pad2(total % 60)} s`;
  if (hours < 24) return `${hours} h ${pad2(minutes)} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** A visit's or attempt's duration; one still going counts until now. */
export function durationSoFar(startedMs, finishedMs) {
  if (!startedMs) return '—';
  const text = formatDuration((finishedMs || Date.now()) - startedMs);
  return finishedMs || text === '—' ? text : `${text} so far`;
}

export function runDuration(run, now = Date.now()) {
  if (!run.created_ms) return null;
  const end = run.status === 'running' ? now : run.updated_ms;
  return end - run.created_ms;
}

export function formatCount(n) {
  return Number(n ?? 0).toLocaleString();
}

export function formatTimestamp(text) {
  if (!text) return '—';
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? String(text) : formatDateTime(ms);
}

export function plural(n, one, many = `${one}s`) {
  return `${formatCount(n)} ${n === 1 ? one : many}`;
}

/** Token usage summed per model: [{model, prompt_tokens, completion_tokens}]. */
export function sumUsage(entries) {
  const totals = new Map();
  for (const used of entries ?? []) {
    const model = used.model || 'model';
    const total = totals.get(model) ?? { model, prompt_tokens: 0, completion_tokens: 0 };
    total.prompt_tokens += Number(used.prompt_tokens ?? 0);
    total.completion_tokens += Number(used.completion_tokens ?? 0);
    totals.set(model, total);
  }
  return [...totals.values()];
}

export function usageText(usage) {
  if (!usage?.length) return '—';
  return usage
    .map((u) => `${u.model}: ${formatCount(u.prompt_tokens)} prompt + ${formatCount(u.completion_tokens)} completion`)
    .join('; ');
}

export function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2) ?? 'null';
  } catch {
    return String(value);
  }
}

/** A map step's items: "12/40 done, 1 failed" (done counts the failed too). */
export function itemsText(items, { running = false } = {}) {
  if (!items || !items.count) return '';
  const settled = Number(items.succeeded ?? 0) + Number(items.failed ?? 0);
  let text = `${formatCount(settled)}/${formatCount(items.count)} done`;
  if (items.failed) text += `, ${formatCount(items.failed)} failed`;
  if (running && items.running) text += `, ${formatCount(items.running)} running`;
  return text;
}

/** How a container's children stand, most telling first: "3 failed · 10 running · 320 succeeded". */
export function childrenText(counts) {
  if (!counts) return '';
  const order = ['failed', 'rejected', 'retrying', 'running', 'waiting', 'queued', 'succeeded', 'redriven', 'cancelled'];
  return order.filter((st) => counts[st]).map((st) => `${formatCount(counts[st])} ${st}`).join(' · ');
}
