"""cloudd, the cloud tier: it stores what gateways upload (exactly once), builds datasets, runs
training jobs under torchrun, aggregates federated updates, keeps model versions and tells gateways
about them, and serves the /v1 API, the dashboard and cloudctl. docs/architecture.md maps the
subpackages; ``cloud.server`` is the process."""
