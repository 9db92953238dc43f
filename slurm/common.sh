# shellcheck shell=bash
# The part every sbatch template shares: sourced (never run) by slurm/*.sh, then `hpctrain_job "$@"`.
#
# sbatch runs a COPY of the template from its spool folder, so nothing here is found relative to BASH_SOURCE:
# the project is $HPCTRAIN_HOME, which the template sets from SLURM_SUBMIT_DIR (submit from the project folder,
# or export HPCTRAIN_HOME). Exit codes of the training (src/hpctrain/errors.py): 0 finished, 75 stopped early
# and resumable, 2 bad input, 78 out of device memory at these settings, anything else a failure.

hpctrain_log() { echo "[hpctrain $(date +%H:%M:%S) job ${SLURM_JOB_ID:-none}] $*" >&2; }

# This job as scontrol, squeue and --dependency name it. An array task's own SLURM_JOB_ID may be the array's id
# (the task holding the array's record), for which `scontrol show job` answers for every task and `scontrol
# requeue` requeues them all: an array task is <array job>_<task>.
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    hpctrain_this_job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
else
    hpctrain_this_job=${SLURM_JOB_ID:-}
fi

# ---------------------------------------------------------------------------------------- environment
hpctrain_setup_env() {
    cd "$HPCTRAIN_HOME" || { hpctrain_log "error: project folder $HPCTRAIN_HOME not found"; exit 2; }
    if [ -f "$HPCTRAIN_HOME/.venv/bin/activate" ]; then
        # shellcheck disable=SC1091
        source "$HPCTRAIN_HOME/.venv/bin/activate"
    fi
    # Site specifics (module loads, scratch paths, proxies): see hpc/site.example.sh.
    if [ -f "$HPCTRAIN_HOME/hpc/site.sh" ]; then
        # shellcheck disable=SC1091
        source "$HPCTRAIN_HOME/hpc/site.sh"
    fi
    # A `--export=VAR=...` without ALL strips the job's environment, and srun inherits SLURM_EXPORT_ENV:
    # the inner srun would then fail with "execve(): bash: No such file". Steps get everything.
    export SLURM_EXPORT_ENV=ALL
    # Since SLURM 22.05 srun no longer inherits --cpus-per-task from sbatch: without this every task (and its
    # DataLoader workers) would share one CPU under task/affinity or cgroup binding.
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
    fi
    export PYTHONUNBUFFERED=1
}

# ------------------------------------------------------------------------------------------ arguments
# `sbatch script.sh --export=LR=2e-5` hands `--export=...` to the SCRIPT, not to sbatch: export its variables
# here. Everything else (--config, --preset, key=value) goes to `hpctrain train`, in order. Without a --preset,
# the template's own (hpctrain_default_preset, e.g. multi_gpu) comes first: the run gets its own folder
# (<config stem>-<preset>) instead of continuing the CPU debug job's logs/debug.
hpctrain_parse_args() {
    HPCTRAIN_ARGS=()
    local arg pending=0
    for arg in "$@"; do
        if [ "$pending" = 1 ]; then
            hpctrain_export_list "$arg" || return 2
            pending=0
            continue
        fi
        case "$arg" in
            --export=*) hpctrain_export_list "${arg#--export=}" || return 2 ;;
            --export) pending=1 ;;
            *) HPCTRAIN_ARGS+=("$arg") ;;
        esac
    done
    if [ "$pending" = 1 ]; then
        hpctrain_log "error: --export needs NAME=VALUE[,NAME=VALUE...]"
        return 2
    fi
    if [ -n "${hpctrain_default_preset:-}" ]; then
        for arg in "${HPCTRAIN_ARGS[@]}"; do
            case "$arg" in --preset | --preset=*) return 0 ;; esac
        done
        HPCTRAIN_ARGS=(--preset "$hpctrain_default_preset" "${HPCTRAIN_ARGS[@]}")
    fi
}

