"""Screenshots of the web view for the docs, taken in the headless Chromium.

python -m tests.integration.ui.screenshots fleet --bootstrap HOST:PORT --runs 1000
    a fleet of scripted runs through the real broker and a real `runwatch processors`
    worker, served by the real UI server; writes docs/img/fleet.png and prints how
    long the fleet endpoint takes at that size.
python -m tests.integration.ui.screenshots page URL OUT.png [--height H]
    one page as it is now (e.g. a run page of `runwatch demo --keep-ui`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import time
import urllib.request
from pathlib import Path

from kafka import KafkaProducer

from runwatch.admin import create_catalogue
from runwatch.processors.fleet import wait_until_processed
from runwatch.procs import ManagedProcess
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import Heartbeat, ModelFlopConfig, RunEnded, RunStarted, StepCompleted
from runwatch.schemas.topics import names
from runwatch.ui.model import WebviewData
from runwatch.ui.server import UiServer

from .browser import chrome

FLOPS = ModelFlopConfig(n_params=124_000_000, n_layer=12, n_head=12, d_model=768, seq_len=1024)


def shoot(
    url: str, out: Path, *, height: int = 900, full: bool = False, wait_css: str = "#live.on"
) -> None:
    """Open ``url`` in headless Chromium, wait for live data, save a PNG (the window, or
    the ``full`` page)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chrome(1440, height)
    try:
        driver.get(url)
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, wait_css))
        WebDriverWait(driver, 60).until(lambda d: not d.find_elements(By.CSS_SELECTOR, "td.empty"))
        if full:
            whole = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1440, min(max(height, whole), 4000))
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


def _fleet(bootstrap: str, runs: int, steps: int) -> None:
    prefix = f"shots{secrets.token_hex(3)}"
    topics = names(prefix)
    create_catalogue(bootstrap, prefix=prefix, partitions=4)
    app_id = f"{prefix}-processors"
    work = Path("/tmp") / prefix
    worker = ManagedProcess.runwatch(
        "processors",
        [
            "processors",
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--app-id",
            app_id,
            "--partitions",
            "4",
            "--tick-interval",
            "0.5",
        ],
        work / "processors.log",
        env={**os.environ, "RUNWATCH_COMMAND_KEY": secrets.token_hex(16)},
    )
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256_000)
        rng = random.Random(7)
        t0 = time.time_ns()
        names_ = [
            f"{team}-{size}-{i:04d}"
            for i, (team, size) in enumerate(
                (rng.choice(("llm", "vision", "speech", "rl")), rng.choice(("7b", "13b", "70b")))
                for _ in range(runs)
            )
        ]
        for i, run_id in enumerate(names_):
            key = encode_key(run_id)
            world = rng.choice((2, 4, 8))
            spike = rng.random() < 0.08
            ended = rng.random() < 0.25
            started = encode(
                RunStarted(
                    run_id=run_id,
                    ts_ns=t0,
                    world_size=world,
                    flop_config=FLOPS,
                    peak_flops_per_s=world * 312e12,
                    dtype="bf16",
                    vocab_size=50304,
                )
            )
            for topic in (topics.runs, topics.steps, topics.heartbeats):  # as RunEmitter does
                producer.send(topic, key=key, value=started)
            base, speed = rng.uniform(3.2, 4.2), rng.uniform(0.004, 0.01)
            step_time = rng.uniform(1.0, 1.6)
            nan = not spike and rng.random() < 0.02
            last = steps - rng.randrange(0, steps // 3)
            for s in range(1, last + 1):
                ts = t0 + int(s * 1e9)
                loss = base * (1 - speed) ** s + rng.gauss(0, 0.01)
                if spike and s == last - 5:
                    loss *= 2.4
                if nan and s == last - 2:
                    loss = float("nan")
                producer.send(
                    topics.steps,
                    key=key,
                    value=encode(
                        StepCompleted(
                            run_id=run_id,
                            ts_ns=ts,
                            seq=s,
                            step=s,
                            loss=loss,
                            grad_norm=abs(rng.gauss(1.0, 0.05)),
                            step_time_s=step_time * rng.uniform(0.97, 1.03),
                            tokens=world * 160 * 1024,
                        )
                    ),
                )
                for rank in range(world):
                    producer.send(
                        topics.heartbeats,
                        key=key,
                        value=encode(
                            Heartbeat(
                                run_id=run_id,
                                ts_ns=ts,
                                seq=s,
                                rank=rank,
                                step=s,
                                step_time_s=step_time,
                                host=f"node{rank // 8}",
                            )
                        ),
                    )
            if ended:
                end = encode(
                    RunEnded(
                        run_id=run_id,
                        ts_ns=t0 + int((last + 1) * 1e9),
                        status="completed",
                        final_step=last,
                    )
                )
                for topic in (topics.runs, topics.steps, topics.heartbeats):
                    producer.send(topic, key=key, value=end)
            if i % 100 == 0:
                producer.flush()
        producer.flush()
        producer.close()
        wait_until_processed(bootstrap, app_id, [topics.steps, topics.heartbeats], timeout_s=600)
        data = WebviewData(bootstrap, prefix=prefix, app_id=app_id)
        server = UiServer(data)
        data.start()
        server.start()
        try:
            assert data.wait_ready(300), "history not read"
            for query in ("sort=run", "sort=anomalies&desc=1", "q=70b&sort=loss", "page=19"):
                started = time.perf_counter()
                with urllib.request.urlopen(f"{server.url}api/fleet?{query}") as r:
                    body = json.load(r)
                took = time.perf_counter() - started
                print(f"fleet endpoint, {body['runs']} runs, ?{query}: {1000 * took:.1f} ms")
            shoot(f"{server.url}?sort=anomalies&desc=1&size=25", Path("docs/img/fleet.png"))
        finally:
            server.close()
            data.close()
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    fleet = sub.add_parser("fleet")
    fleet.add_argument("--bootstrap", required=True)
    fleet.add_argument("--runs", type=int, default=1000)
    fleet.add_argument("--steps", type=int, default=40)
    page = sub.add_parser("page")
    page.add_argument("url")
    page.add_argument("out", type=Path)
    page.add_argument("--height", type=int, default=900)
    page.add_argument("--full", action="store_true", help="the whole page, not the window")
    args = parser.parse_args()
    if args.what == "fleet":
        _fleet(args.bootstrap, args.runs, args.steps)
    else:
        shoot(args.url, args.out, height=args.height, full=args.full)


if __name__ == "__main__":
    main()
