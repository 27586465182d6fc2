"""The RocketMQ storage engine: one CommitLog for all topics, ConsumeQueues and IndexFiles, in RocketMQ's store
layout (`commitlog/`, `consumequeue/<topic>/<queueId>/`, `index/`, `checkpoint`, `abort`)."""
