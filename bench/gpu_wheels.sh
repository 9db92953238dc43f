#!/usr/bin/env bash
# Downloads, into .whl/, the wheels that hpctrain's GPU bench needs and the lent GPU machine lacks (it has torch,
# numpy, pyarrow, h5py, tensorboard, matplotlib, psutil, ... but no package index): pydantic and its parts,
# python-dotenv and submitit, and scikit-learn with scipy, joblib and threadpoolctl (the classifier judge of the
# muon models, also run at each evaluation), at the versions of this checkout's .venv, for that machine's Python
# 3.12 on x86-64. About 55 MB: the device tool carries at most 64 MiB with the working tree.
# Run it here (a machine that reaches PyPI), then carry .whl to the GPU machine (bench/gpu_lease.sh installs them).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl
for name in pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection \
    typing-extensions submitit scikit-learn scipy joblib threadpoolctl; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "error: $name is not installed in $PY's environment (make install)" >&2; exit 2; }
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$name==$version"
done
ls .whl
du -sh .whl
