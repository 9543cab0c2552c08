#!/usr/bin/env bash
# Finds (or installs) a Python with PyTorch, numpy and tiktoken, and prints its path on stdout.
# Order: $PYTHON if set, python3 on PATH, Debian's /usr/bin/python3. Where none has PyTorch and we
# are root on Debian, installs python3-torch, python3-numpy and python3-pip with apt-get (PyTorch
# from PyPI would pull gigabytes of CUDA wheels; Debian's CPU build is all the tests need). tiktoken
# comes from PyPI. Messages go to stderr.
set -euo pipefail

has() { "$1" -c "import $2" >/dev/null 2>&1; }

candidates=()
[[ -n "${PYTHON:-}" ]] && candidates+=("$PYTHON")
candidates+=(python3 /usr/bin/python3)

python=""
for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && has "$c" "torch, numpy"; then python=$(command -v "$c"); break; fi
done

if [[ -z "$python" ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing python3-torch python3-numpy python3-pip with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq python3-torch python3-numpy python3-pip >&2
        python=/usr/bin/python3
    else
        echo "error: no Python with PyTorch and numpy found (tried: ${candidates[*]}); install them or set PYTHON" >&2
        exit 1
    fi
fi

if ! has "$python" tiktoken; then
    echo "setup: installing tiktoken with pip for $python" >&2
    # Debian marks its Python as externally managed; tiktoken is one small wheel with no conflicts.
    "$python" -m pip install -q tiktoken >&2 2>/dev/null ||
        "$python" -m pip install -q --break-system-packages tiktoken >&2 || {
        echo "error: could not install tiktoken for $python" >&2
        exit 1
    }
fi
echo "$python"
