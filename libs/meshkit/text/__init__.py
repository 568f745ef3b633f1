"""Text handling without I/O: sentences, evidence text, markup, front matter (README.md)."""
