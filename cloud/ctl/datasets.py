"""``cloudctl datasets``: what gateways uploaded (records per device) and the dataset files users
uploaded for their jobs; ``cloudctl datasets upload NAME FILE`` adds one (PUT /v1/datasets/files/NAME).

Invariant: an upload prints cloudd's answer only after cloudd stored and checked the whole file
(201, or 200 when the same bytes were there); a refusal is a ``CtlError`` with cloudd's reason.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from pathlib import Path
from typing import Any

from cloud.ctl.http import get_json, put_file
from cloud.ctl.text import format_datasets, format_uploads


def add_datasets_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    datasets = commands.add_parser(
        "datasets", parents=[common], help="gateways' records per device, and uploaded dataset files"
    )
    actions = datasets.add_subparsers(dest="datasets_action")
    upload = actions.add_parser(
        "upload", parents=[common], help="upload an .npz (arrays x, y) or torch tensor file {'x', 'y'}"
    )
    upload.add_argument("name", help="the dataset's name; jobs use it as dataset = 'upload:NAME'")
    upload.add_argument("file", type=Path)


def run_datasets(args: argparse.Namespace, base: str, now: float) -> int:
    token = args.token
    if args.datasets_action == "upload":
        url = f"{base}/v1/datasets/files/{urllib.parse.quote(args.name, safe='')}"
        meta = put_file(url, token, args.file, timeout=max(args.timeout, 300.0))
        if args.json:
            print(json.dumps(meta, indent=2))
        else:
            rows = "?" if meta["rows"] is None else meta["rows"]
            print(
                f"{meta['name']}: {meta['format']}, {rows} rows, {meta['size']} bytes, "
                f"sha256 {meta['sha256']}"
            )
        return 0
    records = get_json(base + "/v1/datasets", token, args.timeout)
    files = get_json(base + "/v1/datasets/files", token, args.timeout)
    if args.json:
        print(json.dumps({"gateways": records, "files": files}, indent=2))
    else:
        print(format_datasets(records, now) + "\n\n" + format_uploads(files, now))
    return 0
