#!/bin/bash
#SBATCH --job-name=hpctrain-single-gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm/%x-%j.out
# One GPU: one task.
# Submit from the project folder (logs go to logs/slurm/, which must exist: mkdir -p logs/slurm):
#   sbatch slurm/single_gpu.sh [--config FILE] [--preset NAME] [key=value ...] [--export=LR=2e-5,...]
#   sbatch --export=ALL,LR=2e-5 slurm/single_gpu.sh
# Everything after the script name goes to `hpctrain train`; see docs/slurm.md.
# Without --preset the job takes --preset single_gpu (--preset none: the YAML alone), and so its own run folder:
# logs/<config stem>-single_gpu, or logs/single_gpu without --config (never the CPU debug job's logs/debug).
# sbatch runs a copy of this file from its spool folder: the project is found from SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${HPCTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
hpctrain_default_preset=single_gpu
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2
hpctrain_job "$@"
