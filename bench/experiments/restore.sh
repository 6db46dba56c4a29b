#!/bin/bash
# Checkpoint/restore experiment for issue 19 (not part of the suite or the
# product): boots a gVisor sandbox with plain runsc until Python has imported
# numpy and pandas, checkpoints it, restores it three times from the one
# image, and prints how long each step took and what each clone printed
# after its restore (random.random() and uuid4()).
#
# Run as root after `airlock image build` (it uses the image's unpacked
# rootfs under /var/lib/airlock/images). Everything it makes is under
# /tmp/ckx; the image and runsc state are deleted at the end, the logs kept.
#
# Seen on 2026-12-07 (2-vCPU VM, systrap, directfs off): boot to ready
# 1.4-1.7 s; checkpoint 70 ms (40 MB image); per clone, runsc create
# 55-80 ms + runsc restore 60-80 ms; every clone printed the same
# random.random() and a different uuid4() (os.urandom is per sandbox);
# a restored clone's stdout continued at its old file offset (NUL bytes
# first in a regular file).
set -u
R=/tmp/ckx/root; B=/tmp/ckx/bundle; IMG=/tmp/ckx/image
ROOTFS=/var/lib/airlock/images/rootfs-6b5e448c622e6fba
rm -rf $R $IMG; mkdir -p $R $B $IMG
cd $B
rm -f config.json; runsc spec -- /usr/bin/python3 -c "import numpy, pandas, sys, time, random; print('ready', flush=True); time.sleep(2); import uuid; print('after', random.random(), uuid.uuid4(), flush=True); time.sleep(3600)"
python3 - <<'PY'
import json
c=json.load(open('config.json'))
c['root']={'path':'/var/lib/airlock/images/rootfs-6b5e448c622e6fba','readonly':True}
c['process']['terminal']=False
c['process']['env'].append('HOME=/tmp')
c['mounts'].append({'destination':'/tmp','type':'tmpfs','source':'tmpfs','options':['size=64m']})
json.dump(c,open('config.json','w'))
PY
RS="runsc --root $R --network none --directfs=false"
t0=$(date +%s.%N)
$RS run --detach --bundle $B boot1 > /tmp/ckx/boot1.out 2>&1 < /dev/null
until grep -q ready /tmp/ckx/boot1.out 2>/dev/null; do sleep 0.01; done
t1=$(date +%s.%N)
echo "boot to ready: $(echo "$t1 - $t0" | bc) s"
t0=$(date +%s.%N)
$RS checkpoint --image-path $IMG boot1 || { echo checkpoint failed; exit 1; }
t1=$(date +%s.%N)
echo "checkpoint: $(echo "$t1 - $t0" | bc) s; image $(du -sh $IMG | cut -f1)"
$RS delete -force boot1 2>/dev/null
for i in 1 2 3; do
  t0=$(date +%s.%N)
  $RS create --bundle $B r$i > /tmp/ckx/r$i.out 2>&1 < /dev/null
  t1=$(date +%s.%N)
  $RS restore --image-path $IMG --detach --bundle $B r$i >> /tmp/ckx/r$i.out 2>&1 < /dev/null || echo "restore $i failed"
  t2=$(date +%s.%N)
  echo "restore $i: create $(echo "$t1 - $t0" | bc) s, restore $(echo "$t2 - $t1" | bc) s; state $($RS state r$i 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')"
done
sleep 3; for i in 1 2 3; do echo "r$i: $(grep -a after /tmp/ckx/r$i.out | tr -d "\\000")"; done; $RS exec r1 /usr/bin/python3 -c "print(1)" | tail -1
for i in 1 2 3; do $RS delete -force r$i >/dev/null 2>&1; done
rm -rf "$R" "$IMG"
