"""The exceptions moekit raises: one class per moekit::ErrorCode, all under moekit.Error."""

from __future__ import annotations


class Error(Exception):
    """A moekit error: `code` is the ErrorCode's name, `message` one sentence naming the value."""

    code: str = "internal"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgumentError(Error, ValueError):
    """A value the caller passed is out of range or inconsistent (dtype, shape, device, ...)."""

    code = "invalid_argument"


class InvalidSpecError(Error, ValueError):
    """Spec.validate() found violations (all of them are in the message, one per line)."""

    code = "invalid_spec"


class UnsupportedError(Error):
    """No implementation can run this layer here; the message carries the resolver's report."""

    code = "unsupported"


class FormatMismatchError(Error, ValueError):
    """Weights of another format than the layer was built for."""

    code = "format_mismatch"


class BadFileError(Error):
    """A file is malformed, truncated, or lacks a tensor."""

    code = "bad_file"


class FileAccessError(Error):
    """The OS refused to read or write a file (ErrorCode io)."""

    code = "io"


class CudaError(Error):
    """A CUDA runtime call failed."""

    code = "cuda"


class CommError(Error):
    """A collective failed."""

    code = "comm"


class NotFoundError(Error, LookupError):
    """A name (preset, implementation, model family) is unknown."""

    code = "not_found"


class InternalError(Error):
    """A bug in moekit."""

    code = "internal"


# By moekit::ErrorCode's stable numeric value (include/moekit/status.hpp).
_BY_CODE: dict[int, type[Error]] = {
    1: InvalidArgumentError,
    2: InvalidSpecError,
    3: UnsupportedError,
    4: FormatMismatchError,
    5: BadFileError,
    6: FileAccessError,
    7: CudaError,
    8: CommError,
    9: NotFoundError,
    10: InternalError,
}


def error_class(code: int) -> type[Error]:
    """The class the extension raises for ErrorCode `code`."""
    return _BY_CODE.get(code, Error)
