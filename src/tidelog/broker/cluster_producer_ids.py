"""Producer ids unique across a cluster: blocks reserved in ZooKeeper, as Kafka's ZooKeeper mode reserves them.

An idempotent producer is known to every partition by its producer id; two producers with one id would read each
other's sequence numbers as out of order (or as duplicates) at any leader they both write to. A single broker
reserves blocks in a file (produce.py's FileProducerIdBlocks); brokers of a cluster reserve them in the znode
`/latest_producer_id_block` (zk_layout.ProducerIdBlock): read the last block reserved, write the next one
(PRODUCER_ID_BLOCK_SIZE ids after it) conditionally on the znode's version, and read again if another broker
wrote first (Kafka's ZkProducerIdManager.getNewProducerIdBlock). The first block starts at 0.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tidelog.broker import zk_layout as zk
from tidelog.broker.produce import PRODUCER_ID_BLOCK_SIZE

log = logging.getLogger("tidelog.cluster")


class ZooKeeperProducerIdBlocks:
    def __init__(self, client: KazooClient, broker_id: int) -> None:
        self.client = client
        self.broker_id = broker_id

    def next_block(self) -> range:
        """Reserve the next block (a blocking call: a worker thread's)."""
        while True:
            try:
                data, stat = self.client.get(zk.PRODUCER_ID_BLOCK_PATH)
            except NoNodeError:
                data, stat = b"", None
            start = zk.ProducerIdBlock.decode(data).end + 1 if data else 0
            block = zk.ProducerIdBlock(self.broker_id, start, start + PRODUCER_ID_BLOCK_SIZE - 1)
            try:
                if stat is None:
                    self.client.create(zk.PRODUCER_ID_BLOCK_PATH, block.encode(), makepath=True)
                else:
                    self.client.set(zk.PRODUCER_ID_BLOCK_PATH, block.encode(), version=stat.version)
            except (BadVersionError, NodeExistsError):
                continue  # another broker reserved one meanwhile: the next block after its
            log.info("reserved producer ids %d-%d", block.start, block.end)
            return range(block.start, block.end + 1)
