"""The state layer: what a crawl keeps on kvstore (frontier, page records, bad hosts)."""
