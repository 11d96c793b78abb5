"""What the ``gridvqa`` and ``modality-bias`` command lines share: the output flags, checked
sizes, and one error path.

Output flags (every subcommand of both tools):

    --json         print one JSON object as the last line of stdout
    --quiet        no human summary and no progress bar (the JSON line is still printed)
    --no-progress  no progress bar (the human summary is still printed)

Subcommands: each is a ``Command`` (name, help, a function adding its arguments, its handler,
or sub-subcommands); ``build_parser`` turns a tuple of them into the parser.

Error path: ``main`` parses the arguments and runs the command. An expected failure (an
``InputError``, any ``ValueError`` including malformed JSON, an ``OSError`` such as a missing
file, a ``FloatingPointError`` from a non-finite loss, an argument argparse refuses) prints one
line ``<prog>: error: <message>`` to stderr and gives exit status 2, without a traceback. Any
other exception is a bug and propagates with its traceback. Set ``GRIDVQA_TRACEBACK=1`` to see
the traceback of an expected failure too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, NamedTuple

# Exception types that mean "bad input the user can fix". ValueError covers InputError and its
# subclasses, json.JSONDecodeError and UnicodeDecodeError (a binary file read as text).
EXPECTED = (ValueError, OSError, FloatingPointError)
EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line, ``<prog>: error: <message>``
    (status 2), like every other expected failure. Subparsers inherit the class."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {one_line(message)} "
                                  f"(see {self.prog} --help)\n")


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into spaces."""
    return " ".join(str(text).split())


def message(exc: BaseException) -> str:
    """The one-line message of an expected failure: an ``OSError`` as ``<path>: <reason>``,
    anything else as its text (or its type name when it has none)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return one_line(f"{where}: {exc.strerror}" if where else exc.strerror)
    if isinstance(exc, json.JSONDecodeError):
        return one_line(f"malformed JSON: {exc}")
    return one_line(str(exc)) or type(exc).__name__


def _bounded(kind, low, strict: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")) or (
                value <= low if strict else value < low):  # NaN, infinite, or out of range
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in "invalid <name> value" messages
    return parse


positive_int = _bounded(int, 0, True, "an integer >= 1")
nonnegative_int = _bounded(int, 0, False, "an integer >= 0")
positive_float = _bounded(float, 0.0, True, "a finite number > 0")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``, ``--quiet`` and ``--no-progress`` (see the module docstring)."""
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object as the last line of stdout")
    parser.add_argument("--quiet", action="store_true",
                        help="no human summary, no progress bar")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


class Command(NamedTuple):
    """One subcommand of a command line.

    ``name`` and one-line ``help`` as ``--help`` lists them; ``register(parser)`` adds the
    command's own arguments (the output flags are added for it); ``run(args) -> int`` is its
    handler (``args.fn``). A command with ``subcommands`` (``Command`` values) has no arguments
    or handler of its own: the chosen sub-subcommand's name goes to ``args.<dest>``.
    """

    name: str
    help: str
    register: Callable | None = None
    run: Callable | None = None
    subcommands: tuple = ()
    dest: str = "what"


def add_commands(subparsers, commands) -> None:
    """Add every ``Command`` of ``commands`` (recursively, its sub-subcommands) to
    ``subparsers`` (from ``add_subparsers``): a parser per command, its arguments, the output
    flags and ``fn``."""
    for c in commands:
        p = subparsers.add_parser(c.name, help=c.help, description=c.help)
        if c.subcommands:
            add_commands(p.add_subparsers(dest=c.dest, required=True), c.subcommands)
            continue
        if c.register is not None:
            c.register(p)
        add_output_flags(p)
        p.set_defaults(fn=c.run)


def build_parser(prog: str, description: str, commands, dest: str = "command") -> Parser:
    """A ``Parser`` named ``prog`` with one required subcommand per ``Command`` of
    ``commands``; the chosen name goes to ``args.<dest>``, the handler to ``args.fn``."""
    p = Parser(prog=prog, description=description)
    add_commands(p.add_subparsers(dest=dest, required=True), commands)
    return p


def show_progress(args) -> bool:
    """Whether a command run with ``args`` (from ``add_output_flags``) shows progress bars."""
    return not (args.quiet or args.no_progress)


def emit(args, human: str, payload: dict) -> None:
    """Print ``human`` unless ``--quiet``, then ``payload`` as one JSON line if ``--json``."""
    if human and not args.quiet:
        print(human)
    if args.json:
        print(json.dumps(payload, sort_keys=False))


def run(prog: str, fn, *args) -> int:
    """``fn(*args)`` with the error path of the module docstring: returns its status, or 2
    after printing ``<prog>: error: <message>`` for an expected failure."""
    try:
        return fn(*args)
    except EXPECTED as e:
        if os.environ.get("GRIDVQA_TRACEBACK"):
            raise
        print(f"{prog}: error: {message(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def main(parser: argparse.ArgumentParser, argv, prog_of, before=None) -> int:
    """Parse ``argv`` with ``parser`` and run ``args.fn(args)`` through ``run``.

    ``prog_of(args)`` names the command in error messages (e.g. "gridvqa generate");
    ``before(args)``, if given, runs first (process set-up). A usage error or ``--help``
    returns argparse's status instead of raising ``SystemExit``.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_BAD_INPUT)
    if before is not None:
        before(args)
    return run(prog_of(args), args.fn, args)


__all__ = ["EXPECTED", "EXIT_BAD_INPUT", "Parser", "Command", "add_commands", "build_parser",
           "one_line", "message", "positive_int", "nonnegative_int", "positive_float",
           "add_output_flags", "show_progress", "emit", "run", "main"]
