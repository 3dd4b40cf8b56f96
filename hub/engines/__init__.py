"""Engine adapters: each turns a frozen snapshot into a launch and a stream of canonical events."""
