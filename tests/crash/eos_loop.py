"""A consume-transform-produce loop in a process of its own, for tests/crash/test_transactions_kill9.py.

`python eos_loop.py BOOTSTRAP INPUT OUTPUT PARTITIONS GROUP TRANSACTIONAL_ID MODE`: reads INPUT (read_committed,
partitions assigned, starting at GROUP's committed offsets) and writes each record, its value prefixed with "out:",
to the same partition of OUTPUT with a librdkafka transactional producer. MODE "exact" sends the consumed offsets
to the transaction before committing it (exactly once); "offsets-outside" commits the transaction and then the
offsets with the consumer, outside the transaction (the mistake the test must catch: a kill between the two
writes the records again).

It is crash-only: any error (the broker killed, the producer fenced, a commit refused) ends the process with a
non-zero code and the test starts a new one, whose init_transactions fences this one and aborts its open
transaction, and which resumes from the committed offsets.

A watchdog ends it the same way (exit code 70, after printing every thread's Python stack) when one pass of the loop
takes longer than WATCHDOG_S, well past the 30 s each client call is given: librdkafka's
send_offsets_to_transaction can wait past its timeout for a group coordinator whose connection went down
(confluentinc/librdkafka issues 5456 and 5511, open in 2.16) - once a broker kill caught it there, the TxnOffsetCommit
was never sent and the process waited for good. An application guards against that the same way, with a liveness
check that restarts it.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

CLIENT = {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 250, "retry.backoff.ms": 20, "log_level": 2}
TIMEOUT_S = 30
WATCHDOG_S = 75
WATCHDOG_EXIT = 70


class Watchdog:
    """Ends the process (WATCHDOG_EXIT) unless `feed` is called at least every WATCHDOG_S seconds."""

    def __init__(self) -> None:
        self._fed = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def feed(self) -> None:
        self._fed.set()

    def _watch(self) -> None:
        while self._fed.wait(WATCHDOG_S):
            self._fed.clear()
        print(f"eos_loop: one pass took more than {WATCHDOG_S} s; the stacks, then exit", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(WATCHDOG_EXIT)


def main(bootstrap: str, source: str, sink: str, partitions: int, group: str, transactional_id: str, mode: str) -> None:
    watchdog = Watchdog()  # armed from the start: the calls before the loop wait too
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **CLIENT}
    )
    producer.init_transactions(TIMEOUT_S)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **CLIENT,
        }
    )
    committed = consumer.committed([TopicPartition(source, p) for p in range(partitions)], timeout=TIMEOUT_S)
    consumer.assign([TopicPartition(source, tp.partition, max(tp.offset, 0)) for tp in committed])
    while True:
        watchdog.feed()
        messages = consumer.consume(num_messages=100, timeout=0.2)
        for message in messages:
            if message.error() is not None:
                raise KafkaException(message.error())
        if not messages:
            continue
        producer.begin_transaction()
        next_offsets: dict[int, int] = {}
        for message in messages:
            producer.produce(sink, value=b"out:" + message.value(), key=message.key(), partition=message.partition())
            next_offsets[message.partition()] = message.offset() + 1
        offsets = [TopicPartition(source, p, o) for p, o in sorted(next_offsets.items())]
        if mode == "exact":
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.commit_transaction(TIMEOUT_S)
            consumer.commit(offsets=offsets, asynchronous=False)


if __name__ == "__main__":
    bootstrap, source, sink, partitions, group, transactional_id, mode = sys.argv[1:]
    main(bootstrap, source, sink, int(partitions), group, transactional_id, mode)
