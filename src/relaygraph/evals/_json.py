"""How an eval value becomes JSON: its dataclass fields, in their order, each as JSON.

Reports, results and checks are frozen dataclasses whose fields are the keys of their JSON
(``report.json``, the ledger's eval records, LangSmith's examples), so the field list is the
one place a key is named; a class whose JSON adds a computed key (a case's ``passes``) adds
it to what :func:`fields_json` gives.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def fields_json(value: DataclassInstance, *, leave_out: Collection[str] = ()) -> dict[str, Any]:
    """Each field of ``value`` but those in ``leave_out``, in the class's order, as JSON
    (:func:`json_value`)."""
    return {
        f.name: json_value(getattr(value, f.name)) for f in fields(value) if f.name not in leave_out
    }


def json_value(value: Any) -> Any:
    """``value`` as JSON: a tuple or list as a list of JSON values, a value with a ``to_json``
    method as what that gives, another dataclass as its fields; anything else (a string, a
    number, a dict) as it is."""
    if isinstance(value, tuple | list):
        return [json_value(item) for item in value]
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return fields_json(value)
    return value
