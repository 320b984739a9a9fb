"""The audit dashboard's parts: sessions, the handoff graph, charts, templates and assets.

The router that serves them is :func:`relaygraph.api._ui.ui_router`; the templates
(``templates/``) and the stylesheet and script (``static/``) ship inside the package, so the
dashboard needs no CDN and no build step.
"""

from relaygraph.api.ui._settings import DashboardSettings

__all__ = ["DashboardSettings"]
