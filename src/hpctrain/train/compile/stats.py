"""What torch.compile did in this process: graphs made, the caches' hits and misses, recompile-limit hits, and
the hop's closing line."""

from __future__ import annotations

import logging
from typing import Any


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far: a change across an update means it compiled (or
    recompiled) in it, so that update's time is compile time, not step time."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class _LimitHits(logging.Filter):
    """Counts Dynamo's "hit config.recompile_limit" warnings: past the limit a function runs eagerly for the rest
    of the process, silently slower (torch keeps no counter of it)."""

    hits = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("torch._dynamo hit config."):
            _LimitHits.hits += 1
        return True


def watch_compiles() -> None:
    """Count recompile-limit hits from now on (once per process)."""
    logger = logging.getLogger("torch._dynamo.convert_frame")
    if not any(isinstance(f, _LimitHits) for f in logger.filters):
        logger.addFilter(_LimitHits())


# (key in compile_stats, torch counter group, counter): the compile caches' outcomes in this process
_CACHE_COUNTERS = (
    ("inductor_cache_hits", "inductor", "fxgraph_cache_hit"),
    ("inductor_cache_misses", "inductor", "fxgraph_cache_miss"),
    ("inductor_cache_bypasses", "inductor", "fxgraph_cache_bypass"),
    ("aot_cache_hits", "aot_autograd", "autograd_cache_hit"),
    ("aot_cache_misses", "aot_autograd", "autograd_cache_miss"),
    ("aot_cache_bypasses", "aot_autograd", "autograd_cache_bypass"),
)


def compile_stats() -> dict[str, int]:
    """torch.compile's process-wide counts so far: graphs made, Inductor's and AOTAutograd's cache hits, misses
    and bypasses (a warm <run.out_dir>/.compile-cache should turn misses into hits), recompile-limit hits."""
    from torch._dynamo.utils import counters

    stats = {"graphs": int(counters["stats"]["unique_graphs"])}
    for key, group, name in _CACHE_COUNTERS:
        stats[key] = int(counters[group][name])
    stats["recompile_limit_hits"] = _LimitHits.hits
    return stats


def compile_summary(before: dict[str, int], updates: int, seconds: float) -> tuple[dict[str, Any], str]:
    """What torch.compile did in this hop (counts since `before`, the updates that compiled and their seconds):
    summary.json's `compile` entry and the hop's closing line."""
    now = compile_stats()
    delta: dict[str, Any] = {key: now[key] - before.get(key, 0) for key in now}
    delta.update(updates=updates, seconds=round(seconds, 3))
    line = (
        f"torch.compile: {delta['graphs']} graph(s) in {seconds:.1f} s over {updates} update(s); cache: "
        f"Inductor {delta['inductor_cache_hits']} hit(s), {delta['inductor_cache_misses']} miss(es), "
        f"AOTAutograd {delta['aot_cache_hits']} hit(s), {delta['aot_cache_misses']} miss(es)"
    )
    if delta["recompile_limit_hits"]:
        line += (
            f"; {delta['recompile_limit_hits']} function(s) hit torch's recompile limit and ran eagerly from then "
            "on (TORCH_LOGS=recompiles says why; ragged shapes should not recompile: report it)"
        )
    return delta, line
