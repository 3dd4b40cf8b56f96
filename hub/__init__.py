"""amux hub: admit, freeze, reserve, dispatch and record coding-agent work."""
