#!/bin/sh
# A map item's agent for the map tests: it logs when it starts and ends, takes a little while,
# and answers with its item. An item whose index has a mark "fail-<index>" in $RECORD_ROOT
# fails instead, once every other item has ended (so the map fails only when the others are
# done, and a redrive has exactly one item to run again).
#
#   sh map-item.sh SECONDS
#
# Environment:
#   RECORD_ROOT   shared by every worker of one test; items.log gets the lines
#                 "start <run> <item> <visit> <worker> <ms>" and "end <run> <item> <visit> <worker> <ms>"
#                 (appends of one short line are atomic); "expect-ends" holds how many items
#                 end before a failing one gives up waiting
#   WORKER        this worker's name
#   BATON_RUN_ID, BATON_ITEM, BATON_VISIT   set by the worker
set -eu

cat > /dev/null
log="$RECORD_ROOT/items.log"
echo "start $BATON_RUN_ID $BATON_ITEM $BATON_VISIT $WORKER $(date +%s%3N)" >> "$log"
if [ -e "$RECORD_ROOT/fail-$BATON_ITEM" ]; then
    want=$(cat "$RECORD_ROOT/expect-ends")
    tries=0
    while [ "$(grep -c "^end $BATON_RUN_ID " "$log" || true)" -lt "$want" ] && [ "$tries" -lt 600 ]; do
        sleep 0.05
        tries=$((tries + 1))
    done
    echo "end $BATON_RUN_ID $BATON_ITEM $BATON_VISIT $WORKER $(date +%s%3N)" >> "$log"
    echo "item $BATON_ITEM was told to fail" >&2
    exit 1
fi
sleep "$1"
echo "end $BATON_RUN_ID $BATON_ITEM $BATON_VISIT $WORKER $(date +%s%3N)" >> "$log"
echo "{\"item\": $BATON_ITEM, \"worker\": \"$WORKER\"}"
