# Device side, 2026-12-07 (thirty-fifth session), after call 1 (stage): the forward's L2 prefetch
# (l2_prefetch 1 / 2 / 4 list entries ahead: hints, the same bits) and two working-set probes (every load
# from a window of 16 / 128 tiles a head; wrong outputs) beside the default and cuDNN's blk64 forward, three
# rounds. Carry [".gpu/b", ".gpu/e"]; results under $OUT. (l2_prefetch measured 0.36-0.38x the default and
# was removed after this run: its source is in 92556cf; ``f<n>`` no longer parses.)
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T1:-400} python3 benchmarks/explore_fwd64_sm90.py --no-gate --rounds ${R:-3} --variants ${VARS:-f1 f2 f4 W Y} \
  --out $OUT/fwd64_sm90_${gpu}_prefetch.json > $OUT/fwd64_sm90_${gpu}_prefetch.log 2>&1
python3 benchmarks/device/fwd_rows.py $OUT/fwd64_sm90_${gpu}_prefetch.json
timeout ${T2:-90} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py -k prefetch2 \
  > $OUT/${gpu}_fwd64_prefetch2_tests.log 2>&1
tail -2 $OUT/${gpu}_fwd64_prefetch2_tests.log
