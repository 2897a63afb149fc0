// What a running run waits for, grouped and said in words: the runs table and a run's page
// both show it.

import { formatCount } from './format.js';

/**
 * A run's waits, grouped: each approval alone, agents by (agent, served) with their steps, the
 * unserved first. A parallel step of 500 branches waits on 500 tasks of one agent: one line.
 */
export function groupWaits(waits) {
  const groups = [];
  const byAgent = new Map();
  for (const wait of waits ?? []) {
    if (wait.kind !== 'agent') {
      groups.push({ ...wait, steps: [wait.step_id] });
      continue;
    }
    const key = `${wait.agent}\u0000${wait.served === false}`;
    let group = byAgent.get(key);
    if (!group) {
      group = { kind: 'agent', agent: wait.agent, served: wait.served !== false, steps: [] };
      byAgent.set(key, group);
      groups.push(group);
    }
    group.steps.push(wait.step_id);
  }
  const rank = (g) => (g.kind === 'agent' && !g.served ? 0 : g.kind === 'approval' ? 1 : 2);
  return groups.sort((a, b) => rank(a) - rank(b));
}

/** "approval: approve-plan", "agent coder — no worker serves it", "agent shard (436 steps)". */
export function waitingText(group) {
  if (group.kind === 'approval') return `approval: ${group.step_id}`;
  if (group.kind !== 'agent') return group.note || group.step_id || '';
  const steps = group.steps.length === 1 ? `step ${group.steps[0]}` : `${formatCount(group.steps.length)} steps`;
  return group.served ? `agent ${group.agent} (${steps})` : `agent ${group.agent} — no worker serves it${group.steps.length > 1 ? ` (${steps})` : ''}`;
}

export function waitClass(group) {
  if (group.kind === 'compute') return 'agent';
  return group.kind === 'approval' ? 'approval' : group.served ? 'agent' : 'unserved';
}
