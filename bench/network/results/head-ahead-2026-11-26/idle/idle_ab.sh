#!/bin/bash
# ABBA of probe.py (one clone polling its hostname, 4 one-child diff branches per source) per binary
cd /work/probe
i=0
for b in before final final before; do
  i=$((i+1)); H=/tmp/ia-$i; rm -rf $H; mkdir -p $H/images; ln -sfn /var/lib/forkvm/guest $H/guest; ln -sfn /var/lib/forkvm/images/default $H/images/default
  FORKVM_HOME=$H FORKVM_NO_JAIL=1 setsid ./forkvm-$b serve > $H/daemon.log 2>&1 &
  pid=$!; sleep 3
  FORKVM_HOME=$H timeout 900 python3 probe.py $b 3 4 > /tmp/ia/$i-$b.jsonl 2>&1
  kill $pid; wait $pid 2>/dev/null; sleep 2; rm -rf $H
done
echo done > /tmp/ia/done
