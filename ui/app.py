"""fleetlens's Streamlit app: `fleetlens ui` serves it; every page reads through analytics.

streamlit run ui/app.py     # with FLEETLENS_UI_HUB or FLEETLENS_UI_STORE set (see ui.environment)
"""

from __future__ import annotations

import streamlit as st

from ui import window

st.set_page_config(page_title="fleetlens", layout="wide")
pages = st.navigation(
    [
        st.Page("views/fleet.py", title="Fleet", default=True),
        st.Page("views/node.py", title="Node"),
        st.Page("views/anomalies.py", title="Anomalies and alerts"),
        st.Page("views/actions.py", title="Actions"),
        st.Page("views/postmortem.py", title="Postmortem"),
    ]
)
window.pick()
pages.run()
