"""Where things are: what the package ships (rules, models, playbooks, the collection, the ansible.cfg
ansible-runner gets) and where the state lives (embedded database, spool, evidence, report; the
executor locks live in a private folder of the user's, remediation.lock).

Shipped: `stethoscope/shipped/` holds relative links to the checkout's top-level rules/, plugins/,
roles/, playbooks/ and collections/stethoscope/ (a link farm `ansible_collections/aicluster/
stethoscope/`); building the wheel copies what they point at, so the same paths answer in a checkout
(the real folders) and installed (package data).

State: $STETHOSCOPE_HOME/.stethoscope when that is set; else `.stethoscope` of the current directory
when it is a stethoscope checkout (`make demo`, `make test`); else ${XDG_STATE_HOME:-~/.local/state}/
stethoscope. Never the checkout the package happens to live in when run from elsewhere. It is
created 0700: it holds the findings, the evidence and the raw metrics. The models
`model finetune` writes are state too (`own_models_dir`): installed from a wheel, the shipped
models/ is site-packages, read-only and replaced by an upgrade."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from stethoscope.private_files import private_dir

COLLECTION = ("ansible_collections", "aicluster", "stethoscope")


def shipped_dir() -> Path:
    """The package's data: links into the checkout, or the copies a wheel installed."""
    return Path(__file__).resolve().parent / "shipped"


def data_dir() -> Path:
    """Data files the runtime reads (recorded captures), shipped as package data: never the test tree."""
    return Path(__file__).resolve().parent / "data"


def h200_capture() -> Path:
    """The recorded H200 `nvidia-smi --query-gpu` time series at 2 Hz under load (its README says
    where it comes from): the lab's agents replay it, the episode generator calibrates on it."""
    return data_dir() / "h200-vm-under-load" / "query_gpu_timeseries_2hz.csv"


def rules_dir() -> Path:
    """The shipped knowledge base: rules, metrics.yml, telemetry.yml, models/."""
    return (shipped_dir() / "rules").resolve()


# the JSON Schemas of a rule file and of rules/metrics.yml, for editors and pre-commit (`rules check`
# stays the authority)
SCHEMAS = {"rules": "rule-file.schema.json", "metrics": "metrics.schema.json"}


def schema_path(of: str) -> Path:
    """The shipped JSON Schema of a rule file (`rules`) or of the metric catalog (`metrics`)."""
    return Path(__file__).resolve().parent / "schemas" / SCHEMAS[of]


def models_dir() -> Path:
    """The shipped models."""
    return rules_dir() / "models"


def own_models_dir() -> Path:
    """The models fine-tuned here (`model finetune`): the state folder's models/, read before the
    shipped ones."""
    return state_dir() / "models"


def collections_path() -> Path:
    """A folder holding ansible_collections/aicluster/stethoscope (ANSIBLE_COLLECTIONS_PATH)."""
    return shipped_dir()


def collection_dir() -> Path:
    """The collection aicluster.stethoscope itself: galaxy.yml, meta/, plugins/, roles/, playbooks/."""
    return collections_path().joinpath(*COLLECTION)


def playbooks_dir() -> Path:
    return (collection_dir() / "playbooks").resolve()


def is_checkout(folder: Path) -> bool:
    return (folder / "collections" / "stethoscope").is_dir()


def ansible_cfg() -> Path:
    """The ansible.cfg ansible-runner gets: the checkout's own when run from one, else the shipped one
    (the collection beside it, the stethoscope callback, no inventory of its own)."""
    cwd = Path.cwd().resolve()
    if is_checkout(cwd) and (cwd / "ansible.cfg").is_file():
        return cwd / "ansible.cfg"
    return shipped_dir() / "ansible.cfg"


def project_root() -> Path:
    """The lab's project folder (inventories/lab, .lab, the test captures): $STETHOSCOPE_HOME, else
    the checkout this package lives in, else cwd. Not for state, rules or playbooks (above, below)."""
    env = os.environ.get("STETHOSCOPE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    here = Path(__file__).resolve().parent.parent
    if is_checkout(here):
        return here
    return Path.cwd().resolve()


def state_dir() -> Path:
    """$STETHOSCOPE_HOME/.stethoscope, else ./.stethoscope in a checkout, else the XDG state folder;
    created 0700 when missing, so whatever writes in it first (the database, the spool, findings.log),
    it is its owner's only. One that cannot be created is its writers' to report."""
    folder = _state_location()
    with contextlib.suppress(OSError):
        private_dir(folder)
    return folder


def _state_location() -> Path:
    env = os.environ.get("STETHOSCOPE_HOME")
    if env:
        return Path(env).expanduser().resolve() / ".stethoscope"
    cwd = Path.cwd().resolve()
    if is_checkout(cwd):
        return cwd / ".stethoscope"
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "stethoscope"


def default_db_path() -> Path:
    return state_dir() / "db"


def default_spool_dir() -> Path:
    return Path(os.environ.get("STETHOSCOPE_SPOOL_DIR") or state_dir() / "spool")
