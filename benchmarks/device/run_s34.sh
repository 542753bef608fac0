# Device side, 2026-12-07 (thirty-fourth session), after call 1 (stage): on an H200, issue 17's table first
# (v41, the split backward with the dS L2 hint on by default); on any card, the split suite with the new
# default (other dQ builds and the hints switched off / K evict_last: the same bits), then the hints explorer
# (split_nol2 = the hint off, split_l2dsk = K evict_last as well), three settled rounds.
# Carry [".gpu/b", ".gpu/d", ".gpu/e"]; results under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
if [ "$gpu" = h200 ]; then VER=${VER:-v41} E2E=1 T1=${T1:-260} T2=${T2:-150} T3=${T3:-130} bash .gpu/e/table.sh; fi
timeout ${T4:-200} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_bwd64_sm90_split_gpu.py \
  > $OUT/${gpu}_split_suite_tests.log 2>&1
tail -2 $OUT/${gpu}_split_suite_tests.log
[ "$gpu" = h200 ] && [ -z "${EXPLORE:-}" ] && exit 0
timeout ${T5:-170} python3 benchmarks/explore_ds_split.py --cases 65536 32768 grid --rounds ${R:-3} --hints \
  --out $OUT/bwd64_split_${gpu}_hints_s34.json > $OUT/bwd64_split_${gpu}_hints_s34.log 2>&1
python3 - <<PY
import json
d = json.load(open("$OUT/bwd64_split_${gpu}_hints_s34.json"))
for r in d["rows"]:
    print("bwd", r["case"], {k: round(v, 3) for k, v in r["round_ratio_vs_cudnn"].items() if k != "slots"},
          r["variant_bitwise_equal_split"])
PY
