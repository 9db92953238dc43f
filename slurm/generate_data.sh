#!/bin/bash
#SBATCH --job-name=hpctrain-data
#SBATCH --array=0-3
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=01:00:00
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm/%x-%A_%a.out
# A CPU array job writing one synthetic data set in parallel: array task k of K writes its share.
# Submit from the project folder (mkdir -p logs/slurm first):
#   sbatch [--array=0-K-1] slurm/generate_data.sh --out DIR --files N [--events-per-file M] [--layout parquet]
#          [--seed S] [--kind muons]
#   sbatch [--array=0-K-1] slurm/generate_data.sh --kind fields --out DIR [--maps N] [--shard-size S] [...]
# muons: task k writes a contiguous range of the --files; fields: the shards whose number is k modulo K, and the
# task that finds every shard present writes each split's meta.json. A file or shard is the same whichever task
# writes it (its random stream is (seed, index)), so any --array gives the data set a single `hpctrain data
# generate` would. sbatch runs a copy of this file: the project is SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${HPCTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2

hpctrain_data_job() {
    hpctrain_setup_env
    hpctrain_parse_args "$@" || exit 2
    local task=${SLURM_ARRAY_TASK_ID:-0} count=${SLURM_ARRAY_TASK_COUNT:-1} first=${SLURM_ARRAY_TASK_MIN:-0}
    local total="" args=() pending=0 arg kind=muons previous=""
    for arg in "${HPCTRAIN_ARGS[@]}"; do
        if [ "$previous" = --kind ]; then kind=$arg; fi
        previous=$arg
        if [ "$pending" = 1 ]; then total=$arg; pending=0; continue; fi
        case "$arg" in
            --files) pending=1 ;;
            --files=*) total=${arg#--files=} ;;
            --kind=*) kind=${arg#--kind=}; args+=("$arg") ;;
            *) args+=("$arg") ;;
        esac
    done
    # A requeued task (preempted, node failure) writes its own files again: they are the same files (their
    # random stream is (seed, index)), so replacing them is no loss; a first run never replaces data.
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then args+=(--overwrite); fi
    # Task index within the array (arrays may start anywhere: --array=4-7).
    local k=$(((task - first) / ${SLURM_ARRAY_TASK_STEP:-1})) lo hi
    if [ "$kind" = fields ]; then
        hpctrain_log "array task $task ($((k + 1))/$count): the fields shards numbered $k modulo $count"
        exec hpctrain data generate "${args[@]}" --share "$k/$count"
    fi
    if ! [[ "$total" =~ ^[1-9][0-9]*$ ]]; then
        hpctrain_log "error: pass --files N (a positive number of files to split over the array tasks)"
        exit 2
    fi
    lo=$((k * total / count))
    hi=$(((k + 1) * total / count))
    if [ "$hi" -le "$lo" ]; then
        hpctrain_log "array task $task has no file to write ($total files over $count tasks)"
        exit 0
    fi
    hpctrain_log "array task $task ($((k + 1))/$count): files $lo..$((hi - 1)) of $total"
    exec hpctrain data generate "${args[@]}" --first-file "$lo" --files "$((hi - lo))"
}

hpctrain_data_job "$@"
