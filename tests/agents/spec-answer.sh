#!/bin/sh
# The spec's example output for AGENT (the "Complete Example: Feature Development Workflow"),
# shared by the stand-in agents spec-agent.sh and chaos-agent.sh.
#
#   sh spec-answer.sh AGENT
set -eu

agent=$1
case "$agent" in
planner)
    echo '{"files": ["src/theme.ts", "src/toggle.tsx"], "approach": "Use CSS variables",
           "steps": ["Create theme context", "Build toggle component", "Add tests"]}'
    ;;
coder)
    echo '{"filesCreated": ["src/theme.ts", "src/toggle.tsx"], "filesModified": ["src/App.tsx"],
           "changes": "Added theme context and toggle component"}'
    ;;
test-unit)
    echo '{"passed": 15, "failed": 0, "coverage": 95}'
    ;;
test-integration)
    echo '{"passed": 5, "failed": 0}'
    ;;
reviewer)
    echo '{"approved": true, "comments": ["Good implementation", "Tests pass", "Code is clean"],
           "suggestions": []}'
    ;;
*)
    echo "spec-answer.sh: no answer for agent \"$agent\"" >&2
    exit 2
    ;;
esac
