#!/bin/sh
# A stand-in agent for the end-to-end tests: it saves the payload it received, then answers with
# the spec's example output for AGENT (the "Complete Example: Feature Development Workflow").
#
#   sh spec-agent.sh AGENT
#
# Environment:
#   RECORD_ROOT    a folder shared by every worker of one test
#   WORKER         this worker's name: its records go to $RECORD_ROOT/$WORKER
#   BATON_RUN_ID, BATON_STEP_ID   set by the worker for every task
#
# The n-th payload a step of a run receives is saved as <run>.<step>.<n>.json, n counted across
# all workers' folders (the visits of one step never overlap, so the count is the visit).
set -eu

agent=$1
mkdir -p "$RECORD_ROOT/$WORKER"
n=1
while :; do
    taken=no
    for dir in "$RECORD_ROOT"/*/; do
        if [ -e "$dir$BATON_RUN_ID.$BATON_STEP_ID.$n.json" ]; then
            taken=yes
        fi
    done
    if [ "$taken" = no ]; then
        break
    fi
    n=$((n + 1))
done
cat > "$RECORD_ROOT/$WORKER/$BATON_RUN_ID.$BATON_STEP_ID.$n.json"

exec sh "$(dirname "$0")/spec-answer.sh" "$agent"
