# Stage 's10check' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s10check     # about 5 minutes, 2 GPUs
# Tenth session: the ninth session's checks (s9check) of the new shipped
# model (checkpoints/synthetic-gsm-llada-16m, 10 layers): Flash windows 32-128
# on all 1000 held-out problems, continuous vs static batching, and token ids
# with no mesh, model=2 and data=2. OUT gets s9check.tgz.
source scripts/gpu_stages/s9check.sh
s10check() { s9check; }
