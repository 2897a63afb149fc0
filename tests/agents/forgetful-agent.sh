#!/bin/sh
# A buggy agent: its envelope (`output = "envelope"`) removes a message id the run's history has
# never had. The step must fail naming the id; nothing about it is an integrity failure.
#
#   sh forgetful-agent.sh
set -eu
cat >/dev/null
cat <<'JSON'
{"data": {"done": true},
 "messages": [{"type": "remove", "id": "no-such-message"}]}
JSON
