"""What `fleetlens ui` hands the app through the environment: where to read, and the drain limits.

The app never reads fleetlens's config itself (fleetlens imports ui, not the other way round), so the
command resolves it and passes the results here. Importing this module does not import Streamlit.
"""

from __future__ import annotations

from pathlib import Path

HUB = "FLEETLENS_UI_HUB"  # a hub's URL: read through its query API (the way to an embedded store)
STORE = "FLEETLENS_UI_STORE"  # a store DSN: a ClickHouse server, or a chdb:// directory no hub holds
LIMITS = "FLEETLENS_UI_LIMITS"  # the drain policy the hub enforces, as JSON (mode, limits, rules, ...)
APP = Path(__file__).with_name("app.py")  # the script `streamlit run` serves
