#!/bin/bash
# Merge the shards of slurm_array.sh into $GAP_OUT/merged (submit it with
# --dependency=afterany:<array job id>, see slurm_array.sh). Exit 0 the merged run's gate
# passes, 1 it fails, 2 the merge was refused (a shard missing, shards of different plans).
#SBATCH --job-name=gap-merge
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=00:30:00
#SBATCH --output=gap-merge-%j.log
set -euo pipefail

CONFIG=${GAP_CONFIG:-benchmarks/grid.yaml}
OUT=${GAP_OUT:?set GAP_OUT to the directory the shards wrote}

gap merge "$OUT"/shard_* --out "$OUT/merged" --config "$CONFIG"
