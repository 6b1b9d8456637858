"""The read layer: what reads a crawl on disk, read-only (listing, show, export)."""
