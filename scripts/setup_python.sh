#!/usr/bin/env bash
# usage: [PYTHON=/path/to/python3] bash scripts/setup_python.sh   (make runs it once: build/python)
#
# Finds (or installs) a Python with PyTorch, numpy, tiktoken, safetensors, pyarrow and matplotlib,
# and prints its path on stdout. Order: $PYTHON if set, python3 on PATH, Debian's /usr/bin/python3.
# Where none has PyTorch and we are root on Debian, installs python3-torch, python3-numpy and
# python3-pip with apt-get (PyTorch from PyPI would pull gigabytes of CUDA wheels; Debian's CPU build
# is all the tests need). tiktoken, safetensors and pyarrow come from PyPI. matplotlib comes from
# Debian (python3-matplotlib) for Debian's own Python: pip's matplotlib would replace Debian's numpy
# 1.x with numpy 2, which Debian's PyTorch was not built for ("Numpy is not available"); for any
# other Python it comes from PyPI with numpy held at the installed version. Messages go to stderr.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
[[ $# -eq 0 ]] || { echo "error: unexpected argument '$1' (-h for the usage)" >&2; exit 1; }

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

# pip_install PACKAGE...: into $python; Debian marks its Python as externally managed.
pip_install() {
    "$python" -m pip install -q "$@" >&2 2>/dev/null ||
        "$python" -m pip install -q --break-system-packages "$@" >&2 || {
        echo "error: could not install $* for $python" >&2
        exit 1
    }
}

# tiktoken and safetensors are small wheels that leave numpy and torch alone.
for package in tiktoken safetensors; do
    if ! has "$python" "$package"; then
        echo "setup: installing $package with pip for $python" >&2
        pip_install "$package"
    fi
done

# pyarrow reads Parquet and Arrow corpora (data/prepare_text.py). It requires no numpy, but from
# version 26 on it refuses to import beside numpy 1.x (Debian 12's, which Debian's PyTorch needs):
# there the releases before 26 are taken.
if ! has "$python" pyarrow; then
    spec=pyarrow
    [[ $("$python" -c "import numpy; print(numpy.__version__.split('.')[0])") -lt 2 ]] && spec="pyarrow<26"
    echo "setup: installing $spec with pip for $python" >&2
    pip_install "$spec"
    has "$python" pyarrow || { echo "error: pyarrow is still not importable by $python" >&2; exit 1; }
fi

if ! has "$python" matplotlib; then
    if [[ $python == /usr/bin/python3* && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing python3-matplotlib with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq python3-matplotlib >&2
    else
        numpy_version=$("$python" -c "import numpy; print(numpy.__version__)")
        echo "setup: installing matplotlib with pip for $python (numpy held at $numpy_version)" >&2
        pip_install matplotlib "numpy==$numpy_version"
    fi
    has "$python" matplotlib || { echo "error: matplotlib is still not importable by $python" >&2; exit 1; }
fi
echo "$python"
