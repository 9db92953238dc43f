# shellcheck shell=bash
# Site settings for the sbatch templates. Copy to hpc/site.sh (git-ignored by convention) and edit:
# slurm/common.sh sources it in every job, after activating .venv and before anything runs.

# Modules your cluster needs (names differ per site: `module avail cuda`).
# module load cuda/12.4 nccl

# Node-local scratch for staging data and temporary files (SLURM_TMPDIR or TMPDIR is read by hpctrain).
# export TMPDIR=/scratch/$USER/$SLURM_JOB_ID
# export DATA_DIR=/project/$USER/data          # referenced as ${DATA_DIR} in configs
# export RESULTS_DIR=/project/$USER/runs       # where run folders go (run.out_dir)

# NCCL over the right network (InfiniBand interface names differ per site).
# export NCCL_SOCKET_IFNAME=ib0
# export NCCL_IB_DISABLE=0

# W&B offline on compute nodes; sync later from a login node (slurm/sync_wandb.sh, hpctrain sync).
# export WANDB_MODE=offline
