#!/usr/bin/env bash
# Prints a fingerprint of the source tree (everything that builds or runs; not bench/results),
# so a log from the device names the exact tree it ran even when the commit label passed to
# device.sh is wrong. Run it here on a commit to match a log's "tree" line.
set -euo pipefail
cd "$(dirname "$0")/.."
find CMakeLists.txt include src tools tests bench scripts -type f -not -path 'bench/results/*' |
  LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12
