# Device side: the L2 cache hints of 2026-12-07 (thirty-second session), GPU tests then timing, in one call
# (about 4-5 min on an H100 after setup). Carry [".gpu/b", ".gpu/e"]; results under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T0:-150} python3 -m pytest -q -rA -k l2hints tests/kernels/cute/test_block_sparse_bwd64_sm90_split_gpu.py \
  tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py > $OUT/${gpu}_hints_tests.log 2>&1
tail -2 $OUT/${gpu}_hints_tests.log
timeout ${T1:-200} python3 benchmarks/explore_ds_split.py --cases 65536 32768 grid --rounds ${R:-5} --hints \
  --out $OUT/bwd64_split_${gpu}_hints.json > $OUT/bwd64_split_${gpu}_hints.log 2>&1
timeout ${T2:-200} python3 benchmarks/explore_fwd64_sm90.py --rounds ${R:-5} --variants h xh --no-gate \
  --out $OUT/fwd64_sm90_${gpu}_hints.json > $OUT/fwd64_sm90_${gpu}_hints.log 2>&1
python3 benchmarks/device/split_rows.py $OUT/bwd64_split_${gpu}_hints.json
tail -c 1500 $OUT/fwd64_sm90_${gpu}_hints.log
