#!/usr/bin/env bash
# Prints the folder of the project's Python environment: outside the clone, keyed by the hash
# of scripts/requirements.txt, so that every clone on a machine (CI clones afresh every run)
# shares one 4.6 GB environment and a changed pin makes a new one. HP_PYTHON_ENV overrides.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${HP_PYTHON_ENV:-}" ]; then echo "$HP_PYTHON_ENV"; exit 0; fi
hash=$(sha256sum "$here/requirements.txt" | cut -c1-12)
echo "${HP_PYTHON_ENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperparallel}/pyenv-$hash"
