#!/usr/bin/env bash
# A/B of the coordination plane: an older revision against the working tree, raftwal only,
# alternating (base, new, base, new) so that the shared machine's noise hits both alike.
#
#   bash bench/coord_ab.sh [BASE_REV]      (default ad0ee63, main before batching/ReadIndex)
#
# The base is `git archive BASE_REV` in a temporary directory and is imported from there by
# running from it (sys.path[0] = cwd for the node processes, PYTHONPATH for the benchmark
# process); both use this checkout's .venv and bench/coord.py. Results: coord-ab-*.json in a
# temporary directory printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
base_rev=${1:-ad0ee63}
python="$root/.venv/bin/python"
[ -x "$python" ] || { echo "run ./run bench coord once first (it bootstraps .venv)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work/base"' EXIT
mkdir "$work/base"
git archive "$base_rev" | tar -x -C "$work/base"
for round in 1 2; do
  for variant in base new; do
    if [ "$variant" = base ]; then
      (cd "$work/base" && PYTHONPATH="$work/base" "$python" "$root/bench/coord.py" --skip-etcd \
        --skip-failover --repeats 1 --duration-s 8 --json > "$work/coord-ab-$variant-$round.json")
    else
      (cd "$root" && "$python" bench/coord.py --skip-etcd --skip-failover --repeats 1 \
        --duration-s 8 --json > "$work/coord-ab-$variant-$round.json")
    fi
    echo "$variant round $round done $(date -u +%T)"
  done
done
echo "results in $work"
