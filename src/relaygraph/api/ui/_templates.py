"""The dashboard's Jinja2 templates and static assets, both shipped inside the package.

Templates escape everything they print (autoescape), and an undefined name is an error, so
a typo in a template fails its test instead of showing an empty cell.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

HERE = Path(__file__).parent
STATIC = HERE / "static"
MEDIA_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Asset:
    name: str
    body: bytes
    media_type: str
    version: str
    """A digest of the body: the URL changes when the file does, so it may be cached."""


@cache
def assets() -> dict[str, Asset]:
    """The files of ``static/``, read once: only these names are ever served."""
    found = {}
    for path in sorted(STATIC.iterdir()):
        if path.is_file() and path.suffix in MEDIA_TYPES:
            body = path.read_bytes()
            found[path.name] = Asset(
                name=path.name,
                body=body,
                media_type=MEDIA_TYPES[path.suffix],
                version=hashlib.sha256(body).hexdigest()[:12],
            )
    return found


def asset_url(name: str) -> str:
    return f"/ui/static/{name}?v={assets()[name].version}"


def number(value: float | int | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 60:
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _moment(value: datetime | str | None) -> datetime | None:
    if value is None or value == "":
        return None
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def when(value: datetime | str | None) -> str:
    moment = _moment(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def offset(at: datetime | str | None, start: datetime | str | None) -> str:
    """``+1.25 s``: how long after the task's start."""
    a, s = _moment(at), _moment(start)
    if a is None or s is None:
        return ""
    return f"+{(a - s).total_seconds():.2f} s"


def short(value: Any, limit: int = 120) -> str:
    text = " ".join(str("" if value is None else value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def one_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def amount(value: float, unit: str) -> str:
    """A budget figure in its unit: dollars, seconds or a count."""
    if unit == "usd":
        return usd(value)
    if unit == "s":
        return seconds(value)
    return number(value)


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        number=number,
        usd=usd,
        seconds=seconds,
        when=when,
        offset=offset,
        short=short,
        as_json=as_json,
        one_line=one_line,
        amount=amount,
    )
    env.globals.update(asset_url=asset_url)
    return env


def render(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
