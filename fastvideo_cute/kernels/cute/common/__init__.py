"""Pieces of CuTe DSL device code that more than one of our kernels uses, each written once:

- :mod:`.walk`: reading a query block's kv list (``map_to_index`` layout) and its tiles' sizes;
- :mod:`.softmax`: key masking, the online-softmax step, the final normalisation and the LSE;
- :mod:`.tcgen05`: the tcgen05 thread-sync fences (sm_100a);
- :mod:`.wgmma`: one wgmma group over a fragment's k-blocks (sm_90a);
- :mod:`.bulk`: bulk (non-tensor) async copies and fp32 reductions by the TMA unit;
- :mod:`.tma`: TMA partitions of row-view tensors.

They are ``@cute.jit`` functions (traced inline into the calling kernel). Importing this package
imports nothing; importing a module of it imports the CuTe DSL.
"""
