# stethoscope: every target sets itself up (venv, dependencies, collection link).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB := inventories/lab/hosts.yml
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup demo test test-fast lint sanity collection lab clean

setup: $(VENV)/.installed .collections/.linked

$(VENV)/.installed: pyproject.toml training/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the distribution was named stethoscope before aicluster-stethoscope: a venv of then holds both
	$(BIN)/pip uninstall --quiet --yes stethoscope
	# the runtime and the training side (torch: `model train`, the lab's episodes), both editable
	$(BIN)/pip install --quiet -e '.[dev]' -e ./training
	touch $@

# a stamp of its own: the link's galaxy.yml has its checkout's time, older than the script's
.collections/.linked: tools/link_collection.sh
	bash tools/link_collection.sh
	touch $@

demo: setup
	$(BIN)/stethoscope db init
	$(BIN)/python tools/lab.py build --nodes 8
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	$(BIN)/stethoscope summary --inventory $(LAB)
	# batches of 4 (the default, 10 % of the inventory, at least 2, is 2 here): RDMA pairs form only among nodes benchmarked together
	$(BIN)/ansible-playbook -i $(LAB) playbooks/baseline.yml -e baseline_batch=4
	$(BIN)/stethoscope baseline --out .stethoscope/report
	# the baseline took minutes: fresh sweeps, so that the rules read data of now, not UNKNOWN
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	$(BIN)/ansible-playbook -i $(LAB) playbooks/collect.yml
	# the lab is swept, not streamed, and runs no job: ten minutes of stream from the episodes (H200-
	# calibrated: the lab's H200 nodes) give the learned model its 120 steps: RDMA drops on node08
	# (beside its rule findings), an AllReduce centre (node01) and a slow NVMe with clean SMART
	# (node04) that no rule sees
	$(BIN)/python tools/episode_stream.py --nodes node01 node03 node04 node08 \
	    --fault node08=communication.rdma_drop_storm --fault node01=communication.allreduce_centre \
	    --fault node04=storage.slow_nvme_clean_smart | $(BIN)/stethoscope ingest -
	$(BIN)/stethoscope diagnose --inventory $(LAB) || test $$? -eq 1  # 1 = findings, which the lab has
	$(BIN)/stethoscope report --out .stethoscope/report  # prints the board's path

# the full suite, as CI runs it: the linters once, then every test tier, the 25 slowest named
test: setup lint
	$(BIN)/python -m pytest --durations=25

# what a change usually needs answered in minutes: no playbook, lab, training, lint, clock, CLI
# process, external service or end-to-end run (the tiers: tests/helpers/tiers.py)
test-fast: setup
	$(BIN)/python -m pytest -m "not (ansible or lab or training or lint or realtime or cli or external or e2e)"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy stethoscope stethoscope_training
	# each distribution's imports against its own pyproject.toml
	$(BIN)/deptry stethoscope
	cd training && $(CURDIR)/$(BIN)/deptry stethoscope_training
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --offline
	bash tools/ansible_sanity.sh

# the collection's validators alone (ansible-test sanity and units, galaxy-importer on the tarball):
# 3.5 minutes on a fresh 2-core machine (their venvs, from the package index), 1 once cached under
# ~/.ansible/test and build/galaxy-importer
sanity: setup
	bash tools/ansible_sanity.sh

collection: setup
	bash tools/build_collection.sh

clean:
	rm -rf .stethoscope .lab build
