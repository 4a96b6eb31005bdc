"""`runwatch ui` in a real headless Chromium against a real pipeline.

A scripted run with a loss spike goes through the real broker and a real `runwatch
processors` worker; a real `runwatch ui` process serves the pages; selenium drives the
system's Chromium. The page must list the run, mark the spike where it fired, and follow
new steps without a reload.
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
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT_S = 90.0


def _text(driver, css: str) -> str:
    """The first match's text, "" when none; the live page re-renders, so an element found
    a moment ago may be gone: that reads as "" too and the caller's wait tries again."""
    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else ""
    except StaleElementReferenceException:
        return ""


def _click(driver, css: str) -> bool:
    """Click the first match; False (try again) when it was re-rendered under us."""
    try:
        driver.find_element(By.CSS_SELECTOR, css).click()
    except (StaleElementReferenceException, NoSuchElementException):
        return False
    return True


def test_the_page_lists_the_run_marks_its_spike_and_follows_new_steps(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path, browser
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    run = "run-ui"
    anomalies = Reader(kafka_bootstrap, topics.anomalies)
    trainer = Trainer(kafka_bootstrap, topic_prefix, run)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        start()
        trainer.start(0)
        for s in range(1, 41):
            trainer.step(s, loss=9.0 if s == 30 else None)
        spike = anomalies.wait_for(
            lambda ev: any(isinstance(e, AnomalyDetected) and e.kind == "loss_spike" for e in ev)
        )
        assert [(e.kind, e.step) for e in spike] == [("loss_spike", 30)]
        args = ["--bootstrap", kafka_bootstrap, "--prefix", topic_prefix]
        args += ["--app-id", f"{topic_prefix}-app"]
        with ui_process(args, tmp_path / "ui.log") as url:
            wait = WebDriverWait(browser, WAIT_S)
            # the fleet page lists the run with its anomaly
            browser.get(url)
            row = f'tr[data-run="{run}"]'
            wait.until(lambda d: _text(d, f"{row} td.step") == "40")
            wait.until(lambda d: "loss_spike" in _text(d, f"{row} td.anomalies"))
            wait.until(lambda d: _text(d, "#live") == "live")
            # a new step arrives: the fleet row follows without a reload
            browser.execute_script("document.body.dataset.probe = 'fleet page'")
            trainer.step(41)
            wait.until(lambda d: _text(d, f"{row} td.step") == "41")
            assert browser.execute_script("return document.body.dataset.probe") == "fleet page"
            # the filter runs on the server: a text no run id contains empties the table
            browser.find_element(By.CSS_SELECTOR, "#q").send_keys("no-such-run")
            wait.until(lambda d: _text(d, "td.empty") == "no run matches the filter")
            browser.find_element(By.CSS_SELECTOR, "#q").clear()
            browser.find_element(By.CSS_SELECTOR, "#q").send_keys(run[:5])
            wait.until(lambda d: _text(d, f"{row} td.step") == "41")
            # the run page marks the spike where it fired, on the loss curve
            wait.until(lambda d: _click(d, f"{row} td.run a"))
            spike_css = '#chart-loss .marker[data-kind="loss_spike"][data-step="30"]'
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, spike_css))
            wait.until(lambda d: "loss_spike" in _text(d, "#feed"))
            assert "health receipt" in browser.page_source
            # and it follows new steps too
            browser.execute_script("document.body.dataset.probe = 'run page'")
            trainer.step(42)
            wait.until(lambda d: _text(d, "#kpi-step") == "42")
            assert browser.execute_script("return document.body.dataset.probe") == "run page"
        trainer.close()
    anomalies.close()
