"""The core's exceptions."""


class OutOfBlocksError(RuntimeError):
    """Raised when an operation needs more free blocks than the pool has; nothing changed."""
