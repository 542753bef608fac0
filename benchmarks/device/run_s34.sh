# Device side, 2026-12-07 (thirty-fourth session), after call 1 (stage): the split suite with the new default
# (other dQ builds and the hints switched off / K evict_last: the same bits), then, unless on an H200 (where
# issue 17's table comes next: table.sh, carry [".gpu/d", ".gpu/e"]), the hints explorer (split_nol2 = the
# hint off, split_l2dsk = K evict_last as well), three settled rounds. Carry [".gpu/b", ".gpu/e"]; results
# under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T4:-200} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_bwd64_sm90_split_gpu.py \
  > $OUT/${gpu}_split_suite_tests.log 2>&1
tail -2 $OUT/${gpu}_split_suite_tests.log
[ "$gpu" = h200 ] && [ -z "${EXPLORE:-}" ] && exit 0
timeout ${T5:-170} python3 benchmarks/explore_ds_split.py --cases 65536 32768 grid --rounds ${R:-3} --hints \
  --out $OUT/bwd64_split_${gpu}_hints_s34.json > $OUT/bwd64_split_${gpu}_hints_s34.log 2>&1
python3 benchmarks/device/split_rows.py $OUT/bwd64_split_${gpu}_hints_s34.json
