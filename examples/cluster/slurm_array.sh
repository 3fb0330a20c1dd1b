#!/bin/bash
# One shard of a pytest-gap benchmark per Slurm array task; slurm_merge.sh merges them.
#
#   export GAP_OUT=/shared/gap-runs/grid_$(date +%Y%m%d_%H%M)   # seen by every node
#   jid=$(sbatch --parsable --export=ALL examples/cluster/slurm_array.sh)
#   sbatch --dependency=afterany:$jid --export=ALL examples/cluster/slurm_merge.sh
#
# Every task runs the same command with its own K: `--gap-shard K/N` picks the same disjoint,
# cost-balanced part of the plan on every node, so the tasks need no coordination. Submit from
# the project's checkout (the tasks start there). The merge waits with afterany, not afterok:
# a shard whose trials failed still recorded them, and the merge itself refuses (exit 2, naming
# the missing shards) when a shard recorded nothing.
#SBATCH --job-name=gap-shard
#SBATCH --array=1-4
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=gap-shard-%A_%a.log
set -uo pipefail

CONFIG=${GAP_CONFIG:-benchmarks/grid.yaml}
OUT=${GAP_OUT:?set GAP_OUT to a new directory every node and the merge job can see}
K=${SLURM_ARRAY_TASK_ID}
N=${SLURM_ARRAY_TASK_COUNT}

# --gap-resume: a requeued task continues its own shard's run dir, skipping recorded trials.
# --gap-no-gate: a shard's gate means little; the merged run's gate is the verdict.
pytest "$CONFIG" -p no:cacheprovider -n "${SLURM_CPUS_PER_TASK:-1}" \
    --gap-shard "$K/$N" --gap-output-dir "$OUT/shard_$K" --gap-resume --gap-no-gate
status=$?
# 0 and 1 (some trials failed) both mean the shard ran and recorded its trials; anything
# else (interrupted, a usage or internal error) fails the task.
if [ "$status" -le 1 ]; then exit 0; else exit "$status"; fi
