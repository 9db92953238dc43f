"""Field generation speed against the speed of its FFTs alone (same sizes, same library, same run).

Prints one line per kind, then ONE JSON object (the first kind's figures at top level, every kind under
`per_kind`): maps_per_s generated, fft_maps_per_s (maps per second if only the FFTs of the generator ran), and
ratio = maps_per_s / fft_maps_per_s (1 would mean the FFTs are all the cost).

    python bench/fields.py --size 64 --batch 256 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from hpctrain.workloads.fields.generate import generate_maps, irfft2, rfft2

PRIOR = [(0.1, 0.5), (0.6, 1.0)]
# (forward, inverse) real FFTs per map (the white noise is drawn in Fourier space): gaussian/lognormal 0 + 1;
# lpt 1 + 7 (psi1 x2, phi_ij x3, the 2nd order source forward, psi2 x2).
FFTS = {"gaussian": (0, 1), "lognormal": (0, 1), "lpt": (1, 7)}


def best_rate(fn, maps: int, repeats: int) -> float:
    """Maps per second of the fastest repeat (the least disturbed by other processes on a shared machine)."""
    fn()  # warm-up: FFT plans, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return maps / min(times)


def measure(kind: str, size: int, batch: int, repeats: int) -> dict[str, float]:
    counter = {"next": 0}

    def generate() -> None:
        # New indices every call: nothing is cached between repeats.
        start = counter["next"]
        counter["next"] += batch
        generate_maps(kind, range(start, start + batch), 0, "train", size, 1000.0, PRIOR)

    real = np.random.default_rng(0).standard_normal((batch, size, size), dtype=np.float32)
    modes = rfft2(real)
    forward, inverse = FFTS[kind]

    def ffts_only() -> None:
        for _ in range(forward):
            rfft2(real)
        for _ in range(inverse):
            irfft2(modes, size)

    maps_per_s = best_rate(generate, batch, repeats)
    fft_maps_per_s = best_rate(ffts_only, batch, repeats)
    return {"maps_per_s": maps_per_s, "fft_maps_per_s": fft_maps_per_s, "ratio": maps_per_s / fft_maps_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=64, help="map side (default 64)")
    parser.add_argument("--batch", type=int, default=256, help="maps per generator call (default 256)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls; the fastest counts (default 5)")
    parser.add_argument("--kinds", default="gaussian,lognormal,lpt", help="comma-separated kinds")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FFTS]
    if unknown:
        raise SystemExit(f"error: unknown kinds {unknown}; choose from {', '.join(FFTS)}")
    per_kind = {}
    for kind in kinds:
        per_kind[kind] = measure(kind, args.size, args.batch, args.repeats)
        r = per_kind[kind]
        print(
            f"{kind:>9} {args.size}x{args.size}: {r['maps_per_s']:8.0f} maps/s generated, "
            f"{r['fft_maps_per_s']:8.0f} maps/s FFTs only, ratio {r['ratio']:.2f}",
            flush=True,
        )
    first = per_kind[kinds[0]]
    print(
        json.dumps({"kind": kinds[0], "size": args.size, "batch": args.batch, **first, "per_kind": per_kind})
    )


if __name__ == "__main__":
    main()
