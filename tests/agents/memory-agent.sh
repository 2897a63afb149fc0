#!/bin/sh
# A stand-in agent that hands on more than data: it answers an envelope (`output = "envelope"`)
# with the spec's example output for AGENT as its data (from spec-agent.sh, which also saves the
# payload), one message and one decision.
#
#   sh memory-agent.sh AGENT
#
# Environment: as spec-agent.sh, plus BATON_BIN (the baton binary). The reviewer asks the
# coordinator mid-step for the run's decisions about theming (BATON_COORDINATOR and
# BATON_RUN_ID come from the worker) and saves the answer as <run>.review-decisions.out.
set -eu

agent=$1
here=$(dirname "$0")
data=$(sh "$here/spec-agent.sh" "$agent")

case "$agent" in
planner) summary="Use CSS variables for the theme colours"; why="themes switch without a reload" ;;
coder) summary="Keep the current theme in a React context"; why="every component can read it" ;;
test-unit) summary="Mock matchMedia in unit tests"; why="jsdom has no media queries" ;;
test-integration) summary="Run integration tests against a built bundle"; why="it catches CSS ordering bugs" ;;
reviewer)
    summary="Approve the toggle"; why="the code is clean and tested"
    "$BATON_BIN" decisions "$BATON_RUN_ID" "theme colours CSS variables" --json \
        > "$RECORD_ROOT/$WORKER/$BATON_RUN_ID.review-decisions.out"
    ;;
esac

cat <<JSON
{"data": $data,
 "messages": [{"role": "assistant", "content": "$agent: $summary"}],
 "decisions": [{"summary": "$summary", "rationale": "$why", "related_artifacts": ["src/theme.ts"]}]}
JSON
