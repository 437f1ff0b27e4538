# Sourced by benchmarks/<topic>.sh: the output directory, the repository
# root as working directory, the GPU count, unbuffered Python output.
set -u
OUT=${1:?usage: bash benchmarks/$(basename "$0") OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "$(date -u +%F) GPUs: $NGPU" | tee "$OUT/suite.log"
