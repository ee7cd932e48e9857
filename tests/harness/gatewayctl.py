"""gatewayctl run in this process (its ``main``), as an operator runs it against a gateway."""

from __future__ import annotations

import contextlib
import io
import json


def broker_args(broker_url: str, gateway: str = "gw1", timeout_s: float = 5.0) -> list[str]:
    """Connection arguments for a plain (anonymous) broker; a SecureBroker has ``ctl_args``."""
    return ["--broker", broker_url, "--gateway", gateway, "--timeout", str(timeout_s)]


def ctl(*args: str) -> tuple[int, str, str]:
    """gatewayctl's main() in this process: (exit code, stdout, stderr)."""
    from gateway.ctl import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def ctl_json(*args: str) -> dict:
    """``ctl(*args, "--json")``, which must exit 0; its answer."""
    code, out, err = ctl(*args, "--json")
    assert code == 0, (code, out, err)
    return json.loads(out)
