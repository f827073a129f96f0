# Engines started in the background by the scripts that drive them (sourced, not run). Sourcing
# sets up what every such script needs: the run-as-root permission mpirun asks for, the mpirun
# flags of this machine (mpi_flags), a scratch folder (work) and the list of started processes
# (pids), and traps that stop the engines and remove $work on exit (an interrupt exits 130).
# $engine and $train, the build's engine and trainer binaries, are set unless the caller set them
# (from $build_dir, default build).
# Usage: . scripts/lib/engines.sh   (from the repository root)

engine=${engine:-${build_dir:-build}/launcher/engine/weightcast-engine}
train=${train:-${build_dir:-build}/launcher/train/weightcast-train}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
read -r -a mpi_flags <<<"$(bash scripts/mpirun-flags.sh)"
work=$(mktemp -d)
pids=()
trap 'stop_engines; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# Kills every started process, waits for them all, and forgets them.
stop_engines() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  pids=()
}

# Starts "$engine" with the given flags, its output in $work/<name>.log, and sets engine_url once
# it listens, waiting at most <polls> x 50 ms; otherwise prints its log, naming <caller>, and
# returns 1. Call it directly, not in $(...): a subshell would keep the pid to itself and the
# engine would outlive the script.
launch_engine() {  # caller name polls engine-flags...
  local caller=$1 name=$2 polls=$3
  shift 3
  "$engine" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 "$polls"); do
    if engine_url=$(grep -o 'http://[0-9.:]*' "$work/$name.log" 2>/dev/null); then return 0; fi
    sleep 0.05
  done
  echo "$caller: engine $name did not start:" >&2
  cat "$work/$name.log" >&2
  return 1
}
