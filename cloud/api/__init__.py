"""cloud.api: cloudd's HTTP routes, one small module per route group.

Each module has ``setup(app: web.Application) -> None`` that adds its routes; ``cloud.server``
lists the groups in ``ROUTE_GROUPS``. A new feature (jobs, models, fleet) adds a module here and
one line there. Handlers reach shared state only through the keys in ``cloud.api.context``.
"""
