#!/bin/bash
#SBATCH --job-name=hpctrain-multi-node
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=08:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm/%x-%j.out
# 2 nodes x 4 GPUs: one DDP task per GPU (launcher=torchrun: one torchrun per node, c10d rendezvous).
# Submit from the project folder (logs go to logs/slurm/, which must exist: mkdir -p logs/slurm):
#   sbatch slurm/multi_node.sh [--config FILE] [--preset NAME] [key=value ...] [--export=LR=2e-5,...]
#   sbatch --export=ALL,LR=2e-5 slurm/multi_node.sh
# Everything after the script name goes to `hpctrain train`; see docs/slurm.md.
# Without --preset the job takes --preset multi_node (--preset none: the YAML alone), and so its own run folder:
# logs/<config stem>-multi_node, or logs/multi_node without --config (never the CPU debug job's logs/debug).
# sbatch runs a copy of this file from its spool folder: the project is found from SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${HPCTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
hpctrain_default_preset=multi_node
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2
hpctrain_job "$@"
