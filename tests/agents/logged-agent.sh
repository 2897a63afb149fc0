#!/bin/sh
# A stand-in agent that logs each execution and takes its time: it appends
# "<run> <step> <visit> <attempt> <worker>" to $RECORD_ROOT/executions.log, sleeps SECONDS, then
# answers "done".
#
#   sh logged-agent.sh SECONDS
set -eu
cat > /dev/null
echo "$BATON_RUN_ID $BATON_STEP_ID $BATON_VISIT $BATON_ATTEMPT $WORKER" >> "$RECORD_ROOT/executions.log"
sleep "$1"
echo '"done"'
