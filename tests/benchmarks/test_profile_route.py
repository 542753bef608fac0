"""benchmarks/profile_route.py's kernel table on CPU, from a stand-in profiler (the table feeds
profile_route, sweep_map_to_index and bench_vsa_e2e's glue share)."""

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from profile_route import kernel_table  # noqa: E402


def _prof(*events):
    return types.SimpleNamespace(key_averages=lambda: [types.SimpleNamespace(key=k, device_time_total=t, count=c)
                                                      for k, t, c in events])


def test_per_call_times_slowest_first_and_empty_events_dropped():
    table = kernel_table(_prof(("fast", 10.0, 4), ("slow", 60.0, 2), ("idle", 0.0, 0)), iters=2)
    assert list(table) == ["slow", "fast"]
    assert table["slow"] == {"us": 30.0, "launches": 1.0}
    assert table["fast"] == {"us": 5.0, "launches": 2.0}


def test_names_cut_to_key_len():
    table = kernel_table(_prof(("k" * 200, 8.0, 1)), iters=1, key_len=120)
    assert list(table) == ["k" * 120]
    assert list(kernel_table(_prof(("k" * 200, 8.0, 1)), iters=1)) == ["k" * 200]