# An array task of a sweep (slurm/sweep.sh --sweep-plan PLAN): the arguments of its own element of the plan, by
# SLURM_ARRAY_TASK_ID (a requeued task keeps it). They replace the original ones, so that an afterany successor
# (a plain job, no array task) runs the same element, and so continues the same run folder.
hpctrain_sweep_element() {
    [ "${HPCTRAIN_ORIGINAL_ARGS[0]:-}" = --sweep-plan ] || return 0
    local plan=${HPCTRAIN_ORIGINAL_ARGS[1]:-} words
    if [ -z "${SLURM_ARRAY_TASK_ID:-}" ] || [ "${#HPCTRAIN_ORIGINAL_ARGS[@]}" != 2 ]; then
        hpctrain_log "error: --sweep-plan PLAN runs as a job array task, with nothing after it" \
            "(sbatch --array=0-N slurm/sweep.sh --sweep-plan PLAN)"
        return 2
    fi
    words=$(python -m hpctrain.launch.sweep args "$plan" "$SLURM_ARRAY_TASK_ID") || return 2
    eval "HPCTRAIN_ORIGINAL_ARGS=($words)"
    # Successors (afterany) append to this task's log, whatever their own job ids (they inherit the variable).
    export HPCTRAIN_SWEEP_LOG="logs/slurm/${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out"
    hpctrain_log "sweep element $SLURM_ARRAY_TASK_ID of $plan: ${HPCTRAIN_ORIGINAL_ARGS[*]}"
}

# The short names hpctrain reads (config/loading.py ENV_ALIASES and ENV_KEYS, and DATA_DIR; a test keeps the two
# lists equal). HPCTRAIN_SECTION__KEY names and the libraries' own variables pass too; any other name would be
# silently ignored by the training, so it is refused.
HPCTRAIN_EXPORT_NAMES="LR BATCH_SIZE GLOBAL_BATCH_SIZE TOTAL_UPDATES EPOCHS SEED GPUS NODES DATA_TYPE TRAIN_SAMPLES VAL_SAMPLES"
HPCTRAIN_EXPORT_NAMES+=" RESULTS_DIR DATA_DIR WANDB_API_KEY BEARER_TOKEN"

hpctrain_known_export() {
    case " $HPCTRAIN_EXPORT_NAMES " in *" $1 "*) return 0 ;; esac
    case "$1" in
        HPCTRAIN_* | NCCL_* | CUDA_* | TORCH_* | OMP_* | MKL_* | WANDB_* | PYTHON* | UCX_* | FI_* | GLOO_*) return 0 ;;
        HF_* | TMPDIR | PATH | LD_LIBRARY_PATH) return 0 ;;
    esac
    return 1
}

