"""The ledger's shape: one repository per job, and a facade whose every method names the
repository that does the work.

``Ledger`` keeps a method per public method of its repositories, written out so that grep and
"go to definition" lead from ``ledger.append_events`` to ``EventRepository.append_events``. A
written-out signature can drift from the one it forwards to (a default changed in one place);
these tests make such drift, a method forwarded to the wrong repository or not at all, and a
repository's method the facade forgot, fail.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relaygraph.store import Ledger
from relaygraph.store._core import LedgerCore


@pytest.fixture
def unopened(tmp_path: Path) -> Iterator[Ledger]:
    """A ledger whose database is never opened: its shape is all these tests read."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    yield ledger
    ledger.close()


def repositories(ledger: Ledger) -> dict[str, Any]:
    """The ledger's repositories by the attribute that holds each: every attribute that is
    given the ledger's core."""
    return {
        name: value
        for name, value in vars(ledger).items()
        if getattr(value, "_core", None) is ledger.core
    }


def public_names(cls: type) -> list[str]:
    return [name for name in vars(cls) if not name.startswith("_")]


def forwarding_call(method: Any) -> ast.Call | ast.Attribute:
    """What the facade's one-line method returns (a property's function too)."""
    function = method.fget if isinstance(method, property) else method
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    statements = body.body[1:] if ast.get_docstring(body) is not None else body.body
    assert len(statements) == 1 and isinstance(statements[0], ast.Return | ast.Expr), (
        f"Ledger.{function.__name__} is more than one forwarding statement"
    )
    value = statements[0].value
    assert isinstance(value, ast.Call | ast.Attribute)
    return value


def target_of(value: ast.Call | ast.Attribute) -> tuple[str, str]:
    """``(attribute, method)`` of ``self.<attribute>.<method>(...)``."""
    attribute = value.func if isinstance(value, ast.Call) else value
    assert isinstance(attribute, ast.Attribute)
    holder = attribute.value
    assert isinstance(holder, ast.Attribute) and isinstance(holder.value, ast.Name)
    assert holder.value.id == "self"
    return holder.attr, attribute.attr


def test_the_ledger_holds_one_repository_per_job(unopened: Ledger) -> None:
    held = repositories(unopened)
    classes = [type(repository) for repository in held.values()]
    assert len(held) >= 12 and len(set(classes)) == len(classes)
    assert all(cls.__name__.endswith("Repository") for cls in classes)
    # Each repository's module holds that repository alone.
    assert len({cls.__module__ for cls in classes}) == len(classes)
    # No method name is in two repositories: each facade method has one place to lead to.
    owners: dict[str, str] = {}
    for attribute, repository in held.items():
        for name in public_names(type(repository)):
            assert name not in owners, f"{name} is in {owners[name]} and {attribute}"
            owners[name] = attribute


def test_every_repository_method_has_a_facade_method_that_forwards_to_it(
    unopened: Ledger,
) -> None:
    for attribute, repository in repositories(unopened).items():
        cls = type(repository)
        for name in public_names(cls):
            assert name in vars(Ledger), f"Ledger has no {name} ({cls.__name__})"
            own, facade = vars(cls)[name], vars(Ledger)[name]
            assert isinstance(own, property) == isinstance(facade, property), name
            assert target_of(forwarding_call(facade)) == (attribute, name)
            if isinstance(own, property):
                continue
            assert inspect.signature(facade) == inspect.signature(own), name
            # Every parameter is passed on as it came: positional ones in order, the
            # keyword-only ones by name, and ``*args``/``**kwargs`` as such.
            call = forwarding_call(facade)
            assert isinstance(call, ast.Call)
            passed = [ast.unparse(argument) for argument in call.args] + [
                f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}"
                for k in call.keywords
            ]
            expected = []
            for parameter in list(inspect.signature(own).parameters.values())[1:]:
                if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
                    expected.append(f"{parameter.name}={parameter.name}")
                elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                    expected.append(f"*{parameter.name}")
                elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                    expected.append(f"**{parameter.name}")
                else:
                    expected.append(parameter.name)
            assert passed == expected, name


def test_every_facade_method_leads_to_a_repository_or_the_core(unopened: Ledger) -> None:
    held = repositories(unopened)
    for name in public_names(Ledger):
        attribute, method = target_of(forwarding_call(vars(Ledger)[name]))
        assert method == name
        owner = unopened.core if attribute == "core" else held[attribute]
        assert hasattr(owner, name), f"Ledger.{name} leads to {type(owner).__name__}, lacking it"
    assert isinstance(unopened.core, LedgerCore)
