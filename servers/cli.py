"""`harnesslab` command line. Exit codes: 0 success/passed, 1 candidate failed or rejected
(`doctor`: something missing), 2 usage or environment error (the message says what to fix),
3 a `run` in which no agent attempt ran to completion. A mistyped command or flag gets the
closest known one and that command's usage."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import re
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import NoReturn

from pydantic import ValidationError

from harnesslab.tools.errors import HarnesslabError, InfrastructureError, UsageError, agent_text
from harnesslab.tools.settings import Settings

from . import (
    commands,
    compare_cmd,
    dashboard_cmd,
    doctor_cmd,
    import_cmd,
    lab_cmd,
    meta_cmd,
    report,
    run_cmd,
    serve_cmd,
    task_cmd,
)
from .cli_support import COMMANDS, HELP, command, settings_from, validation_text

# The subcommand modules, in the order `--help` lists them (each declares its commands with
# cli_support.command; none imports this module).
MODULES = (
    commands,
    serve_cmd,
    meta_cmd,
    run_cmd,
    lab_cmd,
    doctor_cmd,
    compare_cmd,
    import_cmd,
    task_cmd,
    dashboard_cmd,
)

_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse with a suggestion for a mistyped choice (subcommand, --runner, ...)."""

    def error(self, message: str) -> NoReturn:
        m = _CHOICE.search(message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def option_strings(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings]


def package_version() -> str:
    try:
        return dist_version("harnesslab")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser() -> tuple[Parser, dict[str, Parser]]:
    parser = Parser(
        prog="harnesslab",
        description="MCP toolkit for agents that optimize GPU kernels.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    parser.add_argument("--version", action="version", version=f"harnesslab {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subs: dict[str, Parser] = {}
    order = [m.__name__ for m in MODULES]
    listed = sorted(COMMANDS.items(), key=lambda kv: order.index(kv[1][1].__module__))
    for name, (add_args, _) in listed:
        p = sub.add_parser(name, help=HELP[name], description=HELP[name])
        add_args(p)
        subs[name] = p
    return parser, subs


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse argv; an unknown flag gets the closest flag of its command and that command's
    usage (argparse alone prints the top-level usage with no hint)."""
    parser, subs = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        target = subs.get(args.command or "", parser)
        known = target.option_strings()
        hints = [did_you_mean(x.split("=")[0], known) for x in extras if x.startswith("-")]
        target.error(f"unrecognized arguments: {' '.join(extras)}{''.join(hints)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.command:
        build_parser()[0].print_help(sys.stderr)
        return 2
    try:
        settings = Settings()
    except ValidationError as exc:  # a bad HARNESSLAB_* variable
        print(f"error: settings (HARNESSLAB_*): {validation_text(exc)}", file=sys.stderr)
        return 2
    _, handler = COMMANDS[args.command]
    try:
        return handler(args, settings_from(args, settings))
    except ValidationError as exc:  # a flag out of the range of what it configures
        return report_error(args, UsageError(
            f"{args.command}: {validation_text(exc)}",
            next_step=f"`harnesslab {args.command} --help` says what each flag takes",
        ))  # fmt: skip
    except HarnesslabError as exc:
        return report_error(args, exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def report_error(args: argparse.Namespace, exc: HarnesslabError) -> int:
    """An expected failure on stderr (and as JSON with --json); its exit code."""
    if getattr(args, "json", False):
        print(json.dumps({"status": "error", "error": exc.message, "next_step": exc.next_step}))
    text = agent_text(exc) if isinstance(exc, InfrastructureError) else exc.message
    print(f"error: {text.split(' Next: ')[0]}", file=sys.stderr)
    if exc.next_step:
        print(f"next: {exc.next_step}", file=sys.stderr)
    return exc.exit_code


__all__ = ["COMMANDS", "command", "main", "report"]
