"""The Kafka wire protocol, sans-I/O: frames and messages in, objects out, and back."""
