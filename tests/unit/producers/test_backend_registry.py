"""The training-backend registry: lazy factories, capabilities without torch, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runwatch.producers import backend as registry
from runwatch.producers.backend import (
    BackendCapabilities,
    TorchDDPBackend,
    UnknownBackendError,
    get_training_backend,
    register_training_backend,
    training_backend_capabilities,
    training_backend_names,
)
from runwatch.schemas.events import BackendDeclaration


@pytest.fixture
def scratch_name():
    name = "test-backend"
    yield name
    registry._REGISTRY.pop(name, None)
    registry._INSTANCES.pop(name, None)


def test_torch_ddp_is_registered_and_declares_it_can_shrink():
    assert "torch-ddp" in training_backend_names()
    caps = training_backend_capabilities("torch-ddp")
    assert caps is TorchDDPBackend.CAPABILITIES
    assert caps.declaration() == BackendDeclaration(
        name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True
    )


def test_capabilities_and_registry_do_not_import_torch():
    code = (
        "import sys\n"
        "from runwatch.producers.backend import training_backend_capabilities as c\n"
        "assert c('torch-ddp').elastic_restart\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from runwatch.producers.backend import get_training_backend\n"
        "b = get_training_backend('torch-ddp')\n"
        "assert 'torch' not in sys.modules, 'constructing the backend imported torch'\n"
        "print(b.capabilities.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch-ddp"


def test_the_factory_runs_once_and_only_when_asked(scratch_name):
    calls = []
    caps = BackendCapabilities(name=scratch_name, axes=frozenset({"dp_replicate"}))

    def factory():
        calls.append(1)
        return TorchDDPBackend()

    register_training_backend(scratch_name, factory, caps)
    assert training_backend_capabilities(scratch_name) is caps and calls == []
    first = get_training_backend(scratch_name)
    assert get_training_backend(scratch_name) is first and calls == [1]


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(
        UnknownBackendError, match=r"unknown training backend 'megatron' \(known: .*torch-ddp"
    ):
        get_training_backend("megatron")
    with pytest.raises(UnknownBackendError, match="known:"):
        training_backend_capabilities("megatron")


def test_registration_refuses_a_taken_name_or_mismatched_capabilities(scratch_name):
    caps = BackendCapabilities(name=scratch_name, axes=frozenset())
    register_training_backend(scratch_name, TorchDDPBackend, caps)
    with pytest.raises(ValueError, match="already registered"):
        register_training_backend(scratch_name, TorchDDPBackend, caps)
    register_training_backend(scratch_name, TorchDDPBackend, caps, replace=True)
    with pytest.raises(ValueError, match="capabilities of 'torch-ddp'"):
        register_training_backend("other", TorchDDPBackend, TorchDDPBackend.CAPABILITIES)
    with pytest.raises(ValueError, match="empty"):
        register_training_backend("", TorchDDPBackend, caps)
