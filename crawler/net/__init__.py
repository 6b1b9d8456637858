"""The network layer: sockets (DNS cache, connections, one bounded fetch, its watchdog)."""
