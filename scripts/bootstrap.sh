#!/usr/bin/env bash
# One entry point for the README's two commands.
#   bash scripts/bootstrap.sh run  [fcd run options]   set up .venv/, then run the main job (DKT-Synth, 10 sites)
#   bash scripts/bootstrap.sh test [pytest options]    set up .venv/, then run the test suite
# Set-up is idempotent: it reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
py=${PYTHON:-python3}

export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$py" -m venv "$venv"
fi
stamp="$venv/.fcd-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing torch (CPU build) and fcd_secure into .venv (first run takes a few minutes)"
  # torch first and pinned: the CPU wheel lies on disk here; a bare 'torch' would pull a multi-GB CUDA build.
  log="$venv/setup.log"
  if ! { "$venv/bin/pip" install "torch==2.13.0" && "$venv/bin/pip" install -e ".[test]"; } >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    echo "[setup] FAILED: full log in $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

cmd=${1:-run}
shift || true
case "$cmd" in
  run)  exec "$venv/bin/fcd" run "$@" ;;
  # two workers (one per core of the CI machine); the tests that start Flower processes share one worker; no test
  # may hang the run (a per-test limit, generous for a loaded 2-core machine); the slowest tests are listed at the end.
  # One BLAS/OpenMP thread per process: two workers already fill the two cores, and OpenBLAS' extra threads spin
  # while they wait (a numpy matrix loop: 1.7 s CPU with one thread, 3.6-4.1 s with two, and slower in wall time)
  test) exec env OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
          "$venv/bin/python" -m pytest -n "${FCD_TEST_WORKERS:-2}" --dist loadgroup --durations=25 \
          --timeout="${FCD_TEST_TIMEOUT:-900}" "$@" ;;
  setup) echo "[setup] done: $venv/bin/fcd" ;;
  *) echo "usage: bash scripts/bootstrap.sh {run|test|setup} [args...]" >&2; exit 2 ;;
esac
