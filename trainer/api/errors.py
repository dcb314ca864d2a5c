"""The trainer's configuration error under Lightning's name."""


class MisconfigurationException(ValueError):
    """A setting, argument or hook that cannot work as given (Lightning's name for it; a ValueError,
    so ``except ValueError`` catches it as it catches the trainer's other refusals of a value)."""
