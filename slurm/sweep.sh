#!/bin/bash
#SBATCH --job-name=hpctrain-sweep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm/%x-%A_%a.out
# One job array for a sweep: array task k trains element k of the plan `hpctrain submit --sweep` wrote (its own
# run folder, named from the element's values) and chains on its own: a requeued task keeps its index.
# `hpctrain submit --sweep KEY=V1,V2 ...` queues a copy of this with the config's slurm settings; by hand, e.g.
# elements 3 and 5 of a plan again:
#   sbatch --array=3,5 slurm/sweep.sh --sweep-plan logs/slurm/sweeps/<sweep>/plan.json
# sbatch runs a copy of this file from its spool folder: the project is found from SLURM_SUBMIT_DIR.
HPCTRAIN_HOME="${HPCTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
source "$HPCTRAIN_HOME/slurm/common.sh" || exit 2
hpctrain_job "$@"
