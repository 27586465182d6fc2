"""The Kafka storage engine: Kafka's on-disk layout, byte for byte."""
