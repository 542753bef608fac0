"""Cases shared by the gloo (CPU) and NCCL (GPU) Ulysses tests: global inputs built the same way
in every process (a seeded CPU generator, then moved), the single-process call on the whole
sequence, and the Ulysses call on one rank's slice.

``fastvideo_cute`` is imported inside the functions: a spawned child sets ``TRITON_INTERPRET``
before its first import.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "vsa" or "bs" (block-sparse)
    bshd: bool
    block: int
    batch: int
    heads: int
    seq: int
    head_dim: int
    gate: bool = False  # vsa only
    topk: int = 2  # vsa only
    map_form: str = "global4"  # bs only: global4 | global3 | local4 | local3
    grad: bool = True
    chunks: int = 1  # head_chunks = min(chunks, heads per rank)
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def seq_dim(self) -> int:
        return 1 if self.bshd else 2

    def head_dim_index(self) -> int:
        return 2 if self.bshd else 1


def sizes_pattern(n: int, block: int, empty: bool) -> torch.Tensor:
    """Ragged per-tile sizes: full tiles, a partial tile, a short one, and (``empty``) a size-0 tile."""
    s = [block] * n
    if n >= 2:
        s[-1] = block // 4 + 1
        s[n // 2] = block - 24
    if empty and n >= 4:
        s[1] = 0
    return torch.tensor(s, dtype=torch.int32)


def build(case: Case, device) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + case.seed)
    b, h, s, d = case.batch, case.heads, case.seq, case.head_dim
    shape = (b, s, h, d) if case.bshd else (b, h, s, d)
    names = ["q", "k", "v", "dout"] + (["gate"] if case.gate else [])
    t = {n: torch.randn(shape, generator=g) for n in names}
    if case.gate:
        t["gate"] = t["gate"] * 0.5
    nb = s // case.block
    t["sizes"] = sizes_pattern(nb, case.block, empty=True)
    t["q_sizes"] = sizes_pattern(nb, case.block, empty=False)
    if case.kind == "bs":
        m = torch.rand((b, h, nb, nb), generator=g) < 0.5
        m[:, :, :, 0] = True
        m[0, 0, nb - 1] = False  # a q block that selects nothing: out 0, lse -inf
        t["map"] = m
    out = {}
    for n, x in t.items():
        x = x.to(device)
        out[n] = x.to(case.dtype) if x.is_floating_point() else x
    return out


def _fns(case: Case):
    import fastvideo_cute as fvc
    import fastvideo_cute.distributed as fvd

    if case.kind == "vsa":
        single = fvc.video_sparse_attn_bshd if case.bshd else fvc.video_sparse_attn
        return single, fvd.ulysses_video_sparse_attn
    suffix = ("" if case.block == 64 else f"_{case.block}") + ("_bshd" if case.bshd else "")
    return getattr(fvc, "block_sparse_attn" + suffix), getattr(fvd, "ulysses_block_sparse_attn" + suffix)


def grad_names(case: Case) -> Tuple[str, ...]:
    return ("q", "k", "v") + (("gate",) if case.gate else ())


def _results(case: Case, out, lse, leaves: Sequence[torch.Tensor], dout) -> Dict[str, torch.Tensor]:
    res = {"out": out.detach()}
    if lse is not None:
        res["lse"] = lse
    if case.grad:
        grads = torch.autograd.grad(out, list(leaves), dout)
        res.update({"d" + n: g for n, g in zip(grad_names(case), grads)})
    return res


def run_single(case: Case, t: Dict[str, torch.Tensor], heads: Optional[slice] = None) -> Dict[str, torch.Tensor]:
    """The single-process call on the whole sequence (``heads``: only those heads)."""
    single, _ = _fns(case)
    hd = case.head_dim_index()
    pick = (lambda x: x) if heads is None else (lambda x: x.narrow(hd, heads.start, heads.stop - heads.start))
    leaves = [pick(t[n]).clone().requires_grad_(case.grad) for n in grad_names(case)]
    dout = pick(t["dout"])
    with torch.set_grad_enabled(case.grad):
        if case.kind == "vsa":
            gate = leaves[3] if case.gate else None
            out, lse = single(*leaves[:3], t["sizes"], t["q_sizes"], case.topk, case.block, gate), None
        else:
            m = t["map"] if heads is None else t["map"][:, heads]
            out, lse = single(*leaves, m, t["sizes"])
    return _results(case, out, lse, leaves, dout)


def local_map(case: Case, m: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    hl = case.heads // world
    if case.map_form == "global4":
        return m
    if case.map_form == "global3":
        return m[0]
    if case.map_form == "local4":
        return m[:, rank * hl:(rank + 1) * hl].contiguous()
    if case.map_form == "local3":
        return m[0, rank * hl:(rank + 1) * hl].contiguous()
    raise AssertionError(case.map_form)


def seq_slice(case: Case, x: torch.Tensor, rank: int, world: int, seq_dim: Optional[int] = None) -> torch.Tensor:
    dim = case.seq_dim() if seq_dim is None else seq_dim
    n = x.shape[dim] // world
    return x.narrow(dim, rank * n, n)


def run_ulysses(case: Case, t: Dict[str, torch.Tensor], rank: int, world: int, group=None) -> Dict[str, torch.Tensor]:
    """This rank's Ulysses call on its slice; results are this rank's slices."""
    _, ulysses = _fns(case)
    leaves = [seq_slice(case, t[n], rank, world).clone().requires_grad_(case.grad) for n in grad_names(case)]
    dout = seq_slice(case, t["dout"], rank, world)
    chunks = min(case.chunks, case.heads // world)
    with torch.set_grad_enabled(case.grad):
        if case.kind == "vsa":
            gate = leaves[3] if case.gate else None
            out = ulysses(*leaves[:3], t["sizes"], t["q_sizes"], case.topk, case.block, gate, group=group,
                          layout="bshd" if case.bshd else "bhsd", head_chunks=chunks)
            lse = None
        else:
            m = local_map(case, t["map"], rank, world)
            out, lse = ulysses(*leaves, m, t["sizes"], group=group, head_chunks=chunks)
    return _results(case, out, lse, leaves, dout)


def result_seq_dim(case: Case, key: str) -> int:
    return 2 if key == "lse" else case.seq_dim()


# The gloo cases (CPU, Triton interpreter, fp32), as small as the interpreter allows: the CI box
# has two cores and every spawned rank pays ~5 s of imports. B=2 in one case checks the batch
# dim of the views; ``vsa_bshd_chunks`` runs two head chunks per rank at world 2.
CPU_CASES = {c.name: c for c in (
    Case("vsa_bhsd_gate", "vsa", False, 64, 1, 4, 256, 32, gate=True),
    Case("vsa_bshd_chunks", "vsa", True, 64, 1, 4, 256, 32, chunks=2, seed=1),
    Case("bs64_bshd_global4_b2", "bs", True, 64, 2, 2, 256, 32, map_form="global4", seed=2),
    Case("bs128_bhsd_local3", "bs", False, 128, 1, 2, 256, 32, map_form="local3", seed=3),
    Case("bs256_bshd_global3_nograd", "bs", True, 256, 1, 2, 512, 32, map_form="global3", grad=False, seed=4),
)}

# Which cases run at which world size (a rank's slice must be whole tiles, and heads divide).
CPU_PLAN = {
    2: ("vsa_bhsd_gate", "vsa_bshd_chunks", "bs64_bshd_global4_b2", "bs128_bhsd_local3", "bs256_bshd_global3_nograd"),
    4: ("vsa_bhsd_gate",),
}

# The NCCL cases (GPU, bf16, D=128, H=8 so 2, 4 and 8 ranks divide it; 4096 tokens = 64/32/16
# tiles of 64/128/256, so every rank's slice is whole tiles up to 8 ranks).
GPU_CASES = {c.name: c for c in (
    Case("vsa64_bshd_gate", "vsa", True, 64, 1, 8, 4096, 128, gate=True, topk=8, dtype=torch.bfloat16, seed=10),
    Case("vsa64_bhsd_chunks", "vsa", False, 64, 1, 8, 4096, 128, chunks=2, topk=8, dtype=torch.bfloat16, seed=11),
    Case("vsa64_bshd_infer", "vsa", True, 64, 1, 8, 4096, 128, grad=False, topk=8, dtype=torch.bfloat16, seed=12),
    Case("vsa128_bhsd_gate", "vsa", False, 128, 1, 8, 4096, 128, gate=True, topk=4, dtype=torch.bfloat16,
         seed=13),
    Case("bs64_bhsd_global4", "bs", False, 64, 2, 8, 4096, 128, map_form="global4", dtype=torch.bfloat16, seed=14),
    Case("bs128_bshd_local4", "bs", True, 128, 1, 8, 4096, 128, map_form="local4", chunks=2,
         dtype=torch.bfloat16, seed=15),
    Case("bs256_bhsd_global3", "bs", False, 256, 1, 8, 4096, 128, map_form="global3", dtype=torch.bfloat16,
         seed=16),
)}
