# SPDX-License-Identifier: Apache-2.0
"""Device side: one line per case of an ``explore_ds_split.py`` result (per-round ratio medians to cuDNN's
time, the entries' same-bits checks). ``python3 benchmarks/device/split_rows.py RESULT.json``"""
import json
import sys

for r in json.load(open(sys.argv[1]))["rows"]:
    print("bwd", r["case"], {k: round(v, 3) for k, v in r["round_ratio_vs_cudnn"].items() if k != "slots"},
          r["variant_bitwise_equal_split"])
