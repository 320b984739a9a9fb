"""What a finished run prints, and the exit codes of the commands that run tasks (``run``,
``replay``): one place, so every command that runs a task ends the same way."""

from __future__ import annotations

import json
import sys
from typing import Any

from relaygraph.errors import ConfigError, RelaygraphError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 3

LOCAL_MODEL_NOTE = (
    "This ran on the embedded model local:smollm2 (SmolLM2-135M, on this machine): it "
    "answers from the documents it finds, by constrained choices, and reasons little. For "
    "open-ended work use --model openai:gpt-4o-mini with OPENAI_API_KEY "
    "set, or OPENAI_BASE_URL pointing at any Chat Completions server (vLLM, Ollama, LiteLLM)."
)


def report_error(exc: RelaygraphError) -> int:
    """Print a command's error in one line and return the exit code it earns: 2 for a
    mistake in the input (:class:`~relaygraph.errors.ConfigError`), 1 for a failure."""
    print(f"relaygraph: error: {exc}", file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED


def report_result(result: Any, *, as_json: bool) -> int:
    """Print a run's result (JSON or the console's summary) and return the exit code it
    earns."""
    from relaygraph.cli._console import print_result

    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    else:
        print_result(result)
    if any(spec.startswith("local:") for spec in result.models.values()):
        print(LOCAL_MODEL_NOTE, file=sys.stderr)
    if result.status == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK if result.ok else EXIT_FAILED
