#!/usr/bin/env bash
# Installs every Debian package that Loom's build, tests and default training
# job need, on a fresh Debian 12 machine. Idempotent: installs only what is
# missing and says what it did (apt packages, and the cudnn-frontend headers
# from PyPI). Runs apt as root, or through sudo otherwise. `--torch` (or
# LOOM_REQUIRE_TORCH=1, as CI sets) also installs PyTorch for the torchrun tests.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, works offline (see third_party/)
  default-jdk-headless     # Bazel's server
  g++ pkg-config
  libabsl-dev              # flags, status, strings, synchronization
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libprotobuf-dev protobuf-compiler   # checkpoint manifests
  libdnnl-dev              # oneDNN: our CPU GEMM (fastest measured here)
  libopenblas-dev libblis-dev         # reference BLAS libraries for //core:bench
  libopenmpi-dev openmpi-bin          # MPI backend
  libucx-dev               # UCX backend
  libssl-dev               # libcrypto: the TCP store's HMAC handshake (comm/store/auth.h)
  libre2-dev nlohmann-json3-dev       # tokenizers (GPT-2 pre-tokenizer, vocab.json)
  libsentencepiece-dev     # --tokenizer-type SentencePieceTokenizer (Llama 2-style models)
  fortunes                 # default English training corpus
  iproute2 procps          # network namespaces and process tools for tests
  util-linux               # unshare: a host name per namespace (//tests:two_hosts_test)
  slurm-wlm munge          # a one-node Slurm cluster for //tests:slurm_test (srun, sbatch, scancel)
  openssl                  # docs/slurm/train.sbatch makes the job's rendezvous secret
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed; nothing to do."
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO="sudo"
    else
      echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
  fi

  echo "setup.sh: installing ${#missing[@]} missing package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup.sh: installed ${missing[*]}."
fi

# cudnn-frontend: header-only C++ from PyPI (into <site-packages>/include, where
# third_party/system_libs.bzl finds it) for //core/cuda/cudnn. --no-deps: the
# wheel's Python dependencies (CUTLASS DSL, TVM FFI) are not needed for the
# headers. Without pip the cuDNN attention targets are skipped, not broken.
CUDNN_FRONTEND_VERSION=1.32.0
if python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("nvidia-cudnn-frontend") != sys.argv[1])' \
    "$CUDNN_FRONTEND_VERSION" 2>/dev/null; then
  echo "setup.sh: nvidia-cudnn-frontend $CUDNN_FRONTEND_VERSION already installed; nothing to do."
elif python3 -m pip --version >/dev/null 2>&1; then
  PIP_USER=()
  [ "$(id -u)" -ne 0 ] && PIP_USER=(--user)
  python3 -m pip install -q --no-deps "${PIP_USER[@]}" "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION"
  echo "setup.sh: installed nvidia-cudnn-frontend $CUDNN_FRONTEND_VERSION (pip)."
else
  echo "setup.sh: warning: python3 -m pip not available; //core/cuda/cudnn will be skipped" \
       "(pip install nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION to enable it)." >&2
fi

# PyTorch, for the tests that run the real torchrun and its TCPStore
# (//tests:torchrun_test, //comm:torchrun_store_test) and the PyTorch
# reference benchmarks: a virtual environment at LOOM_PYTORCH_VENV (default
# ~/.cache/loom/pytorch-venv), pinned. About 5 GiB (PyPI's wheel brings its
# CUDA libraries), so only when asked: `tools/setup.sh --torch`, or
# LOOM_REQUIRE_TORCH=1 (CI, where those tests must run). Without it they skip.
TORCH_VERSION=2.15.0
want_torch=0
for arg in "$@"; do [ "$arg" = --torch ] && want_torch=1; done
[ "${LOOM_REQUIRE_TORCH:-0}" = 1 ] && want_torch=1
if [ "$want_torch" = 0 ]; then
  echo "setup.sh: no PyTorch asked for (tools/setup.sh --torch installs it; the torchrun tests skip without it)."
else
  # shellcheck source=tools/reference_venv.sh
  source "$(dirname "$0")/reference_venv.sh"
  TORCH_VENV="${LOOM_PYTORCH_VENV:-$HOME/.cache/loom/pytorch-venv}"
  if "$TORCH_VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("torch").startswith(sys.argv[1]))' \
      "$TORCH_VERSION" 2>/dev/null; then
    echo "setup.sh: torch $TORCH_VERSION already in $TORCH_VENV; nothing to do."
  else
    ensure_reference_venv "$TORCH_VENV" "torch" "torch==$TORCH_VERSION" >/dev/null
    echo "setup.sh: installed torch $TORCH_VERSION into $TORCH_VENV (pip)."
  fi
fi
