"""What both storage engines share, so that neither imports the other.

- clock.py              the wall clock in milliseconds
- offset_checkpoint.py  Kafka's framed checkpoint files (`topic partition offset` entries)
- scheduler.py          the background thread for timed work (flushes, retention, delayed deletions)
- deletion.py           rename-now, delete-later of directories (file.delete.delay.ms)
- topic_registry.py     tidelog-topics.json: topic ids, partition counts, config overrides
- producer_state.py     idempotent-producer state and its snapshots
- index_file.py         RocketMQ's IndexFile format: the key index both engines can keep
"""
