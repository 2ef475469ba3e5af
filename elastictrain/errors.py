"""One exception hierarchy for elastictrain.

Every message says what went wrong *and* what to do about it. Code that catches
errors from this package can catch :class:`ElasticTrainError`; the coordinator
maps each subclass to one HTTP status (``http_status``) so that a client sees the
same class the server raised.
"""

from __future__ import annotations

__all__ = [
    "ElasticTrainError",
    "ConfigError",
    "BadRequestError",
    "AuthError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "StaleGenerationError",
    "LeaseLostError",
    "PayloadTooLargeError",
    "CoordinatorUnavailableError", "InterruptedCallError",
    "PolicyError",
    "error_from_status",
]


class ElasticTrainError(Exception):
    """Base class of every error raised by elastictrain."""

    http_status = 500
    code = "internal"


class ConfigError(ElasticTrainError, ValueError):
    """A setting or argument is invalid; the message names the setting and the fix."""

    http_status = 400
    code = "config"


class BadRequestError(ElasticTrainError, ValueError):
    """A request body is malformed, truncated or of the wrong shape."""

    http_status = 400
    code = "bad_request"


class AuthError(ElasticTrainError):
    """A mutating request carried no bearer token, or a wrong one."""

    http_status = 401
    code = "unauthorized"


class ForbiddenError(ElasticTrainError):
    """The credential is valid but may not do this (another user's job, a node credential
    submitting, a worker credential of another job or of a run that ended)."""

    http_status = 403
    code = "forbidden"


class NotFoundError(ElasticTrainError, KeyError):
    """A route, job, dataset or checkpoint does not exist."""

    http_status = 404
    code = "not_found"

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else ""


class ConflictError(ElasticTrainError):
    """The request is well formed but contradicts the coordinator's state."""

    http_status = 409
    code = "conflict"


class StaleGenerationError(ConflictError):
    """A worker of an older generation spoke after the job moved on.

    The worker must stop; the launcher restarts it in the current generation.
    """

    code = "stale_generation"


class LeaseLostError(ConflictError):
    """A shard lease this worker held was taken back (expired or revoked).

    The samples consumed under it cannot be counted exactly once any more:
    restart the job from its last committed checkpoint.
    """

    code = "lease_lost"


class PayloadTooLargeError(ElasticTrainError):
    """A request body exceeds the coordinator's size limit."""

    http_status = 413
    code = "payload_too_large"


class CoordinatorUnavailableError(ElasticTrainError, ConnectionError):
    """The coordinator could not be reached after all retries."""

    http_status = 503
    code = "unavailable"


class InterruptedCallError(CoordinatorUnavailableError):
    """A call retrying an unreachable coordinator was given up because the process is stopping
    (SIGINT or SIGTERM): the caller exits promptly instead of retrying for ``retry_for``."""

    code = "interrupted"


class PolicyError(ElasticTrainError):
    """A scheduling policy could not decide, or decided something the mechanism refuses (a job
    placed twice, more GPUs than a node has, a gang split). The scheduling loop logs it, keeps
    the previous allocation, and goes on; the message names the policy, the job and the rule."""

    code = "policy"


_BY_CODE = {
    cls.code: cls
    for cls in (
        ConfigError,
        BadRequestError,
        AuthError,
        ForbiddenError,
        NotFoundError,
        ConflictError,
        StaleGenerationError,
        LeaseLostError,
        PayloadTooLargeError,
        CoordinatorUnavailableError,
    )
}


def error_from_status(status: int, code: str, reason: str) -> ElasticTrainError:
    """Rebuild the exception a coordinator reported as ``(status, code, reason)``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = {400: BadRequestError, 401: AuthError, 403: ForbiddenError, 404: NotFoundError, 409: ConflictError,
               413: PayloadTooLargeError}.get(status, ElasticTrainError)
    return cls(f"coordinator answered {status}: {reason}")
