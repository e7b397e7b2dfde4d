"""Errors a user can cause: the CLI and the pytest plugin print them as one line (exit code 2 / 4).

The library's contract is transformers': a bad value raises `ValueError` naming the value.
`UsageError` is the `ValueError` whose message is also written for the command line: what was
wrong and what to do.
"""


class UsageError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""

    exit_code = 2


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when the message is empty)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
