#!/bin/sh
# A/B: pvschedd's event thread CPU per wakeup on the sched_ext backend,
# serving a fake VMM (2 spinning vCPUs, guest FIFO) beside stress-ng --cpu 2.
cd /tmp/exp
B=/work/main/target/release
stress-ng --cpu 2 --timeout 900 >/dev/null 2>&1 &
S=$!
$B/pvsched-fake-vmm mem-path=/dev/shm/vm.region --vcpus 2 --name-format "CPU {}/KVM" --guest-fifo 10 --spin --qmp /tmp/exp/vm.qmp > /tmp/exp/vmm.out 2>&1 &
V=$!
sleep 2
cat > /tmp/exp/cfg.toml <<EOT
[daemon]
backend = "sched_ext"
state_file = "/tmp/exp/state.json"
control_socket = "/tmp/exp/control.sock"
[discovery]
auto = false
[[vm]]
name = "vm"
region = "/dev/shm/vm.region"
qmp = "/tmp/exp/vm.qmp"
EOT
ev() { for t in /proc/$P/task/*; do [ "$(cat $t/comm)" = pvschedd ] && echo "$(awk '{print $1}' $t/schedstat) $(awk '/^voluntary/{print $2}' $t/status)"; done; }
for round in 1 2 3; do
for bin in old new; do
/tmp/exp/$bin/pvschedd --config /tmp/exp/cfg.toml >/tmp/exp/d-$bin.log 2>&1 &
P=$!
sleep 12
a=$(ev); sleep 30; b=$(ev)
echo "$a $b" | awk -v bin=$bin -v r=$round '{ms=($3-$1)/1e6; w=$4-$2; printf "round %d %s: event thread %.0f ms CPU in 30 s (%.2f %% of 2 CPUs), %d wakeups, %.0f us per wakeup\n", r, bin, ms, ms/600, w, ms*1000/w}'
kill $P; wait $P
done
done
kill $V $S
