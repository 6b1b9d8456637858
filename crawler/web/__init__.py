"""The web layer: pure parsing, no I/O (bytes and strings in, URLs and rules out)."""
