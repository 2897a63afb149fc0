#!/bin/sh
# The release's deploy step: writes the build's version to $DEPLOY_DIR/VERSION (a stand-in for
# copying the artifact to a server). $DEPLOY_DIR comes from the worker's environment. While
# that folder does not exist the step fails, saying so; create it and retry the run.
set -eu

payload=$(cat)
# The payload is compact JSON; the build's data is under "build" ("input": "build").
version=$(printf '%s' "$payload" | sed -n 's/.*"build":{[^}]*"version":"\([^"]*\)".*/\1/p')
if [ -z "${DEPLOY_DIR:-}" ]; then
    echo "DEPLOY_DIR is not set: start the worker with DEPLOY_DIR=<folder to deploy to>" >&2
    exit 2
fi
if [ ! -d "$DEPLOY_DIR" ]; then
    echo "cannot deploy $version: $DEPLOY_DIR does not exist" >&2
    exit 1
fi
printf '%s\n' "$version" > "$DEPLOY_DIR/VERSION"
printf '{"version": "%s", "to": "%s"}\n' "$version" "$DEPLOY_DIR"
