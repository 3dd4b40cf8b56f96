"""The `amux` CLI's exit codes and the one place that maps an error to one (README "Command line").

| code | meaning |
|---|---|
| 0 | done (a waited task or Turn succeeded) |
| 1 | the waited task or Turn ended other than succeeded (failed, cancelled, timed_out, waiting_for_user) |
| 2 | usage: the command line is wrong (argparse, or a missing argument found later) |
| 3 | refused or not found: the hub (4xx) or the local home refused the command |
| 4 | the hub cannot be reached, or answered with a server error (5xx) or not JSON |
| 5 | `--timeout` elapsed while waiting: the task or Turn goes on |
| 130 | interrupted (Ctrl-C); 141: stdout closed early (`amux task list | head`), quietly |
"""
from __future__ import annotations

from ..errors import AmuxError

OK, ENDED, USAGE, REFUSED, UNREACHABLE, WAITED_OUT, INTERRUPTED, BROKEN_PIPE = 0, 1, 2, 3, 4, 5, 130, 141


class UsageError(AmuxError):
    """The command line lacks something only found after parsing (e.g. no session-ref and no AMUX_SESSION_ID)."""


class HubUnreachable(AmuxError):
    """The hub could not be reached, or failed (5xx, a reply that is not JSON)."""

    status = 503
    code = "unreachable"


class HubRefused(AmuxError):
    """The hub answered 4xx; `status` is its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Ended(AmuxError):
    """A waited task or Turn ended other than succeeded (its outcome is already printed)."""


class WaitedOut(AmuxError):
    """`--timeout` elapsed while waiting; the run goes on (its state is already printed)."""


def exit_code(error: BaseException) -> int:
    """Return the exit code of an error that ended a command (README "Command line" lists them)."""
    if isinstance(error, UsageError):
        return USAGE
    if isinstance(error, HubUnreachable):
        return UNREACHABLE
    if isinstance(error, Ended):
        return ENDED
    if isinstance(error, WaitedOut):
        return WAITED_OUT
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(error, BrokenPipeError):
        return BROKEN_PIPE
    return REFUSED  # a hub refusal, a local home refusal, an unreadable file


def outcome(status: str, what: str) -> None:
    """Raise Ended when a waited run's terminal `status` is not succeeded, WaitedOut when it is still going."""
    from ..domain.tasks import is_terminal

    if status == "succeeded":
        return
    if is_terminal(status):
        raise Ended(f"{what} ended {status}")
    raise WaitedOut(f"{what} is still {status} (--timeout elapsed; it goes on)")
