"""DescribeLogDirs (35, v1-v4): what this broker keeps in each of its log dirs, as Kafka 3.9 answers it.

Contract:

- Needs DESCRIBE on the cluster; refused, the answer is CLUSTER_AUTHORIZATION_FAILED with no log dirs (v3+ carry
  the error code; older versions see an empty list, as from Kafka).
- Every log dir is listed (its absolute path, error NONE), with the partitions asked for (null topics: every
  partition) that live in it - replicas this broker leads and follows alike; a partition asked for that is not
  here is left out. Per partition: its size in bytes (the engine's `size_in_bytes`), `offset_lag`, Kafka's
  max(high watermark - log end offset, 0) of the local replica (0 but for a follower whose high watermark from the
  leader ran ahead of what it copied), and `is_future_key` false (no replica moves between log dirs here).
- v4 adds each log dir's total and usable bytes (the file system's size and the space an unprivileged writer may
  still use, as Java's File.getTotalSpace/getUsableSpace).
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.errors import ErrorCode
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from pathlib import Path

    from tidelog.broker.authorizer import Authorizer
    from tidelog.storage.api import StorageEngine


class LogDirApis:
    def __init__(self, engine: StorageEngine, authorizer: Authorizer) -> None:
        self.engine = engine
        self.authorizer = authorizer

    def handlers(self) -> HandlerTable:
        return {ApiKey.DESCRIBE_LOG_DIRS: ApiHandler(0, 4, self.handle_describe_log_dirs)}

    async def handle_describe_log_dirs(self, request: Request, connection: Connection) -> Response:
        if not self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.CLUSTER):
            return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
        engine = self.engine
        partitions = engine.partitions()
        if request.body.topics is None:
            wanted = sorted(partitions)
        else:
            wanted = [(t.topic, p) for t in request.body.topics for p in t.partitions if (t.topic, p) in partitions]
        by_dir: dict[Path, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for topic, index in dict.fromkeys(wanted):
            partition = partitions[(topic, index)]
            by_dir[engine.log_dir_of(topic, index)][topic].append(
                {
                    "partition_index": index,
                    "partition_size": partition.size_in_bytes,
                    "offset_lag": max(partition.high_watermark - partition.log_end_offset, 0),
                    "is_future_key": False,
                }
            )
        results = []
        for log_dir in engine.log_dirs:
            usage = shutil.disk_usage(log_dir)
            topics = by_dir.get(log_dir, {})
            results.append(
                {
                    "error_code": 0,
                    "log_dir": str(log_dir),
                    "topics": [{"name": name, "partitions": topics[name]} for name in sorted(topics)],
                    "total_bytes": usage.total,
                    "usable_bytes": usage.free,
                }
            )
        return {"throttle_time": 0, "error_code": 0, "results": results}
