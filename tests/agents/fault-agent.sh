#!/bin/sh
# A stand-in agent for the fault tests: it logs each execution, takes SECONDS (default 0.4) so
# that faults land with tasks in flight, and answers with what identifies this execution, so
# that a test can tell whether the answer a run kept is the one a watcher was told about.
#
#   sh fault-agent.sh [SECONDS]
#
# Environment:
#   RECORD_ROOT    a folder shared by every worker of one test; executions.log gets one line
#                  "<run> <step> <visit> <attempt> <worker>" per execution; while a file
#                  "hold" is in it, an execution does not answer (for at most about 2 minutes)
#   WORKER         this worker's name
#   BATON_RUN_ID, BATON_STEP_ID, BATON_VISIT, BATON_ATTEMPT   set by the worker for every task
set -eu

cat > /dev/null
echo "$BATON_RUN_ID $BATON_STEP_ID $BATON_VISIT $BATON_ATTEMPT $WORKER" >> "$RECORD_ROOT/executions.log"
sleep "${1:-0.4}"
tries=0
while [ -e "$RECORD_ROOT/hold" ] && [ "$tries" -lt 2400 ]; do
    tries=$((tries + 1))
    sleep 0.05
done
printf '{"step": "%s", "attempt": %s, "worker": "%s", "nonce": "%s-%s"}\n' \
    "$BATON_STEP_ID" "$BATON_ATTEMPT" "$WORKER" "$$" "$(date +%s%N)"
