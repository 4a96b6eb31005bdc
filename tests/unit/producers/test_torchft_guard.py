"""The torchft-ddp backend's comm hook survives a peer group lost in the middle of a step.

torchft 0.2.0's own hook asserts that the manager's future has an inner future; when the
all-reduce fails (a peer group died) it has none, and the ``AssertionError`` killed the
*surviving* group: the whole point of per-group fault tolerance lost. These tests drive the
guarded hook with a stand-in for the manager's work (the hook's two outcomes are ours to
check; the real failure under real torchft is the closed-loop test of
tests/integration/controller/test_fault_tolerance.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchft = pytest.importorskip("torchft")

from runwatch.producers.torchft_backend import _guarded_ddp  # noqa: E402

dist = torch.distributed


class _Future:
    def __init__(self, inner: object) -> None:
        self._fut = inner


class _Work:
    def __init__(self, inner: object) -> None:
        self.waited = False
        self._inner = inner

    def wait(self) -> bool:
        self.waited = True
        return self._inner is not None

    def get_future(self) -> _Future:
        return _Future(self._inner)


class _Manager:
    def __init__(self, inner: object) -> None:
        self.work = _Work(inner)
        self.reduced: list[object] = []

    def allreduce(self, tensor: object) -> _Work:
        self.reduced.append(tensor)
        return self.work


class _Bucket:
    def __init__(self) -> None:
        self.grads = torch.arange(4.0)

    def buffer(self) -> object:
        return self.grads


def test_the_guard_replaces_torchfts_hook_on_its_ddp() -> None:
    guarded = _guarded_ddp()
    assert issubclass(guarded, torchft.DistributedDataParallel)
    assert guarded._comm_hook is not torchft.DistributedDataParallel._comm_hook


def test_torchs_ddp_accepts_the_guarded_hook(tmp_path) -> None:
    """DDP checks a hook's annotations when it is registered; the first guard had string
    annotations, DDP refused it, and every torchft rank died at start (a real gloo group of
    one: the check is torch's, not ours)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        manager = _Manager(inner=None)
        ddp.register_comm_hook(manager, _guarded_ddp()._comm_hook)
        ddp(torch.ones(3, 4)).sum().backward()
        assert len(manager.reduced) == 1  # the hook ran: DDP's one bucket went through it
    finally:
        dist.destroy_process_group()


def test_a_failed_all_reduce_hands_ddp_the_local_gradients() -> None:
    """The manager recorded the error, so the step will not commit; backward must finish."""
    manager, bucket = _Manager(inner=None), _Bucket()
    future = _guarded_ddp()._comm_hook(manager, bucket)
    assert manager.work.waited and manager.reduced == [bucket.grads]
    assert future.done() and future.value() is bucket.grads


def test_a_good_all_reduce_returns_torchfts_own_future() -> None:
    inner = torch.futures.Future()
    manager = _Manager(inner=inner)
    assert _guarded_ddp()._comm_hook(manager, _Bucket()) is inner
