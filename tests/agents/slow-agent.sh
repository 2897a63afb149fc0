#!/bin/sh
# A stand-in agent that takes its time: it reads its payload, says it started (in
# $RECORD_ROOT/$WORKER/<run>.started), sleeps SECONDS, then answers "done after SECONDS s".
#
#   sh slow-agent.sh SECONDS
set -eu
cat > /dev/null
mkdir -p "$RECORD_ROOT/$WORKER"
touch "$RECORD_ROOT/$WORKER/$BATON_RUN_ID.started"
sleep "$1"
echo "\"done after $1 s\""
