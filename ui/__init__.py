"""The SRE dashboards (Streamlit): `fleetlens ui` serves app.py, whose pages are in views/; errors.py
holds the errors it raises, as one tree (UiError)."""
