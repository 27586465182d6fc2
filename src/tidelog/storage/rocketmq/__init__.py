"""The RocketMQ storage engine: one CommitLog for all topics, ConsumeQueues and IndexFiles
(reference/rocketmq-storage.md)."""
