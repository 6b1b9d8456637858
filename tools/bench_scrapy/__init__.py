"""Scrapy's side of ``tools/bench_crawl.py``: a spider and a runner for the benchmark-only venv.

These modules import Scrapy and Twisted, which are not dependencies of the
project: they run only inside the venv that ``bench_crawl.py`` creates
(``~/.cache/kvcrawl-bench/scrapy-venv``), as ``python -m tools.bench_scrapy.run``.
"""
