"""The agents' tools, as LangChain tools that read their task's :class:`TaskContext`."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from langchain_core.tools import BaseTool, tool
from langgraph.prebuilt import ToolRuntime
from pydantic import ValidationError

from relaygraph.agents.context import TaskContext
from relaygraph.backends.kb import KnowledgeBase
from relaygraph.backends.sandbox import (
    SandboxUnavailableError,
    filesystem_isolation,
    run_python_sandboxed,
)
from relaygraph.backends.workspace import ArtifactStore, Workspace
from relaygraph.errors import ConfigError

__all__ = ["BUILTIN_TOOLS", "check_tool_args"]

log = logging.getLogger(__name__)


@tool(parse_docstring=True)
def search_docs(query: str, runtime: ToolRuntime[TaskContext], k: int = 5) -> str:
    """Search the knowledge base. Returns matching documents with their doc ids and titles.

    Args:
        query: Words to look for.
        k: How many results to return (1-20).
    """
    with KnowledgeBase(runtime.context.knowledge_base) as kb:
        hits = kb.search(query, k=k)
    if not hits:
        return f"No documents match {query!r}. Try other words."
    return "\n".join(f"[{h.doc_id}] {h.title}: {h.snippet}" for h in hits)


@tool(parse_docstring=True)
def read_doc(doc_id: str, runtime: ToolRuntime[TaskContext]) -> str:
    """Read one document of the knowledge base by its doc id (as shown by search_docs).

    Args:
        doc_id: The id in square brackets in a search result.
    """
    with KnowledgeBase(runtime.context.knowledge_base) as kb:
        doc = kb.read(doc_id)
    note = "\n[truncated]" if doc.truncated else ""
    return f"[{doc.doc_id}] {doc.title}\n\n{doc.text}{note}"


@tool(parse_docstring=True)
def run_python(code: str, runtime: ToolRuntime[TaskContext]) -> str:
    """Run Python code in a sandbox and return its exit code, stdout and stderr.

    The working directory is the task's workspace; there is no network.

    Args:
        code: A complete Python program; print what you want to see.
    """
    ctx = runtime.context
    if filesystem_isolation() is None:
        if ctx.sandbox_isolation_required:
            raise SandboxUnavailableError("run_python")
        _warn_unisolated()
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    hidden = [p for p in (ctx.data_dir, ctx.artifacts, ctx.knowledge_base) if p is not None]
    return run_python_sandboxed(
        code,
        workspace=ctx.workspace,
        limits=ctx.sandbox,
        hidden=hidden,
        quota=ctx.workspace_quota,
        counted=(ctx.artifacts,),
    ).to_text()


@functools.cache
def _warn_unisolated() -> None:
    # Once per process: whoever runs relaygraph on their own machine runs their own code,
    # and a warning per call would only be noise.
    log.warning(
        "run_python runs code without filesystem isolation: bubblewrap (bwrap) is not "
        "available, so the code can read and write every file of this user; install the "
        "'bubblewrap' package to isolate it (see docs/sandbox.md)"
    )


def _workspace(ctx: TaskContext) -> Workspace:
    """The task's workspace, its writes counted with its artifacts against its quota."""
    return Workspace(ctx.workspace, quota=ctx.workspace_quota, counted=(ctx.artifacts,))


def _artifact_store(ctx: TaskContext) -> ArtifactStore:
    """The task's artifacts, their saves counted with its workspace against its quota."""
    return ArtifactStore(ctx.artifacts, quota=ctx.workspace_quota, counted=(ctx.workspace,))


@tool(parse_docstring=True)
def write_file(path: str, content: str, runtime: ToolRuntime[TaskContext]) -> str:
    """Write a text file in the task's workspace.

    Args:
        path: A path relative to the workspace, such as "src/main.py".
        content: The file's full text.
    """
    written = _workspace(runtime.context).write_text(path, content)
    return f"Wrote {len(content)} characters to {path} ({written.name})."


