#!/bin/sh
# A branch agent that only succeeds if its sibling branch runs at the same time: it saves its
# payload, says it arrived, then waits (at most about 20 s) until the other branch arrived too.
#
#   sh rendezvous.sh ME OTHER
#
# Environment: RECORD_ROOT, WORKER, BATON_RUN_ID, BATON_STEP_ID, as for spec-agent.sh. The
# "arrived" marks live in $RECORD_ROOT itself, which every worker of the test shares.
set -eu

me=$1
other=$2
mkdir -p "$RECORD_ROOT/$WORKER"
cat > "$RECORD_ROOT/$WORKER/$BATON_RUN_ID.$BATON_STEP_ID.1.json"
: > "$RECORD_ROOT/$BATON_RUN_ID.$me.arrived"

tries=0
while [ ! -e "$RECORD_ROOT/$BATON_RUN_ID.$other.arrived" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 400 ]; then
        echo "rendezvous.sh: $me waited 20 s for $other, which never arrived" >&2
        exit 1
    fi
    # Fractional seconds are not POSIX; fall back to whole ones where sleep refuses them.
    sleep 0.05 2>/dev/null || sleep 1
done
printf '{"branch": "%s", "met": "%s", "worker": "%s"}\n' "$me" "$other" "$WORKER"
