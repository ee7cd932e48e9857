"""cloud.federated: asynchronous aggregation of the model updates gateways upload.

Owns the federated job (one model), its global versions, the aggregators (``strategies.py``, the
math in ``aggregate.py``), the reading of update records from the dataset store (``feed.py``) and
the route group ``cloud/api/federated.py`` (job, status, global model download). See docs/federated.md.
"""