@tool(parse_docstring=True)
def read_file(path: str, runtime: ToolRuntime[TaskContext]) -> str:
    """Read a text file from the task's workspace.

    Args:
        path: A path relative to the workspace.
    """
    return _workspace(runtime.context).read_text(path)


@tool(parse_docstring=True)
def save_artifact(name: str, content: str, runtime: ToolRuntime[TaskContext]) -> str:
    """Save a deliverable of the task (a report, a summary) under a file name.

    Args:
        name: A plain file name such as "report.md".
        content: The deliverable's full text.
    """
    artifact = _artifact_store(runtime.context).save(name, content)
    return f"Saved artifact {artifact.name} ({artifact.size_bytes} bytes)."


@tool(parse_docstring=True)
def list_artifacts(runtime: ToolRuntime[TaskContext]) -> str:
    """List the deliverables saved so far for this task."""
    artifacts = _artifact_store(runtime.context).list()
    if not artifacts:
        return "No artifacts yet."
    return "\n".join(f"{a.name} ({a.size_bytes} bytes)" for a in artifacts)


_NARROW = "relaygraph_narrow"
"""``relaygraph.models.local._chat.NARROW_KEY``: how the embedded model may call a tool, its
arguments narrowed from the conversation (docs/embedded-model.md). Plain data in the tools'
metadata, so this layer needs nothing of the model layer; other providers ignore it."""

# A query of a few of the request's own words, not the request pasted in: the one that
# holds the most of them (a later search in the visit takes the next). Offered alone, it
# needs no model call. On the dev questions of evals/kb/ the model, offered five, chose
# that one for 34 of 35, and a model call per question to choose it.
search_docs.metadata = {_NARROW: {"args": {"query": {"keywords": 4, "queries": 1}}}}
# An id that a search in this visit returned, never one made up; what it returns is a
# document that an answer quotes with its [doc_id]. The best hit only: on the dev questions
# of evals/kb/ the search's first hit was the document that answers for every question,
# while the model, offered the first two, sometimes read the other one.
read_doc.metadata = {
    _NARROW: {"args": {"doc_id": {"from_tool": "search_docs", "limit": 1}}, "sources": True}
}
# The deliverable quotes the cited results it was given, once.
save_artifact.metadata = {
    _NARROW: {
        "args": {"name": {"one_of": ["report.md"]}, "content": {"quotes": 3}},
        "max_calls": 1,
    }
}
# What was saved is worth listing only after saving.
list_artifacts.metadata = {_NARROW: {"after": ["save_artifact"]}}


BUILTIN_TOOLS: Mapping[str, BaseTool] = MappingProxyType(
    {
        t.name: t
        for t in (
            search_docs,
            read_doc,
            run_python,
            write_file,
            read_file,
            save_artifact,
            list_artifacts,
        )
    }
)
"""The built-in tools by name: what a tool name in an agent's ``tools`` refers to."""


def check_tool_args(
    name: str, args: Mapping[str, Any], tools: Mapping[str, BaseTool] = BUILTIN_TOOLS
) -> None:
    """Check arguments a person wrote for tool ``name`` (an ``edit`` of a paused call).

    Checked before the task goes on: edited arguments the tool refuses would otherwise fail
    on the model's side, after the decision was recorded.

    Raises:
        ConfigError: An unknown argument, a missing one, or one of the wrong type; the
            message names it and the value.
    """
    found = tools.get(name)
    if found is None:
        return  # Not a tool we know the schema of: nothing to check against.
    schema = found.tool_call_schema
    fields = getattr(schema, "model_fields", {})
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise ConfigError(
            f"{name} takes {', '.join(fields) or 'no arguments'}; "
            f"not {', '.join(map(repr, unknown))}"
        )
    try:
        schema.model_validate(dict(args))  # type: ignore[union-attr]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
            + ("" if e["type"] == "missing" else f" (got {e['input']!r})")
            for e in exc.errors()
        )
        raise ConfigError(f"arguments for {name}: {problems}") from None
