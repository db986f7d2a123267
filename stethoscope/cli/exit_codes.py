"""Exit codes of every `stethoscope` command (docs/design.md "CLI")."""

EXIT_OK = 0  # healthy / done
EXIT_FINDINGS = 1  # findings at or above --fail-on (verify: the node stays drained)
EXIT_USAGE = 2  # usage or configuration error
EXIT_FAILED = 3  # the run itself failed (an internal error, the store or the lock): never "findings"
