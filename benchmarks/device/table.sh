# Device side: issue 17's table (64-token blocks, B=1, H=12, D=128, 87.5 %, fwd + bwd, three settled rounds):
# PART=synth (32K, 64K) | grid (Wan-1.3B 480p, tiles 4x4x4) | all; E2E=1 adds video_sparse_attn end to end.
. .gpu/e/setup.sh
gpu=$(python3 -c "import torch;print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
V=${VER:-vNN}; P=${PART:-all}; set -o pipefail
common="--batch 1 --heads 12 --head-dim 128 --block-size 64 --sparsity 0.875 --modes fwd bwd --warmup 25 --rep 100 --rounds ${R:-3} --routes ${ROUTES:-default default-lists} --peers ${PEERS:-cudnn-bsa fa4-bsparse fastvideo}"
if [ "$P" = synth ] || [ "$P" = all ]; then timeout ${T1:-260} python3 benchmarks/bench_vsa.py $common --seqlens 32768 65536 \
  --name vsa_${gpu}_default_synthetic_$V --out $OUT/vsa_${gpu}_default_synthetic_$V.json 2>&1 \
  | tee $OUT/vsa_${gpu}_default_synthetic_$V.log | grep -A6 "^summary"; fi
if [ "$P" = grid ] || [ "$P" = all ]; then timeout ${T2:-150} python3 benchmarks/bench_vsa.py $common --grid 21 30 52 --tile 4 4 4 \
  --name vsa_${gpu}_default_grid_$V --out $OUT/vsa_${gpu}_default_grid_$V.json 2>&1 \
  | tee $OUT/vsa_${gpu}_default_grid_$V.log | grep -A4 "^summary"; fi
if [ -n "${E2E:-}" ]; then timeout ${T3:-150} python3 benchmarks/bench_vsa_e2e.py --presets wan2.1-1.3b-480p --entries ours fastvideo \
  --rounds 3 --name vsa_e2e_${gpu}_$V --out $OUT/vsa_e2e_${gpu}_$V.json 2>&1 | tee $OUT/vsa_e2e_${gpu}_${V}_bench.log | tail -4; fi
