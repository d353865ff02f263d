# shellcheck shell=bash
# Shared part of the shardlm Slurm job scripts, sourced by each: finds shardlm, builds its command
# line from the deck and the overrides, starts the ranks with srun, passes SIGUSR1 on to them and
# requeues the job when shardlm stopped early at a checkpoint.
#
# A job script sets EXPERIMENT, sources this file, then calls
#   shardlm_parse_args "$@"                  # [DECK] [--section.key=value ...] from the sbatch line
#   shardlm_train --fsdp.strategy=...        # its own overrides; the sbatch line's win
# Environment it reads (all optional): DECK, SHARDLM_ARGS (more overrides), BACKEND (cpu|cuda;
# default cuda when the job has GPUs), RUN_DIR (default runs/EXPERIMENT-JOBID), SHARDLM (the
# binary), SHARDLM_MODULE (module to load when shardlm is not on PATH; default shardlm),
# SRUN_MPI (srun --mpi plugin; default pmix, empty for the site default), MAX_REQUEUES (default 20),
# and the site hints SHARDLM_PARAM_DTYPE, SHARDLM_REDUCE_DTYPE, SHARDLM_PEAK_TFLOPS (CUDA only).

set -euo pipefail

: "${EXPERIMENT:?the job script sets EXPERIMENT before sourcing common.sh}"

log() { printf '[%s %s] %s\n' "$(date +%T)" "$EXPERIMENT" "$*"; }
fail() {
  printf '%s: error: %s\n' "$EXPERIMENT" "$*" >&2
  exit 2
}

# shardlm: $SHARDLM, else on PATH, else from the module (a batch shell may lack Lmod's init).
shardlm_find() {
  if [[ -n ${SHARDLM:-} ]]; then
    [[ -x $SHARDLM ]] || fail "SHARDLM=$SHARDLM is not an executable"
    return
  fi
  if ! command -v shardlm >/dev/null; then
    set +eu  # Lmod's scripts are not written for -eu
    if ! type module >/dev/null 2>&1; then
      for init in /etc/profile.d/lmod.sh /usr/share/lmod/lmod/init/bash; do
        # shellcheck source=/dev/null
        if [[ -f $init ]]; then source "$init"; break; fi
      done
    fi
    type module >/dev/null 2>&1 && module load "${SHARDLM_MODULE:-shardlm}"
    set -eu
  fi
  SHARDLM=$(command -v shardlm) ||
    fail "shardlm is not on PATH and 'module load ${SHARDLM_MODULE:-shardlm}' did not provide it (set SHARDLM or load the module before sbatch)"
}

