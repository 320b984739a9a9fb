"""``relaygraph doctor``'s arguments; :func:`relaygraph.models.run_doctor` runs the probes.

Only argparse is imported here, so ``relaygraph --help`` stays quick.
"""

from __future__ import annotations

import argparse
from typing import Any

from relaygraph.cli._argtypes import add_json_argument, seconds

__all__ = ["add_doctor_parser"]


def add_doctor_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``doctor`` command to ``relaygraph``'s sub-commands; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor",
        help="check what a Chat Completions server supports",
        description="Probe the server behind an openai: model spec (OPENAI_BASE_URL, or "
        "--base-url) with the requests a team sends, print what works and the spec "
        "options to use. Exit code 0 when a team can run on it, 1 when it cannot.",
    )
    parser.add_argument(
        "--model",
        metavar="SPEC",
        required=True,
        help="the model to probe: openai:MODEL, with its options if it has any",
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="the server's base URL, for example http://localhost:8080/v1 "
        "(default: $OPENAI_BASE_URL, else OpenAI)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=seconds,
        default=120.0,
        help="seconds each probe may take, unless the spec sets timeout (default 120)",
    )
    add_json_argument(parser, "print one JSON object")
    return parser
