#!/bin/sh
# A stand-in agent for the chaos test: it logs each execution, takes a little while (so that
# workers are killed with tasks in flight), then answers with the spec's example output for
# AGENT (spec-answer.sh).
#
#   sh chaos-agent.sh AGENT
#
# Environment:
#   RECORD_ROOT    a folder shared by every worker of one test; executions.log gets one line
#                  "<run> <step> <visit> <attempt> <worker>" per execution (appends of one short
#                  line are atomic)
#   WORKER         this worker's name
#   BATON_RUN_ID, BATON_STEP_ID, BATON_VISIT, BATON_ATTEMPT   set by the worker for every task
set -eu

agent=$1
cat > /dev/null
echo "$BATON_RUN_ID $BATON_STEP_ID $BATON_VISIT $BATON_ATTEMPT $WORKER" >> "$RECORD_ROOT/executions.log"
# 150 to 500 ms, by process id.
sleep "0.$(( ( $$ % 4 ) * 10 + 5 ))" 2>/dev/null || sleep 1

exec sh "$(dirname "$0")/spec-answer.sh" "$agent"
