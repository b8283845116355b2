"""dlcp's exceptions: one class per status code, each a dlcp.Error (a RuntimeError) with `.code`.

Catch the class for the failure you handle (`except dlcp.AbortedError:` when another worker died)
instead of matching messages. A bad argument is also a ValueError (InvalidArgumentError), so code
written for Python's conventions catches it too. The message still starts with the code, as it did.
"""
from . import _dlcp

Error = _dlcp.Error
Error.code = "UNKNOWN"
Error.__doc__ = "A dlcp failure; `.code` is its status code, the subclass says which (dlcp.errors)."


class CancelledError(Error):
    """The op was cancelled: its client closed while it ran."""
    code = "CANCELLED"


class UnknownError(Error):
    """A failure no other code describes."""
    code = "UNKNOWN"


class InvalidArgumentError(Error, ValueError):
    """A bad argument or setting; the message names it. Also a ValueError."""
    code = "INVALID_ARGUMENT"


class DeadlineExceededError(Error):
    """A deadline passed: a peer never contributed, or wait(timeout) ran out."""
    code = "DEADLINE_EXCEEDED"


class NotFoundError(Error):
    """Something named is not there (a job, an aggregator's record of one)."""
    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    """Something to be created is there already."""
    code = "ALREADY_EXISTS"


class PermissionDeniedError(Error):
    """The peer refused: not allowed."""
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error):
    """A limit was reached (an aggregator's memory cap, its connection limits)."""
    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """The call does not fit the state: a closed client, a rank held by a live worker, a job of
    another shape."""
    code = "FAILED_PRECONDITION"


class AbortedError(Error):
    """The job failed, usually because another worker died; retry once it has joined again."""
    code = "ABORTED"


class OutOfRangeError(Error):
    """A value outside what the wire format or the job allows."""
    code = "OUT_OF_RANGE"


class UnimplementedError(Error, NotImplementedError):
    """Not built into this library or not offered by the peer (a CUDA path without CUDA)."""
    code = "UNIMPLEMENTED"


class InternalError(Error):
    """A broken invariant inside dlcp; please report it."""
    code = "INTERNAL"


class UnavailableError(Error):
    """An aggregator cannot be reached; often transient."""
    code = "UNAVAILABLE"


class DataLossError(Error):
    """Data was lost beyond what the job allows."""
    code = "DATA_LOSS"


class UnauthenticatedError(Error):
    """TLS or data-packet authentication failed."""
    code = "UNAUTHENTICATED"


# By absl/gRPC status code number, as the binding raises them.
BY_NUMBER = {1: CancelledError, 2: UnknownError, 3: InvalidArgumentError, 4: DeadlineExceededError,
             5: NotFoundError, 6: AlreadyExistsError, 7: PermissionDeniedError, 8: ResourceExhaustedError,
             9: FailedPreconditionError, 10: AbortedError, 11: OutOfRangeError, 12: UnimplementedError,
             13: InternalError, 14: UnavailableError, 15: DataLossError, 16: UnauthenticatedError}
BY_CODE = {cls.code: cls for cls in BY_NUMBER.values()}


def from_text(text, prefix=""):
    """The exception for a status as text ("ABORTED: ..."), of its code's class; `prefix` goes
    before the text. Text without a known code gives a dlcp.Error."""
    code = str(text).split(":", 1)[0]
    return BY_CODE.get(code, Error)(f"{prefix}{text}")


__all__ = ["Error", "from_text"] + [cls.__name__ for cls in BY_NUMBER.values()]
