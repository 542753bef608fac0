# SPDX-License-Identifier: Apache-2.0
"""Device side: one line per case of an ``explore_fwd64_sm90.py`` result (cuDNN's and the default's median
times, the ``--bhsd`` pair, then each ``--orders`` entry against the sorted walk and each ``--variants`` entry
against the default, with its same-bits check). ``python3 benchmarks/device/fwd_rows.py RESULT.json``"""
import json
import sys

for row in json.load(open(sys.argv[1]))["timing"]:
    print(row["seqlen"], row["tile"], "cudnn %.3f ours %.3f (%.3fx)" % (row["cudnn_ms"], row["ours_ms"], row["ours_vs_cudnn"]),
          ("bhsd: cudnn %.3f ours %.3f (%.3fx; bshd/bhsd %.3f)" % tuple(row["bhsd"][k] for k in (
              "cudnn_ms", "ours_ms", "ours_vs_cudnn", "ours_bshd_over_bhsd"))) if "bhsd" in row else "",
          " ".join("%s %.3f ms (%.3fx sorted)" % (k, v["ms"], v["vs_sorted"]) for k, v in row.get("orders", {}).items()),
          " ".join("%s %.3f ms (%.3fx base%s)" % (k, v["ms"], v["vs_base"], ", same bits" if v["bitwise_equal_base"] else "")
                   for k, v in row.get("variants", {}).items()))
