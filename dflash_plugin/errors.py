"""Errors a user can act on: each names what does not fit and how to fix it."""


class DFlashError(Exception):
    """Base class for every error this package raises on bad input."""


class CheckpointError(DFlashError):
    """A drafter checkpoint is missing, corrupt or not in the DFlash format."""


class MismatchError(DFlashError):
    """A drafter does not fit the target it is paired with (vocab, hidden size, layer ids)."""


class TargetUnavailableError(DFlashError):
    """The embedded default target could not be obtained."""
