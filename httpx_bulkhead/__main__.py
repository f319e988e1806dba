"""Command line: ``python -m httpx_bulkhead demo [options]`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import _demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m httpx_bulkhead",
        description="httpx-bulkhead command line tools.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="a slow host beside a fast one, with httpx's shared pool and with bulkheads",
        description=(
            "Start a slow and a fast HTTP/1.1 server on 127.0.0.1, saturate the slow one and"
            " call the fast one at a steady rate, once through httpx's default transport (one"
            " pool of N connections) and once through BulkheadTransport (N//2 per host), with"
            " the same pool timeout; show each compartment live, then both results side by"
            " side."
        ),
        epilog=(
            "Exit status: 0 if the bulkhead run served every fast call with a p99 below"
            f" {_demo.FAR_BELOW:.0%} of --slow-seconds, else 1 (the reason is printed)."
            " Nothing leaves 127.0.0.1."
        ),
    )
    _demo.add_arguments(demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return _demo.main(args)
    raise AssertionError(f"unknown command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
