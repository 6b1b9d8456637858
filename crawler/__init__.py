"""crawler: a single-PC web crawler on kvstore (see DESIGN.md section 4).

The package is laid out in layers by what each part touches; a module imports
only from its own layer, the layers below it, and the shared ``config`` and
``exceptions`` (tests/crawler/test_layers.py checks it):

- ``web``: pure parsing, no I/O (URLs, links, robots.txt rules);
- ``net``: sockets (DNS cache, connections, fetch, watchdog);
- ``state``: crawl state on kvstore (frontier, page records, bad hosts, shard layout,
  outbox);
- ``run``: the running crawl, threads and processes (engine, politeness, status, robots
  cache, shards, the link exchange, the supervisor);
- ``read``: what reads a crawl on disk (listing, export);
- ``search``: the crawl's full-text index (extraction, indexing, queries), on ``read``;
- ``cli``: the command line, on top.
"""
