"""edgefed's tests. Shared tools live in tests.harness (see its docstring); tests/conftest.py holds
the fixtures only."""