hpctrain_export_list() {
    local item items
    IFS=',' read -r -a items <<<"$1"
    for item in "${items[@]}"; do
        case "$item" in
            ALL | NONE | NIL | "") ;;  # sbatch's keywords: the job already has its environment
            *=*)
                if [[ ! "${item%%=*}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
                    hpctrain_log "error: --export item '$item': '${item%%=*}' is not a variable name"
                    return 2
                fi
                if ! hpctrain_known_export "${item%%=*}"; then
                    hpctrain_log "error: --export ${item%%=*}: not a name hpctrain reads (known: ${HPCTRAIN_EXPORT_NAMES// /, }; or HPCTRAIN_SECTION__KEY, e.g. HPCTRAIN_OPTIM__LR; or key=value after the script)"
                    return 2
                fi
                export "${item?}"
                ;;
            *)
                # `--export=NAME` means "pass NAME from the submitting shell": it is in our environment already.
                if [[ ! "$item" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
                    hpctrain_log "error: --export item '$item' is not NAME or NAME=VALUE"
                    return 2
                fi
                ;;
        esac
    done
}

# ----------------------------------------------------------------------------------------- shielding
# A stop signal (USR1 at the walltime warning or a preemption, TERM at the limit or a cancel) may come at any
# moment, also while a process of this job starts: Python runs no handler before its interpreter is up and
# `hpctrain train` has installed them, so a signal then would kill it (exit 138/143, a failed hop that ends the
# chain), and a helper killed by it (the check, the chain, sbatch) would fail the hop the same way. So they all
# start with the stop signals BLOCKED (perl sets the mask and execs: ~2 ms of its own start are the only window
# left): a blocked signal is not lost but pending; `hpctrain train` unblocks it once its handlers are in place
# (runtime/signals.py), so it arrives as a stop, and a helper ends with it still pending (discarded at exit). This
# shell has its traps (hpctrain_job) and decides itself what a signal means for the hop.
if command -v perl >/dev/null 2>&1; then
    hpctrain_shield=(perl -MPOSIX -e 'sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGUSR1, SIGUSR2, SIGTERM, SIGINT))
        or die "sigprocmask: $!\n"; exec {$ARGV[0]} @ARGV or die "exec $ARGV[0]: $!\n"' --)
else
    hpctrain_shield=()
fi

# --------------------------------------------------------------------------------------------- checks
# Validate the config and this allocation against it before anything runs; sets hpctrain_run_dir,
# hpctrain_resubmit, hpctrain_max_resubmits, hpctrain_max_idle, hpctrain_launcher, hpctrain_dist_timeout,
# hpctrain_requeue_code and hpctrain_signal_lead. The check reads the job's real settings from SLURM (time limit, GPUs, tasks: sbatch's own
# options win over the #SBATCH lines). SLURM shows no job's --signal, so the script's line is only the fallback
# when slurm.signal_lead_seconds is not given (`submit --check` says so in one warning line).
hpctrain_check() {
    local lead settings
    lead=$(grep -m1 -oE '^#SBATCH[[:space:]]+--signal=([A-Z]+:)?[A-Z0-9]+@[0-9]+' "$0" | sed 's/.*@//')
    hpctrain_signal_lead=$lead
    settings=$("${hpctrain_shield[@]}" hpctrain submit --check ${lead:+--signal-lead "$lead"} "${HPCTRAIN_ARGS[@]}") || {
        hpctrain_log "error: the configuration or the job settings are wrong (above); nothing was run"
        exit 2
    }
    eval "$settings"
}

hpctrain_master() {
    local head addr
    head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    # Node names do not always resolve (e.g. hpc/local-cluster): fall back to the node's NodeAddr.
    if getent hosts "$head" >/dev/null 2>&1; then
        addr=$head
    else
        addr=$(scontrol show node -o "$head" | grep -oE 'NodeAddr=[^ ]+' | cut -d= -f2)
    fi
    export MASTER_ADDR=${addr:-$head}
    # 12000-31999: below Linux's ephemeral ports (32768+), which outgoing connections take at random
    export MASTER_PORT=$((12000 + SLURM_JOB_ID % 20000))
}

# ---------------------------------------------------------------------------------------------- chain
hpctrain_chain() {  # hpctrain_chain start|next [exit code]
    "${hpctrain_shield[@]}" python -m hpctrain.launch.chain "$1" "$hpctrain_run_dir" --exit-code "${2:-75}" \
        --max-resubmits "$hpctrain_max_resubmits" --max-idle "$hpctrain_max_idle"
}

hpctrain_script_path() {
    scontrol show job -o "$hpctrain_this_job" | grep -oE 'Command=[^ ]+' | cut -d= -f2
}

# afterany: queue the successor first, so a hop killed without warning still continues the chain.
hpctrain_submit_successor() {
    local script tres gres existing
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
        # Requeued by SLURM itself (node failure): the successor queued by the first run is still there.
        existing=$(squeue -h -u "${USER:-$(id -un)}" -o '%i %E' 2>/dev/null |
            awk -v d="afterany:$hpctrain_this_job" 'index($2, d) {print $1; exit}')
        if [ -n "$existing" ]; then
            hpctrain_successor=$existing
            hpctrain_log "successor job $existing already queued (afterany:$hpctrain_this_job)"
            return 0
        fi
    fi
    script=$(hpctrain_script_path)
    if [ -z "$script" ] || [ ! -f "$script" ]; then
        hpctrain_log "error: cannot find this job's script ($script) to queue its successor"
        return 1
    fi
    tres=$(scontrol show job -o "$hpctrain_this_job")
    gres=$(grep -oE 'TresPerNode=[^ ]+' <<<"$tres" | cut -d= -f2 | sed -E 's#^gres[:/]##')
    # The successor inherits this shell's environment (sbatch --export=ALL): no array task's variables, which SLURM
    # would leave in place for a job that is no array task (it would take itself for this task).
    # HPCTRAIN_PREDECESSOR: a successor of a job that `hpctrain cancel` named does not start (launch/chain.py).
    hpctrain_successor=$("${hpctrain_shield[@]}" env -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID -u SLURM_ARRAY_TASK_COUNT \
        -u SLURM_ARRAY_TASK_MIN -u SLURM_ARRAY_TASK_MAX -u SLURM_ARRAY_TASK_STEP HPCTRAIN_PREDECESSOR="$hpctrain_this_job" \
        sbatch --parsable --dependency="afterany:$hpctrain_this_job" --comment="hpctrain:sbatch:$hpctrain_run_dir" \
        --job-name="$SLURM_JOB_NAME" --chdir="$SLURM_SUBMIT_DIR" \
        --nodes="$SLURM_JOB_NUM_NODES" ${SLURM_NTASKS_PER_NODE:+--ntasks-per-node="$SLURM_NTASKS_PER_NODE"} \
        ${gres:+--gres="$gres"} --time="$(grep -oE 'TimeLimit=[^ ]+' <<<"$tres" | cut -d= -f2)" \
        ${SLURM_JOB_PARTITION:+--partition="$SLURM_JOB_PARTITION"} \
        ${SLURM_JOB_ACCOUNT:+--account="$SLURM_JOB_ACCOUNT"} ${SLURM_JOB_QOS:+--qos="$SLURM_JOB_QOS"} \
        ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} \
        ${SLURM_MEM_PER_NODE:+--mem="${SLURM_MEM_PER_NODE}M"} ${HPCTRAIN_SWEEP_LOG:+--output="$HPCTRAIN_SWEEP_LOG"} \
        "$script" "${HPCTRAIN_ORIGINAL_ARGS[@]}") || return 1
    hpctrain_successor=${hpctrain_successor%%;*}
    hpctrain_log "successor job $hpctrain_successor queued (afterany:$hpctrain_this_job)"
}

hpctrain_cancel_successor() {
    if [ -n "${hpctrain_successor:-}" ]; then
        scancel "$hpctrain_successor" && hpctrain_log "cancelled successor job $hpctrain_successor ($1)"
    fi
}

# ------------------------------------------------------------------------------------------ launching
hpctrain_launch() {
    local cpus=${SLURM_CPUS_PER_TASK:-1}
    if [ "$hpctrain_launcher" = torchrun ]; then
        local gpus=${SLURM_GPUS_ON_NODE:-0} per_node
        per_node=$((gpus > 0 ? gpus : 1))
        # One torchrun per node (never srun ntasks-per-node=G around torchrun nproc G: G^2 processes). torchrun
        # ignores USR1 (its default action would kill it); its workers install their own stop handler.
        srun --kill-on-bad-exit=0 --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
            --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-$cpus}" \
            bash -c 'trap "" USR1; exec torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$0" \
                --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
                -m hpctrain train "$@"' "$per_node" "${HPCTRAIN_ARGS[@]}" &
    else
        # One task per GPU (or per requested task): RANK/WORLD_SIZE/LOCAL_RANK from the step's SLURM variables.
        # Each task starts shielded (above): a stop signal srun relays, or SLURM sends the step, during its
        # start-up reaches its handlers instead of killing it.
        srun --kill-on-bad-exit=0 "${hpctrain_shield[@]}" hpctrain train "${HPCTRAIN_ARGS[@]}" &
    fi
    hpctrain_step_pid=$!
}

# The signal before the time limit (#SBATCH --signal=B:USR1@lead) reaches only this shell: pass it on to the
# step (srun relays it to every task). bash runs traps only between commands, hence `&` and the wait loop.
# Installed before anything else: an untrapped USR1 would kill this shell (signals may come early).
# srun answers a TERM by SIGKILLing its tasks ("forcing job termination"): a TERM is passed on as USR1, which srun
# relays as it is and the training takes as the same stop. (A TERM that SLURM sends to every process of the job
# reaches srun too, and kills the tasks anyway: hpctrain_job then counts the hop as stopped, see below.)
hpctrain_forward() {
    hpctrain_stop_signal=$1
    if [ -n "${hpctrain_step_pid:-}" ] && [ -z "${hpctrain_step_done:-}" ]; then
        if [ "$1" = USR1 ] && hpctrain_defer_early_warning; then
            return
        fi
        hpctrain_log "got SIG$1: asking the training to save and stop"
        kill -s USR1 "$hpctrain_step_pid" 2>/dev/null
    elif [ -z "${hpctrain_step_pid:-}" ]; then
        # Before the launch the tasks could not honour it yet (no handler during start-up): do not start.
        hpctrain_log "got SIG$1 before the training started: not starting this hop"
        hpctrain_stop_before_start=1
    else
        hpctrain_log "got SIG$1 after the training ended: ignored"
    fi
}

# slurmctld checks time limits every ~30 s, so the walltime warning comes up to a minute before `lead`: passed on
# at once it would end every hop that much early. A USR1 inside that window is the warning: pass it on at
# `lead` seconds before the end (the trainer's own deadline usually stops it first). Earlier USR1s (a preemption)
# go through at once.
hpctrain_defer_early_warning() {
    local end now remaining lead=${hpctrain_signal_lead:-}
    [ -n "$lead" ] || return 1
    end=$(scontrol show job -o "$hpctrain_this_job" 2>/dev/null | grep -oE 'EndTime=[0-9T:-]+' | cut -d= -f2)
    [ -n "$end" ] || return 1
    end=$(date -d "$end" +%s 2>/dev/null) || return 1
    now=$(date +%s)
    remaining=$((end - now))
    if [ "$remaining" -gt $((lead + 1)) ] && [ "$remaining" -le $((lead + 65)) ]; then
        hpctrain_log "walltime warning $((remaining - lead)) s early: passing it on $lead s before the end"
        (sleep $((remaining - lead)) && kill -s USR1 "$hpctrain_step_pid" 2>/dev/null) &
        return 0
    fi
    return 1
}

hpctrain_wait_step() {
    local rc
    while :; do
        wait "$hpctrain_step_pid"
        rc=$?
        # A trapped signal interrupts `wait` (rc > 128) while srun still runs (a zombie still answers kill -0).
        kill -0 "$hpctrain_step_pid" 2>/dev/null || break
    done
    if [ "$rc" -gt 128 ]; then
        # The signal interrupted `wait` just as the step ended: its stored status is still there to collect.
        local again
        wait "$hpctrain_step_pid" 2>/dev/null
        again=$?
        [ "$again" != 127 ] && rc=$again
    fi
    return "$rc"
}

# torchrun reports a worker's 75 (or 78) as its own failure: the run folder's summary.json says what really happened.
hpctrain_resolve_torchrun_rc() {
    local rc=$1
    if [ "$hpctrain_launcher" = torchrun ] && [ "$rc" != 0 ] && [ -f "$hpctrain_run_dir/summary.json" ] &&
        [ "$hpctrain_run_dir/summary.json" -nt "$hpctrain_hop_marker" ]; then
        case "$(python -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["status"], s.get("exit_code", ""))' \
            "$hpctrain_run_dir/summary.json" 2>/dev/null)" in
            stopped*) rc=75 ;;
            finished* | already_finished*) rc=0 ;;
            "failed 78") rc=78 ;; # out of device memory at these settings: the chain stops
        esac
    fi
    echo "$rc"
}

