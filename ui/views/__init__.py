"""The Streamlit app's pages: ui/app.py runs each file as a page. A package, so the import contract
sees them."""
