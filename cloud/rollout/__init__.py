"""Model lifecycle: the quality gate, stages and aliases, and the rollout controller (docs/models.md)."""
