"""Training-item selection by toggle rate: a per-item tracker (``ToggleTracker``) merged across
ranks at epoch end, and a sampler (``ToggleSampler``) that picks the next epoch's items."""
