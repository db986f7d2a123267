#!/usr/bin/env bash
# The validators of the collection aicluster.stethoscope's ecosystem, none written by this project:
# ansible-test sanity and units, and galaxy-importer (what Galaxy runs on upload), with no network but
# the package index that `make setup` uses.
# - ansible-test wants the collection at ansible_collections/aicluster/stethoscope/ and, inside a git
#   checkout, sees only the files git tracks there (none under the ignored link farm): so this assembles
#   a dereferenced copy of the link farm in a temporary folder, with the collection's tests/
#   (collections/stethoscope/tests: the sanity ignores and the unit tests); the captures the unit tests
#   read are linked beside ansible_collections/ (tests/fixtures), out of the sanity checks' sight.
# - ansible-test bootstraps pip in each sanity venv with a get-pip.py that it downloads from
#   ci-files.testing.ansible.com unless its cache holds one: tools/ansible_test_get_pip.py stands in
#   (ensurepip, then pip from the package index).
# Sanity runs on the controller's Python (--local); units in a venv of ansible-test's (pytest-xdist and
# pytest-mock, which the project's venv does not need). Both venvs are cached under ~/.ansible/test.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin="$top/.venv/bin"
importer_version=0.4.44
python_version=$("$bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

pip_version=$("$bin/python" -c '
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$python_version"'"))["pip"])')
get_pip="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
if [ ! -f "$get_pip" ] || grep -q "Offline stand-in" "$get_pip"; then
  mkdir -p "$(dirname "$get_pip")"
  cp "$top/tools/ansible_test_get_pip.py" "$get_pip"
fi

bash "$top/tools/link_collection.sh" >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/stethoscope-ansible-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
collection="$work/ansible_collections/aicluster/stethoscope"
mkdir -p "$collection"
cp -rL "$top/.collections/ansible_collections/aicluster/stethoscope/." "$collection"
cp -rL "$top/collections/stethoscope/tests" "$collection/tests"
mkdir -p "$work/tests"
ln -s "$top/tests/fixtures" "$work/tests/fixtures"
find "$collection" \( -name __pycache__ -o -name .pytest_cache \) -prune -exec rm -rf {} +

(
  cd "$collection"
  "$bin/ansible-test" sanity --local --python "$python_version"
  "$bin/ansible-test" units --venv --python "$python_version"
)

# What Galaxy and Automation Hub run on upload, on the tarball `make collection` builds, from a venv of
# its own (it pins its own ansible-core and ansible-lint); it writes importer_result.json where it runs,
# whose contents must name every playbook of playbooks/ (the nested ones through their entry points).
importer="$top/build/galaxy-importer"
if [ ! -f "$importer/.installed-$importer_version" ]; then
  rm -rf "$importer"
  "$bin/python" -m venv "$importer"
  "$importer/bin/pip" install --quiet "galaxy-importer==$importer_version"
  touch "$importer/.installed-$importer_version"
fi
PATH="$bin:$PATH" bash "$top/tools/build_collection.sh" >/dev/null
version=$("$bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["version"])' \
  "$top/collections/stethoscope/galaxy.yml")
(cd "$work" && PATH="$importer/bin:$PATH" "$importer/bin/python" -m galaxy_importer.main \
  "$top/build/aicluster-stethoscope-$version.tar.gz")
"$bin/python" "$top/tools/importer_playbooks.py" "$work/importer_result.json" "$top/playbooks"
