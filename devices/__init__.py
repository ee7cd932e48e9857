"""devices package."""
