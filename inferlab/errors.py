"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""


class UsageError(Exception):
    """Bad input from the user: the message says what was wrong and what to do."""

    exit_code = 2
