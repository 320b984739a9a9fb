"""The task service's HTTP API (FastAPI): submit tasks, follow them, approve, cancel."""

from relaygraph.api._settings import ServiceSettings, load_settings
from relaygraph.api._streams import raise_open_file_limit
from relaygraph.api.app import create_app

__all__ = ["ServiceSettings", "create_app", "load_settings", "raise_open_file_limit"]
