"""Alembic's entry point for the ledger's migrations.

``relaygraph db upgrade`` (``relaygraph.store.upgrade``) passes its own connection in
``config.attributes``. Run through the ``alembic`` command instead (to write a new
revision), it connects to ``sqlalchemy.url`` or, without one, to the ledger's default URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from relaygraph.store._engine import database_url, make_engine
from relaygraph.store._migrate import VERSION_TABLE
from relaygraph.store._models import Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    config = context.config
    url = database_url(config.get_main_option("sqlalchemy.url"))
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=Base.metadata, version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(url, immediate=True)
    try:
        with engine.begin() as own:
            _run(own)
    finally:
        engine.dispose()


_main()
