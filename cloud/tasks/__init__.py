"""The tasks a gateway's placement plan gives the cloud, as cloudd runs them (docs/cloud.md): sensor
windows aggregated and judged, camera inferences summarised, uploaded frames inferred."""
