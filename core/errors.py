"""The core's exceptions. Kept apart so that a compiled build of the core (which cannot compile
a subclass of a built-in exception) leaves them as Python."""


class OutOfBlocksError(RuntimeError):
    """Raised when an operation needs more free blocks than the pool has; nothing changed."""
