#!/usr/bin/env bash
# Regenerates the documents' diagrams from their text sources: docs/diagrams/*.dot -> *.svg
# (Graphviz; installed here when missing). Commit the .dot and the .svg together.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v dot >/dev/null; then
  echo "diagrams: installing graphviz"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null
fi
for src in docs/diagrams/*.dot; do
  dot -Tsvg "$src" -o "${src%.dot}.svg"
  echo "diagrams: ${src%.dot}.svg"
done
