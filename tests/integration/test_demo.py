"""`runwatch demo` end to end on the session broker: faults acted on, every verdict audited."""

from __future__ import annotations

import io

import pytest

from runwatch.demo import DemoConfig, run_demo

pytestmark = [pytest.mark.integration, pytest.mark.torch]


def test_demo_recovers_from_every_fault_and_the_audit_agrees(kafka_bootstrap, tmp_path):
    out = io.StringIO()
    status = run_demo(DemoConfig(bootstrap=kafka_bootstrap, workdir=tmp_path, refresh_s=2.0), out)
    text = out.getvalue()
    assert status == 0, text[-4000:]
    receipt = text[text.index("health receipt of demo-1") :]
    # the killed rank is respawned with continuity intact ...
    assert "command: respawn of incarnation 0 for dead_rank" in receipt
    assert "(incarnation 1): continuity ok" in receipt
    # ... the NaN rolls the respawned gang back, and that resume drops the optimizer state
    assert "command: rollback of incarnation 1 for nonfinite_loss" in receipt
    assert "(incarnation 2): continuity broken" in receipt
    assert "loss_spike x1" in receipt and "status completed" in receipt
    assert "every verdict reproduced" in receipt and "DISAGREES" not in receipt
    # the web view was served while it ran
    assert "web view: http://127.0.0.1:" in text
