"""Argument types shared by the command line's parsers (stdlib only: keeps --help fast)."""

from __future__ import annotations

import argparse


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
