#!/bin/bash
cd /app
for data in data/*.csv; do
  name=$(basename "$data" .csv)
  report=reports/$name.txt
  if [ "$data" -nt "$report" ]; then
    awk -F, 'NR > 1 {s += $2} END {print "total=" s}' "$data" > "$report"
    echo "regenerated $report"
  fi
done
