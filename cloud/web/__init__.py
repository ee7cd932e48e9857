"""The status dashboard: static files (``static/``: plain JS, SVG charts, no CDN) served by cloudd at /."""
