#!/usr/bin/env bash
# System (Debian) packages the test suite and the pipeline use, installed with apt when missing.
#   bubblewrap        sandbox of the code-execution verifier (creditlab.rewards.code.sandbox)
#   chromium          headless browser of the MLflow UI / HTML report tests (tests/test_browser.py)
#   chromium-driver   (the matching driver; Playwright drives /usr/bin/chromium over CDP)
#   tools/sysdeps.d/slurm.sh adds slurmctld, slurmd, slurm-client, munge (the one-node SLURM cluster of
#   tests/test_slurm.py)
# Installs only as root on Debian/Ubuntu; otherwise it says what is missing and what then fails.
set -uo pipefail

# command that proves the package is present -> Debian package
declare -A NEED=(
  [bwrap]=bubblewrap
  [chromium]=chromium
  [chromedriver]=chromium-driver
)
# extra packages: SYSDEPS_EXTRA="pkg:cmd pkg:cmd" (tools/sysdeps.d/*.sh may add to NEED too)
for f in "$(dirname "$0")"/sysdeps.d/*.sh; do [ -e "$f" ] && source "$f"; done

missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "sysdeps: apt-get install ${missing[*]}" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "error: apt-get install ${missing[*]} failed" >&2
    exit 1
  fi
else
  echo "warning: missing Debian packages (${missing[*]}) and not root with apt-get: install them yourself;" \
       "without them the code_exec sandbox falls back to a weaker one and the browser and SLURM tests fail" >&2
fi
