"""Argument types shared by the command line's parsers (stdlib only: keeps --help fast)."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""What a byte that is not UTF-8 becomes in ``sys.argv`` (Python decodes it with
``surrogateescape``): no database, JSON or file name written as UTF-8 can hold it."""


def agent_model(value: str) -> tuple[str, str]:
    """``AGENT=SPEC`` → ``(agent, spec)``."""
    agent, sep, spec = value.partition("=")
    if not sep or not agent.strip() or not spec.strip():
        raise argparse.ArgumentTypeError(
            f"expected AGENT=SPEC, for example coder=openai:gpt-4.1, got {value!r}"
        )
    return agent.strip(), spec.strip()


def positive(value: str) -> int:
    """A whole number of at least 1."""
    if not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value!r}")
    return int(value)


def step_number(value: str) -> int:
    """A step number: a whole number of 0 or more."""
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {value!r}")
    return int(value)


def _number(value: str, accepts: Callable[[float], bool], expected: str) -> float:
    """``value`` as a finite number that ``accepts``; the error says what was ``expected``.

    ``nan`` and ``inf`` parse as floats but are refused: no limit, amount or share is one.
    """
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and accepts(number)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
    return number


def days(value: str) -> float:
    """A number of days, above 0 (``0.5`` is twelve hours)."""
    return _number(value, lambda number: number > 0, "a number of days above 0")


def seconds(value: str) -> float:
    """A number of seconds, above 0 (a timeout of none fails for nothing)."""
    return _number(value, lambda number: number > 0, "a number of seconds above 0")


def usd(value: str) -> float:
    """An amount of US dollars, 0 or more (``0.5``, ``12``)."""
    return _number(value, lambda number: number >= 0, "an amount of USD, 0 or more")


def share(value: str) -> float:
    """A share from 0 to 1 (``0.9`` is 90%)."""
    return _number(value, lambda number: 0 <= number <= 1, "a share between 0 and 1 (0.9 for 90%)")


def port(value: str) -> int:
    """A TCP port, 1 to 65535."""
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {value!r}")
    return int(value)


def utf8_text(value: str) -> str:
    """Text that UTF-8 can hold: an id, a name or a reason, as the ledger stores it.

    A byte that is not UTF-8 in an argument reaches Python as a lone surrogate, which the
    ledger would refuse deep inside a query; it is refused here, naming the bytes.
    """
    if _LONE_SURROGATE.search(value):
        try:
            shown = repr(value.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:  # A surrogate that came from no byte (main(argv) in-process).
            shown = repr(value)
        raise argparse.ArgumentTypeError(f"expected UTF-8 text, got {shown}")
    return value


TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What the task service accepts as a registered team's name (``PUT /v1/teams/{name}``):
the server's own rule, which a test holds this copy to."""


def team_name(value: str) -> str:
    """A registered team's name: ``teams push --name``, checked before it goes in a URL
    (``../x`` would change the request's path, and be answered 404 Not Found)."""
    if not TEAM_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"team name {value!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def data_folder(value: str) -> Path:
    """``--home``: a folder's path; an empty one would silently be the working directory."""
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"expected the data directory's path, got {value!r} "
            "(leave --home out for $RELAYGRAPH_HOME or ~/.relaygraph)"
        )
    return Path(utf8_text(value))


def json_object(value: str) -> dict[str, Any]:
    """A JSON object, such as the arguments of ``resume --edit``."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of arguments, got {value!r}")
    return parsed


JSON_HELP = "print one JSON object on stdout and nothing else"


def add_json_argument(parser: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    """``--json``: the command prints JSON instead of text."""
    parser.add_argument("--json", action="store_true", help=help)


def add_policy_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--policy FILE``: a policy file (TOML, docs/policies.md)."""
    parser.add_argument("--policy", metavar="FILE", type=Path, help=help)


def add_model_arguments(
    parser: argparse.ArgumentParser,
    *,
    model_help: str,
    agent_model_help: str,
    agent_metavar: str = "AGENT=SPEC",
) -> None:
    """``--model`` and the repeatable ``--agent-model``, for ``run``, ``replay`` and
    ``eval``."""
    parser.add_argument("--model", metavar="SPEC", help=model_help)
    parser.add_argument(
        "--agent-model",
        metavar=agent_metavar,
        type=agent_model,
        action="append",
        default=[],
        help=agent_model_help,
    )


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """``--topology`` and its options, for ``run``, ``eval`` and ``graph``."""
    from relaygraph.topology import OUTPUT_MODES, TOPOLOGIES

    parser.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        help="how the agents are arranged: relaygraph's structured supervisor (the default, "
        "unless a team file says otherwise), a swarm (langgraph-swarm), or LangGraph's "
        "tool-calling supervisor (see docs/topologies.md)",
    )
    parser.add_argument(
        "--start-agent",
        metavar="AGENT",
        help="swarm only: the agent a new thread starts with (default: the first agent)",
    )
    parser.add_argument(
        "--output-mode",
        choices=OUTPUT_MODES,
        help="supervisor-tools only: what an agent's visit adds to the supervisor's messages "
        "(default last_message)",
    )


def topology_of(args: argparse.Namespace, default: Any = None) -> Any:
    """The :class:`~relaygraph.topology.Topology` the arguments ask for; ``default`` (the
    team's own, when it has one) when they name none.

    Raises:
        ConfigError: An option of another topology (``--start-agent`` without swarm, ...).
    """
    from relaygraph.topology import Topology

    if args.topology is None and args.start_agent is None and args.output_mode is None:
        return default if default is not None else Topology()
    kind = args.topology or (default.kind if default is not None else "structured")
    return Topology.parse(kind, start_agent=args.start_agent, output_mode=args.output_mode)
