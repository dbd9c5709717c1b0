#!/usr/bin/env bash
# Installs every Debian package that Loom's build, tests and default training
# job need, on a fresh Debian 12 machine. Idempotent: installs only what is
# missing and says what it did. Runs apt as root, or through sudo otherwise.
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
  exit 0
fi

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
