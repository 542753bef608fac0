# Device side, 2026-12-07 (thirty-fifth session), after call 1 (stage): the forward's load probes on the
# default build (probe_loads: V's loop loads skipped / K's and V's skipped / every load of tile 0; wrong
# outputs, the same instruction chain) beside the default and cuDNN's blk64 forward, three rounds, to tell
# whether the 64-token forward waits on L2 bytes. Carry [".gpu/b", ".gpu/e"]; results under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T1:-400} python3 benchmarks/explore_fwd64_sm90.py --no-gate --rounds ${R:-3} --variants V K Z \
  --out $OUT/fwd64_sm90_${gpu}_probe_loads.json > $OUT/fwd64_sm90_${gpu}_probe_loads.log 2>&1
python3 benchmarks/device/fwd_rows.py $OUT/fwd64_sm90_${gpu}_probe_loads.json
