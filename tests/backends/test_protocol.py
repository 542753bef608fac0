"""Every registered backend implements the one protocol, and answers the warm-up's compile keys."""

import dataclasses

import pytest
import torch

from fastvideo_cute.backends import BACKENDS, Backend, CompileKey, registry
from fastvideo_cute.call import CallInfo

CALLS = {
    "triton": CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, True, heads=12, q_len=4096,
                       kv_len=4096),
    "fa4": CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 128, True, heads=12, q_len=4096,
                    kv_len=4096),
    "sm120": CallInfo("block_sparse", "cuda", (12, 1), torch.bfloat16, 128, 256, False, heads=12, q_len=4096,
                      kv_len=4096, need_lse=False, kv_all_full=True),
    "sm100": CallInfo("block_sparse", "cuda", (10, 0), torch.bfloat16, 128, 64, True, heads=12, q_len=4096,
                      kv_len=4096),
    "sm90": CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, False, heads=12, q_len=4096,
                     kv_len=4096, need_lse=False),
}


def test_every_backend_implements_the_protocol():
    assert set(CALLS) <= set(BACKENDS)
    for name, backend in BACKENDS.items():
        assert isinstance(backend, Backend), name
        assert backend.name == name
        assert backend.head_dims and all(isinstance(d, int) for d in backend.head_dims)


def test_registry_rejects_an_object_without_the_protocol():
    class Half:
        name = "half"

        def support(self, call):
            return True, ""

    with pytest.raises(TypeError, match="does not implement the Backend protocol"):
        registry.register(Half())


@pytest.mark.parametrize("name", sorted(CALLS))
def test_compile_keys_name_the_directions_the_call_runs(name):
    backend = BACKENDS[name]
    call = CALLS[name]
    keys = backend.compile_keys(call)
    assert set(keys) == ({"fwd", "bwd"} if call.need_grad else {"fwd"})
    for direction, key in keys.items():
        assert isinstance(key, CompileKey) and key.route == name and key.direction == direction
        assert key.digest() == backend.compile_keys(call)[direction].digest()  # stable
    # A static fact the kernel compiles on changes the key.
    other = backend.compile_keys(dataclasses.replace(call, head_dim=64))
    assert all(other[d].digest() != keys[d].digest() for d in keys)


def test_verified_on():
    assert BACKENDS["triton"].verified_on((9, 0)) and BACKENDS["triton"].verified_on(None)
    assert BACKENDS["fa4"].verified_on((9, 0)) and not BACKENDS["fa4"].verified_on((10, 0))
    assert BACKENDS["sm120"].verified_on((9, 0)) and not BACKENDS["sm120"].verified_on((12, 1))
    assert not BACKENDS["sm100"].verified_on((10, 0))  # no sm_100 GPU has run its tests
    assert BACKENDS["sm90"].verified_on((9, 0)) and not BACKENDS["sm90"].verified_on((10, 0))
