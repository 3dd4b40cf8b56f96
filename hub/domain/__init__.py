"""Pure rules: no I/O; `now` is always passed in."""
