#!/usr/bin/env bash
# Runs an MPI test command whose rank 2 fails on purpose and passes only if mpirun exits
# non-zero and reports that failure: a failing rank must fail the whole run.
# Usage: expect_rank_failure.sh mpirun <flags> -np 4 <test binary> <gtest args>
set -u
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  echo "expect_rank_failure: mpirun exited 0 although rank 2 failed" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -q "deliberate failure on rank 2"; then
  echo "expect_rank_failure: mpirun exited $rc without the deliberate failure" >&2
  exit 1
fi
echo "expect_rank_failure: mpirun exited $rc as expected"
