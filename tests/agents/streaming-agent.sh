#!/bin/sh
# A stand-in agent that streams while it works: it writes lines to stderr (streamed live to the
# run's watchers with `stream_stderr = true`) until the test releases it by creating
# $RECORD_ROOT/$BATON_RUN_ID.$BATON_STEP_ID.release (it gives up after about 30 s), then answers
# as memory-agent.sh AGENT does.
#
#   sh streaming-agent.sh AGENT
#
# Environment: as memory-agent.sh.
set -eu

agent=$1
payload=$(cat)
echo "Reading the diff of the dark mode toggle" >&2
tries=0
while [ ! -e "$RECORD_ROOT/$BATON_RUN_ID.$BATON_STEP_ID.release" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 600 ]; then
        echo "streaming-agent.sh: $agent was never released" >&2
        exit 1
    fi
    if [ $((tries % 20)) -eq 0 ]; then
        echo "still reviewing ($tries)" >&2
    fi
    sleep 0.05 2>/dev/null || sleep 1
done
printf '%s' "$payload" | sh "$(dirname "$0")/memory-agent.sh" "$agent"
