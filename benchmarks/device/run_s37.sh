# Device side, for the session after 2026-12-08's thirty-sixth (written then, not yet run). After call 1 (stage);
# carry [".gpu/b", ".gpu/e"]; results under $OUT. Two calls:
#   PART=bench (default, ~5 min): run_s36's locality measurements, the same cases in BHSD, the tensor L2 prefetch (tile_prefetch 2 / 4,
#     alone and on the rotated walk) beside cuDNN's blk64 forward, then the fwd64 GPU suite on the new builds
#     (rotate3, prefetch3, the cache-hint bitwise test);
#   PART=ncu (~4 min): Nsight Compute on the default, tile0 and win16 builds (one launch each beside cuDNN's,
#     S = 32768): memory and warp-state sections, then the L2 counters that this ncu knows among the fabric ones
#     (sectors that crossed between the two L2 partitions), so an unknown name cannot sink the pass. The L2's
#     sectors against the bytes the loads move also say whether reads of one tile by many CTAs at once are
#     merged before the L2 (tile0 far below the default's count would mean lockstep walks pay).
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
if [ "${PART:-bench}" = bench ]; then
  timeout ${T1:-420} python3 benchmarks/explore_fwd64_sm90.py --no-gate --rounds ${R:-3} --orders reversed shuffled --bhsd \
    --variants ${VARS:-W win64 win256 rot396 pf2 pf4 rot396pf2} \
    --out $OUT/fwd64_sm90_${gpu}_locality.json > $OUT/fwd64_sm90_${gpu}_locality.log 2>&1
  python3 benchmarks/device/fwd_rows.py $OUT/fwd64_sm90_${gpu}_locality.json
  timeout ${T2:-150} python3 -m pytest -q -rA -m gpu tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py \
    -k "rotate3 or prefetch3 or cache_hints" > $OUT/${gpu}_fwd64_locality_tests.log 2>&1
  tail -2 $OUT/${gpu}_fwd64_locality_tests.log
fi
if [ "$PART" = ncu ]; then
  want="lts__t_sectors.sum lts__t_sector_hit_rate.pct lts__t_sectors_srcunit_ltcfabric.sum
        lts__t_sectors_srcunit_ltcfabric_lookup_hit.sum lts__t_sectors_srcunit_ltcfabric_lookup_miss.sum
        lts__t_sectors_srcunit_tex.sum lts__t_sectors_srcunit_tex_lookup_hit.sum lts__t_requests_srcunit_tex.sum
        dram__bytes_read.sum"
  ncu --query-metrics > $OUT/ncu_metrics.txt 2>&1
  M=$(for m in $want; do grep -q "^${m%.*} " $OUT/ncu_metrics.txt && printf '%s,' $m; done); M=${M%,}
  echo "metrics: $M"
  for var in base Z W; do
    timeout ${T3:-80} ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables --section WarpStateStats ${M:+--metrics $M} \
      python3 benchmarks/profile_fwd64_sm90.py --variant $var > $OUT/ncu_fwd64_${gpu}_${var}.txt 2>&1
    echo "== $var"; grep -E "^  [a-z_]|Duration|L2 Hit|ltcfabric|srcunit|lts__|Stall Long|Long Scoreboard" \
      $OUT/ncu_fwd64_${gpu}_${var}.txt | head -30
  done
fi
