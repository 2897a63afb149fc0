#!/bin/sh
# The site's pages, for the map step to fan out over: {"pages": ["docs/faq.md", ...]}.
set -eu
cat > /dev/null
printf '{"pages": ['
sep=
for page in docs/*.md; do
    printf '%s"%s"' "$sep" "$page"
    sep=', '
done
printf ']}\n'
