"""Box drivers: where the machines claimed inside a lease task come from; and the sandbox parts task runs share with
them (bubblewrap command lines, cgroup limits).

May import hub/config (box settings) and the base modules."""
