"""cloudctl: the operator's command line for a running cloudd (``cloudctl = cloud.ctl:main``).

    cloudctl [--url URL] [--token TOK] status|jobs|models|fleet [--json]
                                         (status: also a progress bar per live job)
    cloudctl datasets [--json]           gateways' records per device, and the uploaded files
    cloudctl datasets upload NAME FILE   an .npz (x, y) or torch tensor file for upload:NAME jobs
    cloudctl train [--file spec.toml|.json] [--model M --dataset D --schedule S ...] [--wait]
    cloudctl watch JOB [--json]          live progress bar and figures (plain lines when not a TTY)
    cloudctl job JOB | cancel JOB [--json]

One module per part: ``http`` (requests, ``CtlError``), ``text`` (pure formatting), ``train``
(the spec from flags and files, following a job), ``datasets``, ``main`` (the parser and the
commands). The token may also come from $CLOUDCTL_TOKEN. Invariant: exit 0 only when cloudd
answered 2xx (and, for ``train --wait`` / ``watch``, the job succeeded); an unreachable cloudd or
an HTTP error prints one line saying which and exits 1.
"""

from cloud.ctl.http import CtlError
from cloud.ctl.main import build_parser, main, run
from cloud.ctl.text import format_jobs, format_status, format_table, progress_line

__all__ = [
    "CtlError",
    "build_parser",
    "format_jobs",
    "format_status",
    "format_table",
    "main",
    "progress_line",
    "run",
]
