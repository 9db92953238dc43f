#!/bin/bash
# The executable of hpc/condor/train.sub: one execution of a self-checkpointing HTCondor job (docs/condor.md).
#   train.sh CONFIG RUN TIME_LIMIT [key=value ...]
# Runs `hpctrain train` in the job's scratch folder with the run folder at runs/RUN (transferred back at each
# checkpoint exit), stopping after TIME_LIMIT with exit 85 (train.requeue_exit_code=85), HTCondor's
# "checkpointed, start me again". A stop signal (an eviction's TERM) reaches the training, which saves and stops.
# After an 85 the run's chain rule is asked (python -m hpctrain.launch.chain): executions that completed no
# update, twice in a row, end the job with exit 1 instead of restarting it forever.
set -u
if [ $# -lt 3 ]; then
    echo "error: usage: train.sh CONFIG RUN TIME_LIMIT [key=value ...] (hpc/condor/train.sub passes them)" >&2
    exit 2
fi
config=$1 run=$2 limit=$3
shift 3
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
trap '[ -n "$child" ] && kill -USR1 "$child" 2>/dev/null' USR1
# The Python that has hpctrain (a container's, or a transferred environment's): python3, else the interpreter of
# the `hpctrain` script on PATH.
if python3 -c 'import hpctrain' 2>/dev/null; then
    py=(python3)
elif command -v hpctrain >/dev/null 2>&1; then
    read -r -a py < <(sed -n '1s/^#!//p' "$(command -v hpctrain)")
else
    echo "error: no hpctrain here: neither python3 -c 'import hpctrain' nor an hpctrain on PATH (use a container" \
        "or transfer an environment with it, docs/condor.md)" >&2
    exit 2
fi
"${py[@]}" -m hpctrain train --config "$config" run.out_dir=runs "run.name=$run" train.requeue_exit_code=85 \
    "budget.time_limit=$limit" "$@" &
child=$!
while :; do
    wait "$child"
    rc=$?
    kill -0 "$child" 2>/dev/null || break # a trapped signal interrupts wait while the training still runs
done
if [ "$rc" = 85 ]; then
    "${py[@]}" -m hpctrain.launch.chain next "runs/$run" --exit-code 75 --max-resubmits 1000000 --max-idle 2 \
        >/dev/null || exit 1
fi
exit "$rc"
