"""Collection names, document ids, metadata filters, collection records (README.md)."""