# Overrides by key, in first-seen order; a later value replaces an earlier one, because shardlm
# refuses a key given twice on its command line.
declare -A SHARDLM_OVERRIDE=()
SHARDLM_OVERRIDE_KEYS=()
shardlm_set() {
  local key=$1
  [[ $key =~ ^[a-z_]+\.[a-z_0-9]+$ ]] || fail "'--$key': overrides look like --section.key=value"
  [[ -v SHARDLM_OVERRIDE[$key] ]] || SHARDLM_OVERRIDE_KEYS+=("$key")
  SHARDLM_OVERRIDE[$key]=$2
}
shardlm_set_args() {  # --section.key=value or --section.key value, as shardlm takes them
  while (($#)); do
    case $1 in
      --*=*) local pair=${1#--}; shardlm_set "${pair%%=*}" "${pair#*=}"; shift ;;
      --*) (($# >= 2)) || fail "$1 has no value"; shardlm_set "${1#--}" "$2"; shift 2 ;;
      *) fail "unexpected argument '$1': overrides come after the deck as --section.key=value" ;;
    esac
  done
}
shardlm_has() { [[ -v SHARDLM_OVERRIDE[$1] ]]; }

# The sbatch line: `sbatch SCRIPT [DECK] [--section.key=value ...]`; DECK may come from the
# environment instead.
shardlm_parse_args() {
  if (($#)) && [[ $1 != --* ]]; then
    DECK=$1
    shift
  fi
  [[ -n ${DECK:-} ]] || fail "no input deck: sbatch ${EXPERIMENT}.sbatch DECK [--section.key=value ...] (or DECK=... in the environment)"
  [[ -f $DECK ]] || fail "input deck '$DECK' not found (relative to $PWD)"
  SHARDLM_USER_ARGS=("$@")
  if [[ -n ${SHARDLM_ARGS:-} ]]; then
    local extra
    read -r -a extra <<<"$SHARDLM_ARGS"
    SHARDLM_USER_ARGS=("${extra[@]}" "${SHARDLM_USER_ARGS[@]}")
  fi
}

# cuda when Slurm gave the job GPUs, else cpu.
shardlm_backend() {
  if [[ -n ${BACKEND:-} ]]; then
    [[ $BACKEND == cpu || $BACKEND == cuda ]] || fail "BACKEND=$BACKEND: expected cpu or cuda"
  elif [[ ${SLURM_GPUS_ON_NODE:-0} =~ ^[1-9] ]]; then
    BACKEND=cuda
  else
    BACKEND=cpu
  fi
}

shardlm_ntasks() { echo "${SLURM_NTASKS:-1}"; }
shardlm_nodes() { echo "${SLURM_JOB_NUM_NODES:-1}"; }

# The summaries in a run's metrics.jsonl so far (0 when it has none).
shardlm_summaries() {
  local metrics=$1/metrics.jsonl
  if [[ -f $metrics ]]; then grep -c '"type":"summary"' "$metrics" || true; else echo 0; fi
}

# Whether this attempt stopped early (signal): it wrote a summary beyond the $2 there were before it
# started, and that summary says preempted. An attempt that wrote none (nothing to do: the run had
# finished) did not stop early, whatever an earlier attempt's summary says.
shardlm_stopped_early() {
  local metrics=$1/metrics.jsonl
  (( $(shardlm_summaries "$1") > $2 )) && grep '"type":"summary"' "$metrics" | tail -n 1 | grep -q '"preempted":true'
}

# SIGUSR1 (sbatch --signal=B:USR1@T) goes to this shell, which passes it to srun and so to the
# ranks; trapped from the start, as its default action would end the job script. USR1, not
# SIGTERM: Slurm's SIGTERM (scancel, time limit) is followed by SIGKILL after KillWait (30 s by
# default), which a large checkpoint may not fit in; USR1 at T seconds leaves the margin T for
# a step and the write (docs/checkpoint.md, "Preemption"). Starting the ranks with mpirun instead
# of srun: pass USR1 to mpirun the same way (it forwards it); its SIGTERM kills the ranks in seconds.
SHARDLM_STEP_PID=
shardlm_on_usr1() {
  if [[ -n $SHARDLM_STEP_PID ]]; then
    log "SIGUSR1: shardlm writes a checkpoint at the next step and stops"
    kill -USR1 "$SHARDLM_STEP_PID" 2>/dev/null || true
  else
    log "SIGUSR1 before shardlm started: ignored"
  fi
}
trap shardlm_on_usr1 USR1

# srun the ranks in the background so that this shell can take SIGUSR1 meanwhile; returns srun's
# exit code.
shardlm_srun() {
  local srun=(srun --kill-on-bad-exit=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}")
  [[ -n ${SRUN_MPI-pmix} ]] && srun+=(--mpi="${SRUN_MPI-pmix}")
  log "launch: ${srun[*]} $*"
  "${srun[@]}" "$@" &
  SHARDLM_STEP_PID=$!
  local rc
  while :; do
    wait "$SHARDLM_STEP_PID" && rc=0 || rc=$?
    kill -0 "$SHARDLM_STEP_PID" 2>/dev/null || break  # a trapped signal interrupts wait; wait again
  done
  SHARDLM_STEP_PID=
  return "$rc"
}

shardlm_environment() {
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1} OPENBLAS_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  log "job ${SLURM_JOB_ID:-none} attempt $((${SLURM_RESTART_COUNT:-0} + 1)): $(shardlm_nodes) node(s), $(shardlm_ntasks) rank(s), ${SLURM_CPUS_PER_TASK:-1} CPU(s)/rank, GPUs/node ${SLURM_GPUS_ON_NODE:-0}, backend $BACKEND"
  log "shardlm: $SHARDLM ($("$SHARDLM" --version))"
}

# shardlm train DECK with: the run's defaults, the site hints, the script's overrides ("$@"), then
# the sbatch line's. Requeues the job when shardlm stopped at a checkpoint before the end.
shardlm_train() {
  shardlm_find
  shardlm_backend
  local own_dir=
  [[ -z ${RUN_DIR:-} ]] && own_dir=runs/${EXPERIMENT}-${SLURM_JOB_ID:-$$}
  RUN_DIR=${RUN_DIR:-$own_dir}
  # The job id survives a requeue, so a requeued job resumes its own run and a new job starts afresh.
  shardlm_set run.backend "$BACKEND"
  shardlm_set run.dir "$RUN_DIR"
  shardlm_set checkpoint.resume auto
  if [[ $BACKEND == cuda ]]; then
    [[ -n ${SHARDLM_PARAM_DTYPE:-} ]] && shardlm_set fsdp.param_dtype "$SHARDLM_PARAM_DTYPE"
    [[ -n ${SHARDLM_REDUCE_DTYPE:-} ]] && shardlm_set fsdp.reduce_dtype "$SHARDLM_REDUCE_DTYPE"
    [[ -n ${SHARDLM_PEAK_TFLOPS:-} ]] && shardlm_set run.peak_tflops "$SHARDLM_PEAK_TFLOPS"
  fi
  shardlm_set_args "$@"
  shardlm_set_args "${SHARDLM_USER_ARGS[@]}"
  RUN_DIR=${SHARDLM_OVERRIDE[run.dir]}  # the sbatch line may have moved it
  # A requeued attempt in the job's own folder whose first attempt died before any checkpoint starts again
  # there (resume = auto alone refuses to replace a run it cannot continue). Decided after the sbatch
  # line's overrides: a folder it named is the user's, and so is a run.overwrite it gave.
  if [[ -n $own_dir && $RUN_DIR == "$own_dir" ]] && (( ${SLURM_RESTART_COUNT:-0} > 0 )) && ! shardlm_has run.overwrite; then
    shardlm_set run.overwrite true
  fi
  shardlm_environment

  local args=() key rc=0 summaries
  for key in "${SHARDLM_OVERRIDE_KEYS[@]}"; do args+=("--$key=${SHARDLM_OVERRIDE[$key]}"); done
  summaries=$(shardlm_summaries "$RUN_DIR")
  shardlm_srun "$SHARDLM" train "$DECK" "${args[@]}" || rc=$?

  if ((rc == 0)) && shardlm_stopped_early "$RUN_DIR" "$summaries"; then
    if ((${SLURM_RESTART_COUNT:-0} >= ${MAX_REQUEUES:-20})); then
      log "stopped early, but the job was requeued ${SLURM_RESTART_COUNT} times already (MAX_REQUEUES): not again"
    elif [[ -n ${SLURM_JOB_ID:-} ]]; then
      log "stopped early at a checkpoint: requeueing job $SLURM_JOB_ID; it resumes from $RUN_DIR"
      scontrol requeue "$SLURM_JOB_ID"
      log "exit 0 (requeued)"
      exit 0
    fi
  fi
  log "exit $rc"
  return "$rc"
}

# shardlm COMMAND [ARGS] without a deck (comm-test): the same launch and logging.
shardlm_run() {
  shardlm_find
  shardlm_backend
  shardlm_environment
  local rc=0
  shardlm_srun "$SHARDLM" "$@" || rc=$?
  log "exit $rc"
  return "$rc"
}

# The FSDP settings of an experiment: STRATEGY (default $1) and OFFLOAD=1 (fp32 master and AdamW
# state in host memory), as overrides in STRATEGY_ARGS.
shardlm_strategy() {
  STRATEGY=${STRATEGY:-$1}
  case $STRATEGY in
    FULL_SHARD | SHARD_GRAD_OP | HYBRID_SHARD | HYBRID_SHARD_ZERO2 | NO_SHARD) ;;
    *) fail "STRATEGY=$STRATEGY: expected FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or NO_SHARD" ;;
  esac
  STRATEGY_ARGS=(--fsdp.strategy="$STRATEGY")
  case ${OFFLOAD:-0} in
    1 | true) STRATEGY_ARGS+=(--fsdp.cpu_offload=true) ;;
    0 | false) ;;
    *) fail "OFFLOAD=$OFFLOAD: expected 1 or 0" ;;
  esac
  # The hybrids on one node: shard over each half of its ranks, replicate across the halves.
  local ranks
  ranks=$(shardlm_ntasks)
  if [[ $STRATEGY == HYBRID_SHARD* && $(shardlm_nodes) == 1 ]] && ((ranks >= 2 && ranks % 2 == 0)); then
    STRATEGY_ARGS+=(--dist.ranks_per_node=$((ranks / 2)))
  fi
}

# The experiments of one rank refuse a larger job rather than measure something else.
shardlm_one_rank() {
  [[ $(shardlm_ntasks) == 1 ]] ||
    fail "this experiment runs one rank; the job has $(shardlm_ntasks) (use multi_gpu.sbatch or strategies.sbatch)"
}
