"""The ledger's shape: one repository per job, and a facade whose every method names the
repository that does the work.

``Ledger`` keeps an attribute per public method of its repositories,
``append_events = forward("events", EventRepository.append_events)``, so that grep and "go
to definition" lead from ``ledger.append_events`` to ``EventRepository.append_events``.
These tests make a method forwarded to the wrong repository or not at all, and a
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
from relaygraph.store._ledger import forward


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


def target_of(facade: Any) -> tuple[str, str]:
    """``(attribute, method)`` that a facade attribute leads to: a :class:`forward`'s, or
    ``self.<attribute>.<method>`` that a property's one statement returns."""
    if isinstance(facade, forward):
        return facade.repository, facade.method.__name__
    assert isinstance(facade, property), f"{facade!r} is neither a forward nor a property"
    assert facade.fget is not None
    tree = ast.parse(textwrap.dedent(inspect.getsource(facade.fget)))
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    statements = body.body[1:] if ast.get_docstring(body) is not None else body.body
    assert len(statements) == 1 and isinstance(statements[0], ast.Return), (
        f"Ledger.{body.name} is more than one forwarding statement"
    )
    attribute = statements[0].value
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


def test_every_repository_method_is_forwarded_to_its_repository(unopened: Ledger) -> None:
    for attribute, repository in repositories(unopened).items():
        cls = type(repository)
        for name in public_names(cls):
            assert name in vars(Ledger), f"Ledger has no {name} ({cls.__name__})"
            own, facade = vars(cls)[name], vars(Ledger)[name]
            assert target_of(facade) == (attribute, name)
            if isinstance(own, property):
                assert isinstance(facade, property), name
                continue
            assert isinstance(facade, forward), name
            # The very function the repository defines: the one a call runs.
            assert facade.method is own, name
            assert getattr(unopened, name) == getattr(repository, name), name


def test_every_facade_method_leads_to_a_repository_or_the_core(unopened: Ledger) -> None:
    held = repositories(unopened)
    for name in public_names(Ledger):
        facade = vars(Ledger)[name]
        attribute, method = target_of(facade)
        assert method == name
        owner = unopened.core if attribute == "core" else held[attribute]
        assert hasattr(owner, name), f"Ledger.{name} leads to {type(owner).__name__}, lacking it"
        if isinstance(facade, forward):
            assert facade.method is vars(type(owner))[name], name
    assert isinstance(unopened.core, LedgerCore)


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, step: int, *, times: int = 1) -> int:
        """Add ``step`` ``times`` times."""
        self.count += step * times
        return self.count


class _Facade:
    def __init__(self) -> None:
        self.counter = _Counter()

    add = forward("counter", _Counter.add)


def test_a_forwarded_method_is_bound_on_an_instance_and_callable_on_the_class() -> None:
    facade = _Facade()
    assert facade.add == facade.counter.add
    assert facade.add(2, times=3) == 6
    # As a method's function is called on its class: what a test that wraps it calls.
    assert _Facade.add(facade, 1) == 7
    assert facade.counter.count == 7
    assert repr(vars(_Facade)["add"]) == "forward('counter', _Counter.add)"
    assert inspect.signature(_Facade.add) == inspect.signature(_Counter.add)
    assert _Facade.add.__doc__ == _Counter.add.__doc__


def test_a_forwarded_method_keeps_its_name() -> None:
    # Python before 3.12 raises what __set_name__ raised as the cause of a RuntimeError.
    with pytest.raises((TypeError, RuntimeError)) as raised:

        class _Renamed:
            plus = forward("counter", _Counter.add)

    error = raised.value if isinstance(raised.value, TypeError) else raised.value.__cause__
    assert isinstance(error, TypeError)
    assert "_Renamed.plus forwards to _Counter.add" in str(error)
