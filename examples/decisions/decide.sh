#!/bin/sh
# A stand-in planner or coder for workflow.json: prints an envelope with the step's data, a
# message for the run's history and the decisions the agent took, with why.
#
#   sh decide.sh planner|coder      (the payload on stdin is not needed here)
set -eu
cat > /dev/null

case "$1" in
planner) cat <<'JSON' ;;
{"data": {"files": ["src/reset.ts", "src/mail.ts"], "approach": "Email a one-time reset link"},
 "messages": [{"role": "assistant", "content": "Plan: email a one-time link that expires"}],
 "decisions": [
  {"summary": "Send the reset link by email, valid for 30 minutes",
   "rationale": "a short-lived link limits what a leaked mailbox exposes; users reset within minutes",
   "related_artifacts": ["src/mail.ts"]},
  {"summary": "Rate-limit reset requests to 5 per hour per account",
   "rationale": "stops anyone from flooding a user's mailbox with reset emails",
   "related_artifacts": ["src/reset.ts"]}]}
JSON
coder) cat <<'JSON' ;;
{"data": {"filesCreated": ["src/reset.ts", "src/mail.ts"], "filesModified": ["src/db/schema.sql"]},
 "messages": [{"role": "assistant", "content": "Code: reset tokens, hashed at rest"}],
 "decisions": [
  {"summary": "Store only a SHA-256 hash of each reset token",
   "rationale": "a leaked database must not hand out working reset links",
   "related_artifacts": ["src/db/schema.sql"]},
  {"summary": "Delete a token as soon as it is used",
   "rationale": "a token that worked once must not work again",
   "related_artifacts": ["src/reset.ts"]}]}
JSON
*) echo "decide.sh: no agent $1" >&2; exit 2 ;;
esac
