#!/bin/sh
# One map item: checks that every relative link of one page ("map": {"item": "docs/x.md"} in
# the payload) names a file that exists. Prints {"page", "links"}; a broken link fails the item,
# naming the page and the link.
set -eu

payload=$(cat)
# The payload is compact JSON: "map":{"count":4,"index":1,"item":"docs/install.md","step":...}
page=$(printf '%s' "$payload" | sed -n 's/.*"map":{[^}]*"item":"\([^"]*\)".*/\1/p')
links=0
for target in $(grep -o '](\([^)]*\))' "$page" | sed 's/^](\(.*\))$/\1/'); do
    links=$((links + 1))
    case "$target" in
    http://* | https://*) continue ;;
    esac
    if [ ! -e "$(dirname "$page")/$target" ]; then
        echo "$page links to $target, which does not exist" >&2
        exit 1
    fi
done
printf '{"page": "%s", "links": %d}\n' "$page" "$links"
