"""What security costs: an embedded broker plain vs secure, and a record's trip under ACLs.

Starts two embedded brokers one after the other, each in its own temporary directory:
plain (PLAINTEXT, no authorizer) and secure (``EmbeddedBroker(secure=True)``: SASL/SCRAM-
SHA-512, the StandardAuthorizer, a user per role and the roles' ACLs). For each it measures:

* ``start_s``: launching the JVM to the first answered DescribeCluster (the broker's own
  ``startup_s``), and ``setup_s``: the rest of `EmbeddedBroker.start`: formatting the
  storage (a JVM of its own) and, for the secure one, creating the roles' SCRAM users and
  applying their ACLs until the broker lists them; ``regrant_s``: granting again (what a
  ``broker start`` of a running secure broker does: nothing new, every ACL listed);
* ``authorizer_check_ms``: `runwatch.admin.authorizer_enabled`, what every component runs
  once at start (median of ``--repeat``);
* ``connect_ms``: a KafkaProducer's bootstrap (SCRAM adds a login round trip), and
  ``send_ms``: an acknowledged send of one record to a topic the trainer may write
  (median of ``--repeat`` each).

Prints the figures and one JSON line. ``--repeat`` (default 5).

    .venv/bin/python bench/secure_broker.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch import admin  # noqa: E402
from runwatch.broker import EmbeddedBroker  # noqa: E402
from runwatch.broker.acls import Scope  # noqa: E402
from runwatch.broker.security import ADMIN_USER, load_credentials  # noqa: E402

PREFIX = "bench"


def median_ms(repeat: int, once: Callable[[], None]) -> float:
    """The median wall time of ``once`` over ``repeat`` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        once()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def measure(secure: bool, repeat: int) -> dict[str, Any]:
    """Start one broker, measure, stop it."""
    from kafka import KafkaProducer

    with tempfile.TemporaryDirectory(prefix="rw-secure-bench-") as tmp:
        broker = EmbeddedBroker(Path(tmp), secure=secure, scope=Scope.of(PREFIX))
        started = time.monotonic()
        info = broker.start()
        total_s = time.monotonic() - started
        try:
            creds = load_credentials(Path(tmp)) if secure else None
            as_admin = creds.client_config(ADMIN_USER) if creds else {}
            as_trainer = creds.client_config("trainer") if creds else {}
            admin.create_topics(info.bootstrap, admin.catalogue(PREFIX, 1), client_config=as_admin)
            check_ms = median_ms(
                repeat,
                lambda: admin.authorizer_enabled(info.bootstrap, client_config=as_trainer),
            )

            def connect() -> None:
                KafkaProducer(bootstrap_servers=info.bootstrap, **as_trainer).close(timeout=5)

            producer = KafkaProducer(bootstrap_servers=info.bootstrap, acks="all", **as_trainer)
            topic = f"{PREFIX}.steps"
            try:
                producer.send(topic, b"warm").get(timeout=30)
                send_ms = median_ms(
                    repeat, lambda: producer.send(topic, b"x").get(timeout=30) and None
                )
            finally:
                producer.close(timeout=5)
            regrant_s = 0.0
            if secure:
                started = time.monotonic()
                broker.grant(info)
                regrant_s = round(time.monotonic() - started, 2)
            return {
                "secure": secure,
                "start_s": info.startup_s,
                "setup_s": round(total_s - info.startup_s, 2),
                "regrant_s": regrant_s,
                "authorizer_check_ms": check_ms,
                "authorizer": admin.authorizer_enabled(info.bootstrap, client_config=as_trainer),
                "connect_ms": median_ms(repeat, connect),
                "send_ms": send_ms,
            }
        finally:
            broker.stop()


def main() -> None:
    """Measure both brokers and print the figures and a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = [measure(secure, args.repeat) for secure in (False, True)]
    for row in rows:
        name = "secure" if row["secure"] else "plain "
        print(
            f"{name}: start {row['start_s']:.1f} s (+ format and setup {row['setup_s']:.1f} s, "
            f"grant again {row['regrant_s']:.1f} s), "
            f"authorizer check {row['authorizer_check_ms']:.0f} ms "
            f"(authorizer: {row['authorizer']}), connect {row['connect_ms']:.0f} ms, "
            f"acked send {row['send_ms']:.1f} ms"
        )
    print(json.dumps({"bench": "secure_broker", "repeat": args.repeat, "rows": rows}))


if __name__ == "__main__":
    main()
