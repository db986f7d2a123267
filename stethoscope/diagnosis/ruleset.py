"""Rules that follow their files: `stethoscope watch` re-reads a rule file when it changes, and an
invalid edit keeps that file's last good rules (and says what is wrong with the edit)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.rules import Rule, load_rules, rule_files


@dataclass
class _FileState:
    stamp: bytes  # a digest of the text loaded: an edit that keeps the size and time is still one
    rules: list[Rule]


@dataclass
class RuleSet:
    path: Path
    catalog: Catalog
    files: dict[Path, _FileState] = field(default_factory=dict)
    refused: set[Path] = field(default_factory=set)  # files whose present text did not load

    def refresh(self) -> list[str]:
        """Re-read new and changed files; the messages say what was reloaded, kept or dropped."""
        messages: list[str] = []
        present = set(rule_files(self.path))
        for gone in sorted(set(self.files) - present):
            del self.files[gone]
            self.refused.discard(gone)
            messages.append(f"{gone}: removed, its rules are dropped")
        for file in sorted(present):
            try:
                stamp = hashlib.sha256(file.read_bytes()).digest()
            except OSError:
                continue
            known = self.files.get(file)
            if known is not None and known.stamp == stamp:
                continue
            loaded = load_rules(file, self.catalog)
            if loaded.errors:
                self.refused.add(file)
            else:
                self.refused.discard(file)
            if loaded.errors and known is not None:
                known.stamp = stamp  # report the bad edit once, keep serving the last good rules
                messages += [f"{e} (keeping the last good version)" for e in loaded.errors]
                continue
            messages += [str(e) for e in loaded.errors]
            self.files[file] = _FileState(stamp, loaded.rules)
            if known is not None:
                messages.append(f"{file}: reloaded, {len(loaded.rules)} rules")
        return messages

    @property
    def as_files(self) -> bool:
        """Whether these rules are what the files say, as `load_rules` of the folder gives them: no file
        kept at its last good version or loaded in part, no rule id in two files, and some rule (none
        is a configuration error to a command that loads them)."""
        ids = [rule.rule_id for state in self.files.values() for rule in state.rules]
        return bool(ids) and not self.refused and len(ids) == len(set(ids))

    @property
    def rules(self) -> list[Rule]:
        rules: dict[str, Rule] = {}
        for file in sorted(self.files):
            for rule in self.files[file].rules:
                rules.setdefault(rule.rule_id, rule)  # a duplicate id across files: the first file wins
        return list(rules.values())
