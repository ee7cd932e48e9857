"""Training jobs as cloudd runs them: specs, their persisted state, the manager that launches
``torchrun`` and follows its progress, the export of the trained model into the registry, and the
datasets built from what gateways uploaded."""
