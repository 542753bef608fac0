"""``benchmarks/profile_bwd64_sm90.py`` on CPU: its kernel-name shortening (what the committed
``prof_bwd64_kernels_h200.json`` is keyed by) and that it profiles the ``sm90`` route's own build.
Nothing is timed here; the GPU runs are in benchmarks/results/."""

import pytest


@pytest.fixture(scope="module")
def prof(load_script):
    return load_script("profile_bwd64_sm90")


@pytest.mark.parametrize("name, want", [
    ("kernel_cutlass_kernel_fastvideo_cutekernelscuteblock_sparse_bwd64block_sparse_bwd64_sm90_wsBlockSparseBwd64Sm90Ws_obj",
     "ours:main"),
    ("kernel_cutlass_bwd_cudnnblock_sparse_attentioncsrcbwdsm90_blk64bsa_bwd_sm90BlockSparseAttnBackwardSm90Blk64_o",
     "cudnn:main"),
    ("kernel_cutlass__scatter_q_indices_kernel_cudnnblock_sparse_attentioncsrcbwdbucketed_k2q_csrBucketedK2QCsr",
     "cudnn:k2q_csr"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int",
     "void at::native::vectorized_elementwise_kernel"),
])
def test_kernel_names_are_shortened(prof, name, want):
    assert prof.short_name(name) == want


def test_profiles_the_route_build(prof):
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG

    cfg = prof.route_ws_config()
    assert cfg == dict(_BWD_WS_CONFIG) and cfg is not _BWD_WS_CONFIG
