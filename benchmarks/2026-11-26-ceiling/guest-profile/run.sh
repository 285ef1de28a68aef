#!/bin/bash
# Two 2-vCPU TCG guests on the 2 CPUs, both running lockstress rename at once (vanilla: no
# daemon); guest A profiles itself with perf during the middle 10 s.
set -u
cd /work/main
LS=$(ls -t target/pvsched-bench/progs/*/lockstress | head -1)
PERF=$1
T=$(( $(date +%s) + ${2:-100} ))  # both guests start lockstress at this host time
WAIT="while [ \$(date +%s) -lt $T ]; do sleep 0.2; done"
A="$WAIT; head -1 /proc/stat; lockstress -d 16 -w rename > /tmp/ls.json & sleep 3; head -1 /proc/stat; perf record -a -g -F 499 -o /tmp/p.data -- sleep 10 2>&1 | tail -1; head -1 /proc/stat; wait; cat /tmp/ls.json; perf report -i /tmp/p.data --stdio --no-children --sort symbol 2>/dev/null | grep -v '^$' | grep '%' | head -45"
B="$WAIT; lockstress -d 16 -w rename"
target/release/examples/vmrun --bin "$LS" --bin "$PERF" "$A" > /tmp/diag/a.out 2> /tmp/diag/a.err &
PA=$!
target/release/examples/vmrun --bin "$LS" "$B" > /tmp/diag/b.out 2> /tmp/diag/b.err &
PB=$!
echo "pids $PA $PB start at $T"
wait $PA $PB
echo done
