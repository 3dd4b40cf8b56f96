"""Pure rules: no I/O; `now` is always passed in. May import hub/errors only."""
