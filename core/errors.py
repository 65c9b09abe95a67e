"""The core's exceptions."""


class OutOfBlocksError(RuntimeError):
    """Raised when an operation needs more free blocks than the pool has; nothing changed."""


class ConfigError(ValueError):
    """A configuration setting with a bad value: ``field`` names the setting, ``problem`` says
    what is wrong with it (``must be >= 1, got 0``), so that a command line can name its flag."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem
