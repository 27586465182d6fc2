"""The modules of the broker benchmark, bench/broker_vs_peers.py (its entry point): harness.py (processes, ports,
timing, CPU), clients.py (what a worker process runs), systems.py (one class per system; running one test),
report.py (ratios, tables, plot, the docs section) and profile.py (py-spy on the broker)."""
