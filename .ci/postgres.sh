#!/usr/bin/env bash
# The PostgreSQL server binaries (initdb, pg_ctl) that tests/test_omop_postgres.py starts a throw-away server with:
# installed quietly where missing. If they cannot be installed (no package manager, no network) the tests say so and
# skip; CI goes on.
ensure_postgres() {
  if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    return 0
  fi
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql; } \
      >/dev/null 2>&1 || echo "[ci] could not install PostgreSQL; its tests will skip" >&2
  fi
  return 0
}
ensure_postgres
