#!/bin/bash
# Upload a run's offline W&B data from a small CPU job (the node needs internet; often only login or
# "transfer" partitions have it). A chain runs it after its last hop:
#   sbatch --dependency=afterany:<last job id> --export=ALL,RUN_DIR=logs/<run name> slurm/sync_wandb.sh
# Options go BEFORE the script name (after it they are the script's arguments, not sbatch's).
# WANDB_API_KEY comes from the environment or the project's .env; it is never printed.
#SBATCH --job-name=hpctrain-sync
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=2G
#SBATCH --time=00:30:00
#SBATCH --output=logs/slurm/%x-%j.out
set -euo pipefail

# sbatch runs a copy of this file from its spool folder: find the project from where sbatch was called.
PROJECT_DIR="${HPCTRAIN_PROJECT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"
cd "$PROJECT_DIR"
mkdir -p logs/slurm
if [[ -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi
# A site file may load modules or set proxies (e.g. https_proxy on a transfer node).
if [[ -n "${HPCTRAIN_SITE_ENV:-}" && -f "$HPCTRAIN_SITE_ENV" ]]; then
    # shellcheck disable=SC1090
    source "$HPCTRAIN_SITE_ENV"
fi

RUN_DIR="${1:-${RUN_DIR:-}}"
if [[ -z "$RUN_DIR" ]]; then
    echo "error: give the run folder: --export=ALL,RUN_DIR=logs/<run name> (or as the first argument)" >&2
    exit 2
fi
echo "$(date -Is) job ${SLURM_JOB_ID:-none} on $(hostname): hpctrain sync $RUN_DIR"
# The chain's last hop has ended (afterany), so its offline file is complete or the hop was killed:
# --idle-minutes 0 uploads a killed last hop too.
exec python -m hpctrain sync "$RUN_DIR" --idle-minutes "${SYNC_IDLE_MINUTES:-0}" ${SYNC_WATCH:+--watch "$SYNC_WATCH"}
