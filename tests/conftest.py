"""Test-wide setup.

Without a CUDA GPU the Triton kernels run under the Triton interpreter on CPU tensors; the
interpreter is chosen when a kernel is defined, so it must be switched on before any
``fastvideo_cute.kernels.triton`` module is imported.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def spy_backend_calls(monkeypatch, backend) -> list:
    """Record every ``backend.forward`` / ``backward`` call as ``(name, args, kwargs)`` (the calls
    still run) in the returned list."""
    seen = []
    for name in ("forward", "backward"):
        real = getattr(backend, name)
        monkeypatch.setattr(backend, name,
                            lambda *a, _r=real, _n=name, **kw: seen.append((_n, a, kw)) or _r(*a, **kw))
    return seen
