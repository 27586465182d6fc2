"""`tidelog serve`: the Kafka-protocol broker. broker.py is the composition root; see docs/architecture.md."""
