# Device side, for the session after 2026-12-08's thirty-sixth (written then, not yet run): run_s36's locality
# measurements plus the tensor L2 prefetch (tile_prefetch 2 / 4, alone and on the rotated walk), then the fwd64
# GPU suite on the new builds (rotate3, prefetch3, the cache-hint bitwise test), then Nsight Compute on the
# default, tile0 and win16 builds (one launch each beside cuDNN's, S = 32768): memory sections, and the L2
# fabric counters that tell near-partition hits from far ones. After call 1 (stage); carry [".gpu/b", ".gpu/e"];
# results under $OUT.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
timeout ${T1:-420} python3 benchmarks/explore_fwd64_sm90.py --no-gate --rounds ${R:-3} --orders reversed shuffled \
  --variants ${VARS:-W win64 win256 rot396 pf2 pf4 rot396pf2} \
  --out $OUT/fwd64_sm90_${gpu}_locality.json > $OUT/fwd64_sm90_${gpu}_locality.log 2>&1
python3 benchmarks/device/fwd_rows.py $OUT/fwd64_sm90_${gpu}_locality.json
timeout ${T2:-150} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py \
  -k "rotate3 or prefetch3 or cache_hints" > $OUT/${gpu}_fwd64_locality_tests.log 2>&1
tail -2 $OUT/${gpu}_fwd64_locality_tests.log
[ -n "$NO_NCU" ] && exit 0
M=lts__t_sectors.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcnode_gpc.sum,lts__t_sectors_srcunit_tex.sum
for var in base Z W; do
  timeout ${T3:-100} ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --metrics $M \
    python3 benchmarks/profile_fwd64_sm90.py --variant $var > $OUT/ncu_fwd64_${gpu}_${var}.txt 2>&1
  echo "== $var"; grep -E "Duration|L2 Hit|ltcfabric|srcnode_gpc|srcunit_tex|lts__t_sectors.sum|Stall Long|Max Bandwidth" \
    $OUT/ncu_fwd64_${gpu}_${var}.txt | head -24
done
