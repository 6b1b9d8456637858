"""The run layer: the running crawl, its threads (engine, politeness, robots cache, status)."""
