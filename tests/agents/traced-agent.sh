#!/bin/sh
# A stand-in agent for the trace tests: it appends "<run> <step> <attempt> <worker> <traceparent>"
# to $RECORD_ROOT/traceparents.log, sleeps SECONDS, then answers "done", or with a second
# argument `fail` writes "the build broke" to stderr and exits 3.
#
#   sh traced-agent.sh SECONDS [fail]
set -eu
cat > /dev/null
echo "$BATON_RUN_ID $BATON_STEP_ID $BATON_ATTEMPT $WORKER ${TRACEPARENT:-none}" >> "$RECORD_ROOT/traceparents.log"
sleep "$1"
if [ "${2:-}" = fail ]; then
    echo "the build broke" >&2
    exit 3
fi
echo '"done"'
