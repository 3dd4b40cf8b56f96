"""The `amux` command line: `amux.py` builds the parser from one module per command group (`serve`, `runner`, `db`,
`tokens`, `tasks`, `sessions`, `instances`, `memory`, `profiles`, `credentials`, `schedules`, `alerts`, `identity`,
`runtimes`, `config`), each with `add_parser` and `run`; `options`, `client`, `discovery` and `exit` are what they
share. Client commands call the hub over REST only; the server commands (`up`, `hub serve`, `db`, `token create`)
import hub.app and the store inside their `run`, so a client command never loads the server side.

May import: everything below it (hub.app, hub.runner, hub.engines, hub.store, hub.services, hub.config_sources, …);
nothing imports it. `main` and `build_parser` are the entry points (the `amux` script, `python -m hub.cli`, and
programs that drive the command line in-process)."""
from .amux import build_parser, main

__all__ = ["build_parser", "main"]
