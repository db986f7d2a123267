#!/usr/bin/env bash
# Editable link farm of the collection (as ansible-dev-environment does): FQCNs resolve from the
# working tree without installing. The repo root itself is never linked (it contains collections/).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
link="$top/.collections/ansible_collections/aicluster/stethoscope"
mkdir -p "$link"
for entry in galaxy.yml meta README.md CHANGELOG.md requirements.txt; do
  ln -sfn "$top/collections/stethoscope/$entry" "$link/$entry"
done
for entry in plugins roles playbooks LICENSE; do
  ln -sfn "$top/$entry" "$link/$entry"
done
echo "collection aicluster.stethoscope linked at $link"
