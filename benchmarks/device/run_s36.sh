# Device side, for the session after 2026-12-07's thirty-fifth (written then, not yet run): the forward's
# locality measurements. The default on its lists walked reversed / shuffled within each row (the same sets:
# does the sorted walk's lockstep across CTAs already pay?), and the working-set probes at 16 / 64 / 128 / 256
# tiles a head (wrong outputs, the same bytes), and rotate_walk=396 (each CTA's walk started by its launch
# order among the 3 x 132 resident CTAs of an H100 / H200; equal to rounding), beside cuDNN's blk64 forward,
# three rounds; then the fwd64 GPU suite on rotate_walk (its first run). After call 1
# (stage); carry [".gpu/b", ".gpu/e"]; results under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T1:-400} python3 benchmarks/explore_fwd64_sm90.py --no-gate --rounds ${R:-3} --orders reversed shuffled \
  --variants ${VARS:-W win64 win128 win256 rot396} \
  --out $OUT/fwd64_sm90_${gpu}_locality.json > $OUT/fwd64_sm90_${gpu}_locality.log 2>&1
python3 benchmarks/device/fwd_rows.py $OUT/fwd64_sm90_${gpu}_locality.json
timeout ${T2:-150} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py -k rotate3 \
  > $OUT/${gpu}_fwd64_rotate_tests.log 2>&1
tail -2 $OUT/${gpu}_fwd64_rotate_tests.log
