#!/usr/bin/env bash
# bench/gpu.py on a lent GPU machine, one part after another, each part's figures kept as soon as it ends.
#
#   bash bench/gpu_lease.sh [PART ...] [-- GPU.PY OPTIONS]    # PART: hop e2e loader step quality (default: all)
#
# From the repository root on that machine (the device tool's `run`, `carry: [".whl"]`):
# - installs the wheels in .whl/ (bench/gpu_wheels.sh downloads them on a machine with a package index) into
#   /tmp/site when hpctrain's imports are missing there;
# - runs `python3 bench/gpu.py --only PART` for each part, with the data kept in $GPU_WORKDIR (default
#   /tmp/hpctrain-gpu) for the next call on the same warm machine;
# - writes under $OUT (default ./gpu-out): machine.txt, gpu-PART.json (that part's figures and its seconds) and
#   gpu-PART.log (its output). A part stopped by the call's time limit keeps its log; the parts before keep
#   their figures. The last line joins the parts' figures (`bench/gpu.py --merge`, also for files of two calls).
# Expected on an H100 (estimated from its first figures, not yet timed as a whole; each part's JSON holds its
# seconds): hop ~4 minutes, e2e and loader ~2, step 3-4, quality 3-5 (4000 updates of the default muon model on
# truth v2, judged every 250, and a 50 k-pair judge at the end). So one lease makes two calls, `hop e2e loader`
# then `step quality`, each inside the 10-minute limit of a call.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
WORK=${GPU_WORKDIR:-/tmp/hpctrain-gpu}
parts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
        hop | e2e | loader | step | quality) parts+=("$1") ;;
        *) echo "error: bench/gpu_lease.sh: unknown part '$1' (hop, e2e, loader, step, quality; options after --)" >&2; exit 2 ;;
    esac
    shift
done
[ "${1:-}" = "--" ] && shift
[ ${#parts[@]} -eq 0 ] && parts=(hop e2e loader step quality)
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1

[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # installed by an earlier call
if ! "$PY" -c "import pydantic, pydantic_settings, dotenv, submitit" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "error: hpctrain's dependencies are missing here and no wheels were carried in .whl/ (bench/gpu_wheels.sh)" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
    case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}

{
    date -u
    git rev-parse HEAD 2>/dev/null || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
    "$PY" -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', os.cpu_count())"
} >"$OUT/machine.txt" 2>&1

status=0
for part in "${parts[@]}"; do
    echo "== $part ($(date -u +%T))"
    rm -f "$OUT/gpu-$part.json"  # a failed part leaves no older figures to be merged as its own
    "$PY" bench/gpu.py --only "$part" --workdir "$WORK" --out "$OUT/gpu-$part.json" "$@" 2>&1 | tee "$OUT/gpu-$part.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && echo "== $part failed (exit $rc): $OUT/gpu-$part.log" && status=1
done
# one JSON line of the parts that ended (a later call's files join them here: python bench/gpu.py --merge ...)
if ls "$OUT"/gpu-*.json >/dev/null 2>&1; then
    "$PY" bench/gpu.py --merge "$OUT"/gpu-*.json || status=1
fi
exit $status
