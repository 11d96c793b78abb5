"""Error types of expected failures: bad input that a user can fix.

The command-line shells catch ``InputError`` (and the standard ``ValueError`` /
``FileNotFoundError`` family) and print one line naming the problem, exit status 2, no
traceback. Library code raises the most specific subclass so that callers can tell a bad
checkpoint from a bad dataset.
"""

from __future__ import annotations


class InputError(ValueError):
    """An expected failure caused by input: a bad name, a missing, truncated or malformed file,
    an impossible size. The message names the offending thing and what was expected."""


class ExportError(InputError):
    """A trained-model export (``params.msgpack`` + ``config.json``) that is missing, truncated,
    corrupt or does not match its config."""


class DatasetError(InputError):
    """A dataset directory or file that is missing, empty, malformed or in no known layout."""


__all__ = ["InputError", "ExportError", "DatasetError"]
