"""`runwatch ui` in a real headless Chromium: a fault-tolerant run's degraded steps.

A scripted run of three replica groups goes through the real broker and a real `runwatch
processors` worker; group 1 is missing from the quorum of steps 11-15 and group 2 of step
18. A real `runwatch ui` serves the run page: its KPIs count the degraded steps, the loss
chart shades them, the degraded-steps table lists the spans, and a new degraded step shows
without a reload.
"""

from __future__ import annotations

import pytest

from runwatch.schemas.events import AnomalyDetected
from runwatch.schemas.topics import names

from ..processors.harness import Reader, Trainer, workers
from .browser import MISSING, ui_process

pytestmark = pytest.mark.integration

if MISSING:
    pytest.skip(MISSING, allow_module_level=True)

from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT_S = 90.0
ALL = (0, 1, 2)


def quorum(step: int) -> tuple[int, ...]:
    if 11 <= step <= 15:
        return (0, 2)
    return (0, 1) if step == 18 else ALL


def _texts(driver, css: str) -> list[str]:
    """Every match's text; [] while the live page re-renders under us."""
    try:
        return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]
    except StaleElementReferenceException:
        return []


def _attrs(driver, css: str, *names: str) -> list[tuple[str, ...]]:
    try:
        return [
            tuple(e.get_attribute(n) or "" for n in names)
            for e in driver.find_elements(By.CSS_SELECTOR, css)
        ]
    except StaleElementReferenceException:
        return []


def _rows(driver, css: str) -> list[tuple[str, str, str]]:
    """Each match's ``data-from``, ``data-to`` and text, read in one pass; [] mid-render.

    The page re-renders its table as it polls: two reads (the spans, then the texts) can
    straddle a render, and the second then sees nothing. One pass inside a wait cannot.
    """
    try:
        return [
            (e.get_attribute("data-from") or "", e.get_attribute("data-to") or "", e.text)
            for e in driver.find_elements(By.CSS_SELECTOR, css)
        ]
    except StaleElementReferenceException:
        return []


def _newest_first_with_the_quorum(rows: list[tuple[str, str, str]]) -> bool:
    """The two degraded spans, newest first, the older one saying its quorum (2 of 3)."""
    return [row[:2] for row in rows] == [("18", "18"), ("11", "15")] and "2 of 3" in rows[1][2]


def d_text(driver) -> str:
    """What the page shows (for a failed wait's message)."""
    return f"{driver.current_url}: {' | '.join(_texts(driver, 'body'))[:2000]}"


def test_the_run_page_shows_the_degraded_steps_of_a_replica_group_run(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path, browser
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    run = "run-ft-ui"
    anomalies = Reader(kafka_bootstrap, topics.anomalies)
    trainer = Trainer(kafka_bootstrap, topic_prefix, run, world_size=3)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        start()
        trainer.start(0)
        for s in range(1, 21):
            trainer.step(s, participants=quorum(s))
        seen = anomalies.wait_for(
            lambda ev: (
                sum(isinstance(e, AnomalyDetected) and e.kind == "replica_rejoined" for e in ev)
                >= 2
            )
        )
        lost = [(e.kind, e.replica_group, e.step) for e in seen if e.kind == "replica_lost"]
        assert lost == [("replica_lost", 1, 11), ("replica_lost", 2, 18)]
        args = ["--bootstrap", kafka_bootstrap, "--prefix", topic_prefix]
        args += ["--app-id", f"{topic_prefix}-app"]
        with ui_process(args, tmp_path / "ui.log") as url:
            wait = WebDriverWait(
                browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)
            )
            browser.get(f"{url.rstrip('/')}/run/{run}")
            try:
                wait.until(lambda d: _texts(d, "#kpi-step") == ["20"])
            except TimeoutException:
                raise AssertionError(f"no step 20 on {d_text(browser)}") from None
            wait.until(lambda d: _texts(d, "#kpi-degraded") == ["6"])
            wait.until(lambda d: _texts(d, "#kpi-groups") == ["3/3"])
            shaded = "#chart-loss .degraded"
            wait.until(
                lambda d: _attrs(d, shaded, "data-from", "data-to") == [("11", "15"), ("18", "18")]
            )
            table = "#degraded tr[data-from]"
            try:
                wait.until(lambda d: _newest_first_with_the_quorum(_rows(d, table)))
            except TimeoutException:
                raise AssertionError(f"degraded rows: {_rows(browser, table)}") from None
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#degraded-card").is_displayed())
            # a new degraded step arrives: the page follows without a reload
            browser.execute_script("document.body.dataset.probe = 'run page'")
            trainer.step(21, participants=(0,))
            wait.until(lambda d: _texts(d, "#kpi-degraded") == ["7"])
            wait.until(lambda d: ("21", "21") in _attrs(d, shaded, "data-from", "data-to"))
            wait.until(lambda d: _texts(d, "#kpi-groups") == ["1/3"])
            assert browser.execute_script("return document.body.dataset.probe") == "run page"
        trainer.close()
    anomalies.close()
