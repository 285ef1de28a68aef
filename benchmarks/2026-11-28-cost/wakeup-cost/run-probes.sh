#!/bin/sh
# Inside the host VM: what a bare timer wakeup and a BPF map lookup cost
# there, idle and beside a CPU hog per CPU (run by the command in README.md).
set -e
cd "$(dirname "$0")"
gcc -O2 -o /tmp/wakeup-probe wakeup-probe.c
gcc -O2 -o /tmp/map-lookup-probe map-lookup-probe.c
echo "-- idle"
/tmp/wakeup-probe
/tmp/map-lookup-probe
echo "-- beside stress-ng --cpu 2, the probe SCHED_FIFO 5 (as pvschedd's event thread)"
stress-ng --cpu 2 --timeout 120 >/dev/null 2>&1 &
sleep 2
chrt -f 5 /tmp/wakeup-probe
chrt -f 5 /tmp/map-lookup-probe
kill $! 2>/dev/null || true
