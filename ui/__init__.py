"""The SRE dashboards (Streamlit): `fleetlens ui` serves app.py, whose pages are in views/."""
