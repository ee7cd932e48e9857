"""The dashboard's files as cloudd serves them: every script in cloud/web/static is loaded by
index.html (none missing, none left out), and none of them reaches outside cloudd (no CDN, no
https URL): the page works on a network with no way out."""

from __future__ import annotations

import re
import urllib.request

from cloud.web.routes import STATIC_DIR


def test_index_loads_every_script_and_nothing_from_outside(cloudd):
    with urllib.request.urlopen(f"{cloudd.url}/", timeout=10) as response:
        html = response.read().decode()
    loaded = re.findall(r'<script src="/web/([\w.-]+)"></script>', html)
    assert sorted(loaded) == sorted(p.name for p in STATIC_DIR.glob("*.js"))
    assert "http" not in html.replace("http-equiv", "")
    for asset in [*loaded, "style.css"]:
        with urllib.request.urlopen(f"{cloudd.url}/web/{asset}", timeout=10) as response:
            text = response.read().decode()
        assert "https://" not in text and "cdn" not in text.lower(), asset