# ------------------------------------------------------------------------------------------------ job
hpctrain_job() {
    HPCTRAIN_ORIGINAL_ARGS=("$@")
    hpctrain_step_pid=""
    hpctrain_stop_before_start=""
    hpctrain_stop_signal=""
    trap 'hpctrain_forward USR1' USR1
    trap 'hpctrain_forward USR1' USR2
    trap 'hpctrain_forward TERM' TERM
    hpctrain_setup_env
    hpctrain_sweep_element || exit 2
    hpctrain_parse_args "${HPCTRAIN_ORIGINAL_ARGS[@]}" || exit 2
    mkdir -p logs/slurm
    hpctrain_check
    # The run folder in the job's comment: `hpctrain cancel --job ID` (and `hpctrain cancel RUN`) find it there.
    scontrol update JobId="$hpctrain_this_job" Comment="hpctrain:sbatch:$hpctrain_run_dir" 2>/dev/null ||
        hpctrain_log "note: could not set this job's comment (hpctrain cancel finds the job through chain.json)"
    hpctrain_master
    hpctrain_log "run folder $hpctrain_run_dir; $SLURM_JOB_NUM_NODES node(s) $SLURM_JOB_NODELIST;" \
        "master $MASTER_ADDR:$MASTER_PORT; launcher $hpctrain_launcher; resubmit $hpctrain_resubmit;" \
        "restart ${SLURM_RESTART_COUNT:-0}"
    if ! hpctrain_chain start >/dev/null; then
        exit 1
    fi
    hpctrain_successor=""
    if [ "$hpctrain_resubmit" = afterany ]; then
        hpctrain_submit_successor || exit 1
    fi
    if [ -n "$hpctrain_stop_before_start" ]; then
        hpctrain_after 75
    fi
    hpctrain_hop_marker=$(mktemp "${TMPDIR:-/tmp}/hpctrain-hop.XXXXXX")
    hpctrain_launch
    hpctrain_wait_step
    local rc=$?
    hpctrain_step_done=1
    # train.requeue_exit_code: the training's own code for a resumable stop; the chain speaks 75
    [ "$rc" = "${hpctrain_requeue_code:-75}" ] && rc=75
    rc=$(hpctrain_resolve_torchrun_rc "$rc")
    rm -f "$hpctrain_hop_marker"
    hpctrain_after "$(hpctrain_stopped_rc "$rc")"
}

