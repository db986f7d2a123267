#!/usr/bin/env bash
# ansible-galaxy skips symlinked folders that point outside the collection: build from a
# dereferenced copy of the link farm.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bash "$top/tools/link_collection.sh" >/dev/null  # a link farm of an older checkout may lack entries
stage="$top/build/collection/aicluster/stethoscope"
rm -rf "$top/build/collection"
mkdir -p "$(dirname "$stage")"
cp -rL "$top/.collections/ansible_collections/aicluster/stethoscope" "$stage"
find "$stage" -name __pycache__ -type d -prune -exec rm -rf {} +
ansible-galaxy collection build --force --output-path "$top/build" "$stage"
