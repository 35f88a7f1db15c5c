#!/usr/bin/env bash
# A run whose dashboard's terminal closes goes on to its end (tmux kill-session: SIGHUP to its
# foreground process group), on a GPU: the run's end, its epochs, and no process left.
set -u
rm -f /tmp/hup.jsonl
tmux -L hup new-session -d -s hup -x 160 -y 50 "cd $PWD && PYTHONPATH=$PYTHONPATH python3 -m ddptui run resnet18 --gpus 0 --data synthetic --amp bf16 --epochs 4 --steps-per-epoch 150 --log /tmp/hup.jsonl"
for i in $(seq 90); do grep -q '"kind":"step"' /tmp/hup.jsonl 2>/dev/null && break; sleep 1; done
tmux -L hup kill-session -t hup
for i in $(seq 120); do grep -q '"status":"\(done\|failed\|interrupted\)"' /tmp/hup.jsonl && break; sleep 1; done
sleep 3
python3 -c "
import json
ev=[json.loads(l) for l in open('/tmp/hup.jsonl')]
print('run:', [(e['status'], e.get('exit_code')) for e in ev if e['kind']=='run'])
print('epochs of rank 0:', sorted({e['epoch'] for e in ev if e['kind']=='epoch' and e['rank']==0}))
"
ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep || echo "no process left"
