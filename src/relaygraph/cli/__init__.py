"""The ``relaygraph`` command line: argument parsing, the commands, and the console output.

``_main`` dispatches what ``_parser`` reads to ``_commands`` (heavy modules are imported
inside the commands, so ``relaygraph --help`` answers at once); ``_argtypes`` checks flag
values; ``_preflight`` checks what a command needs around it (the data directory, the
ledger, the server's address, an output folder) before it starts; ``_console`` prints a
run's progress and result; ``_evals`` is ``relaygraph eval``.
"""

from relaygraph.cli._main import main

__all__ = ["main"]
