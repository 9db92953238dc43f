"""Readable names with units for the keys the trainer and the hardware monitor log (metrics.jsonl, monitor.py),
so that a panel says "process memory (RSS)" over "resident memory [GB]" instead of `rss gb` over `rss_gb`.

A key not listed gets its words (underscores as spaces) and the unit its suffix names (`_gb`, `_pct`, `_s`, ...).
"""

from __future__ import annotations

import re

# key -> (panel title, axis label with its unit)
KNOWN = {
    "rss_gb": ("process memory (RSS)", "resident memory [GB]"),
    "workers": ("DataLoader worker processes", "workers [count]"),
    "workers_cpu_pct": ("DataLoader workers' CPU use", "CPU [% of one core]"),
    "nonfinite_skips": ("updates skipped (non-finite loss or gradient)", "skipped updates [count]"),
    "critic_steps": ("critic steps per generator update", "critic steps [count]"),
    "stage_wait_s": ("waiting for staged files", "wait [s]"),
    "gpu_mem_peak_gb": ("peak GPU memory (PyTorch)", "allocated [GB]"),
    "muon_nll": ("muon NLL", "NLL per muon [nats]"),
    "multiplicity_nll": ("multiplicity NLL", "NLL per event [nats]"),
}
# gpu{i}_<measure> (monitor.py): one panel per measure, a line per GPU
GPU_KEY = re.compile(r"gpu(?P<index>\d+)_(?P<measure>util_pct|mem_used_gb|power_w|temp_c)")
GPU_MEASURES = {
    "util_pct": ("GPU utilisation", "utilisation [%]"),
    "mem_used_gb": ("GPU memory used", "memory used [GB]"),
    "power_w": ("GPU power", "power [W]"),
    "temp_c": ("GPU temperature", "temperature [°C]"),
}
# a key's last word -> its unit (longest first: `_per_s` before `_s`)
SUFFIX_UNITS = (("_per_s", "1/s"), ("_pct", "%"), ("_gb", "GB"), ("_mb", "MB"), ("_s", "s"), ("_w", "W"))


def readable(key: str) -> tuple[str, str]:
    """(panel title, axis label with unit) for a logged key; its val_ twin reads the same."""
    base = key.removeprefix("val_")
    if base in KNOWN:
        return KNOWN[base]
    gpu = GPU_KEY.fullmatch(base)
    if gpu:
        return GPU_MEASURES[gpu["measure"]]
    for suffix, unit in SUFFIX_UNITS:
        if base.endswith(suffix) and len(base) > len(suffix):
            words = base[: -len(suffix)].replace("_", " ")
            return words, f"{words} [{unit}]"
    words = base.replace("_", " ")
    return words, words


def line_label(key: str) -> str:
    """What a curve's legend says: GPU keys by their GPU, the rest by the key (as in metrics.jsonl)."""
    gpu = GPU_KEY.fullmatch(key)
    if gpu:
        return f"GPU {gpu['index']} ({key})"
    if key.startswith("val_"):
        return f"{key} (validation)"
    if key == "loss_mean":
        return "loss (mean over log window)"
    return f"{key} (train)" if key == "loss" else key