# A step that ended otherwise than finished (0), stopped (75) or refused (2) after this shell got a stop signal
# was ended by it: srun killed its tasks on a TERM, or a task died of the signal before its handlers (no perl).
# Every checkpoint is complete or absent at any kill (docs/reliability.md), so this is a stop like any other: the
# chain goes on from the last checkpoint (and its no-progress cap ends a chain of such hops).
hpctrain_stopped_rc() {
    local rc=$1
    case "$rc" in
        0 | 2 | 75 | 78) ;;
        *)
            if [ -n "${hpctrain_stop_signal:-}" ]; then
                hpctrain_log "the training ended with exit code $rc after SIG$hpctrain_stop_signal: counted as a" \
                    "stop (its last complete checkpoint is kept)"
                rc=75
            fi
            ;;
    esac
    echo "$rc"
}

hpctrain_after() {
    local rc=$1
    case "$rc" in
        0)
            hpctrain_log "training finished"
            hpctrain_cancel_successor "run finished"
            exit 0
            ;;
        75)
            if ! hpctrain_chain next 75 >/dev/null; then
                hpctrain_cancel_successor "chain stopped"
                exit 75
            fi
            case "$hpctrain_resubmit" in
                requeue)
                    hpctrain_log "stopped early and resumable: requeueing job $hpctrain_this_job"
                    scontrol requeue "$hpctrain_this_job" || { hpctrain_log "error: scontrol requeue failed"; exit 75; }
                    # The controller ends this run of the job now; do not report a state of our own.
                    trap - TERM
                    sleep 60 &
                    wait
                    exit 0
                    ;;
                afterany)
                    hpctrain_log "stopped early and resumable: successor job $hpctrain_successor continues"
                    exit 0
                    ;;
                *)
                    hpctrain_log "stopped early and resumable (slurm.resubmit=none): submit again to continue"
                    exit 75
                    ;;
            esac
            ;;
        *)
            hpctrain_log "training failed (exit code $rc)"
            hpctrain_cancel_successor "run failed"
            exit "$rc"
            ;;
    esac
}
