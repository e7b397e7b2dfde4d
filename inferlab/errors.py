"""Errors the CLI turns into one line on stderr, each kind with its own exit code.

The library's contract is transformers': a bad value raises `ValueError` naming the value.
`UsageError` is the `ValueError` whose message is also written for the command line: what was
wrong and what to do.

Exit codes (the README's table lists them per command):

- 0: success; for `gate`, PASS
- 1: `gate` FAIL, and nothing else
- 2: a usage error: a bad argument, input file, model folder or configuration
- 3: `gate` INCONCLUSIVE
- 4: a result could not be written (full disk, read-only filesystem, no permission)
- 5: out of memory: a configuration that does not fit, refused or failed
- 70: an unexpected internal error (a bug: set INFERLAB_TRACEBACK=1 to see the traceback)
- 130: interrupted by Ctrl-C (SIGINT); 143: stopped by SIGTERM
"""

EXIT_USAGE = 2
EXIT_WRITE = 4
EXIT_MEMORY = 5
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class UsageError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""

    exit_code = EXIT_USAGE


class WriteError(OSError):
    """A result could not be written: the message names the file and where the data went instead."""

    exit_code = EXIT_WRITE


class DoesNotFit(MemoryError):
    """A configuration whose memory need exceeds the device's memory, refused before allocating it."""

    exit_code = EXIT_MEMORY


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so the same clean-up runs."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when the message is empty)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
