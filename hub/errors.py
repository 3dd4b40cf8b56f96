"""One exception hierarchy; every refusal carries a message that names the fix."""
from __future__ import annotations


class AmuxError(Exception):
    """A refusal a user can act on; `str()` is the user-facing message."""

    status = 400
    code = "invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Invalid(AmuxError):
    """The request is malformed or names something unusable."""


class NotFound(AmuxError):
    """The named thing does not exist (or is not visible to the caller)."""

    status = 404
    code = "not_found"


class Unauthorized(AmuxError):
    """No valid credentials."""

    status = 401
    code = "unauthorized"


class Forbidden(AmuxError):
    """Credentials are valid but do not allow this."""

    status = 403
    code = "forbidden"


class TooMany(AmuxError):
    """A per-principal limit is reached; the message names the limit and the setting."""

    status = 429
    code = "limit_reached"


class Conflict(AmuxError):
    """The thing is in a state that does not allow this."""

    status = 409
    code = "conflict"
