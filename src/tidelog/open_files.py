"""The process's open-file limit, raised at start: `raise_open_file_limit()` sets the soft RLIMIT_NOFILE to the hard
limit (what `ulimit -n` could raise it to without privileges), as a JVM started by Kafka's scripts does
(-XX:+MaxFDLimit). `tidelog serve` calls it before the broker opens its log; the hard limit itself is the
administrator's (`ulimit -Hn`, LimitNOFILE= in a systemd unit).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("tidelog")


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # a platform that refuses it: keep the soft limit, and say so
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    log.info("open-file limit raised from %d to the hard limit %d", soft, hard)
    return hard
